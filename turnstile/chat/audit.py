"""Template audit: does Turnstile's incremental path reproduce the template's own render?

For a battery of multi-turn conversations (tool calls, parallel calls, user turns, reasoning,
a truncated completion) we play a model that samples exactly what the template renders for
each assistant turn, then build every following prompt the way the gateway does
(``recorded prompt + sampled tokens + Renderer.extension(...)``) and compare it, token for
token, with the template's full render of the same conversation. Each step ends in one of:

- ``exact``: the incremental prompt equals the full render;
- ``fallback``: the renderer refused (template not prefix-preserving for this append), so the
  gateway starts a new segment with the reason: correct, and visible in the records;
- ``MISMATCH``: the incremental prompt differs and nothing noticed: a silent mismatch, the
  one outcome that must never happen;
- ``n/a`` or ``error``: the step cannot be played (the template drops tool calls, rejects a
  role, or its generation prompt does not begin the rendered assistant turn).

This is the audit the server runs at start (its report becomes the gateway's ``Policy``).
The conversations it plays are in ``audit_battery``; auditing a corpus of templates without
their models (stand-in tokenizers, the docs table) is in ``audit_corpus``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .audit_battery import (
    TOOLS,
    Conversation,
    assistant_indices,
    battery,
)
from .policy import Policy, append_kind
from .render import NotPrefixPreserving, Renderer
from .template import TemplateError


@dataclass
class Step:
    conversation: str
    variant: str  # "plain" | "think"
    kind: str
    status: str
    detail: str = ""


def play(
    renderer: Renderer, conv: Conversation, variant: str, tools: list[dict], **kwargs: object
) -> list[Step]:
    """Run one conversation through the incremental path, comparing with full renders.

    The prompts are chained as the gateway builds them: a call's prompt is the previous
    call's prompt + its sampled tokens + the extension, or a full render when the previous
    step could not extend (a new segment). The 'sampled' tokens of an assistant turn are the
    template's own rendering of it as history, from where the turn begins to the first
    end-of-turn token (where the engine stops), or without it for a truncated turn. The truth
    is the template's full render of the longer conversation.
    """
    tok, eog = renderer.tok, renderer.tok.eog_token_ids
    msgs = conv.messages
    asst = assistant_indices(msgs)
    steps: list[Step] = []
    render = renderer.render  # what the gateway renders (developer as system where dropped)
    prompt: list[int] | None = None  # what the gateway sent for the current turn

    def step(kind: str, status: str, detail: str = "") -> None:
        steps.append(Step(conv.name, variant, kind, status, detail))

    for a, b in zip(asst, asst[1:], strict=False):
        kind = append_kind(msgs[a + 1 : b])
        try:
            truth = renderer.render_full(msgs[:b], tools, **kwargs)
            gen = renderer.render_full(msgs[:a], tools, **kwargs)
            hist = tok.encode(render(msgs[: a + 1], tools, add_generation_prompt=False, **kwargs))
        except TemplateError as exc:
            step(kind, "error", str(exc)[:160])
            break
        sent = prompt if prompt is not None else gen
        truncated = a in conv.truncated
        gen_ok = hist[: len(gen)] == gen
        if gen_ok:
            turn = hist
            # The engine stops at the first end-of-turn token the model samples: the turn's
            # close is the first one after the turn begins (Apriel writes "<|end|>\n</s>":
            # the model samples <|end|>, the rest belongs to the next prompt).
            stop_at = next((i for i in range(len(gen), len(hist)) if hist[i] in eog), None)
            if stop_at is None:
                # No close inside the turn (GLM): the model's stop token opens the next message.
                if (
                    truth[: len(hist)] == hist
                    and len(truth) > len(hist)
                    and truth[len(hist)] in eog
                ):
                    stop_at, turn = len(hist), truth
                else:
                    step(kind, "n/a", "the template writes no end-of-turn token after the turn")
                    prompt = None
                    continue
            sampled = turn[len(gen) : stop_at if truncated else stop_at + 1]
            stop = None if truncated else turn[stop_at]
        else:
            # The template renders the earlier turns, or the turn's opening, differently once
            # the reply is there: play the reply's text as sampled after the prompt as sent.
            got = _sampled_text(renderer, msgs[:a], msgs[a], tools, kwargs)
            if isinstance(got, str):
                step(kind, "MISMATCH" if got.startswith("the generation") else "n/a", got)
                prompt = None
                continue
            text, stop_id = got
            sampled = renderer.encode_fragment(text) + ([] if truncated else [stop_id])
            stop = None if truncated else stop_id
        # the model samples on from the prompt it was sent
        recorded = sent + sampled
        try:
            system = msgs[0] if msgs[0]["role"] in ("system", "developer") else None
            delta, seam = renderer.extension(
                msgs[a], msgs[a + 1 : b], tools, stop, system, **kwargs
            )
        except NotPrefixPreserving as exc:
            step(kind, "fallback", str(exc)[:160])
            prompt = None
            continue
        except TemplateError as exc:
            step(kind, "error", str(exc)[:160])
            break
        incremental = recorded + delta
        note = seam.kind
        if truncated:
            note += "; after length"
        if gen_ok:
            ok = incremental == truth
        else:
            # The prompt's tokens end where the rendered turn's tokens do not (Qwen3.5's
            # "<think>\n" before "\n</think>"): the model's tokens are kept as sampled, so the
            # prompt matches the full render in text, and in tokens after the sampled turn.
            full = render(msgs[:b], tools, add_generation_prompt=True, **kwargs)
            said = (
                render(msgs[:a], tools, add_generation_prompt=True, **kwargs)
                + text
                + ("" if truncated else renderer.eog_text[stop_id])
                + seam.text
            )
            ok = said == full and (not delta or truth[len(truth) - len(delta) :] == delta)
            note += "; tokens kept as sampled where the turn meets the prompt"
        if ok:
            step(kind, "exact", note)
            prompt = incremental
        else:
            at = _common(incremental, truth)
            step(
                kind,
                "MISMATCH",
                f"token {at}: incremental {tok.decode(incremental[at : at + 8])!r} vs full "
                f"{tok.decode(truth[at : at + 8])!r}",
            )
            prompt = None
    return steps


def _sampled_text(
    renderer: Renderer, history: list[dict], reply: dict, tools: list[dict], kwargs: dict
) -> tuple[str, int] | str:
    """The reply's text as the template writes it after its generation prompt, and the
    end-of-turn token that closes it; or why there is none. Used when the prompt's tokens are
    not a prefix of the rendered history (token boundaries then differ too)."""
    render = renderer.render  # what the gateway renders (developer as system where dropped)
    gen_text = render(history, tools, add_generation_prompt=True, **kwargs)
    before = render(history, tools, add_generation_prompt=False, **kwargs)
    hist = render([*history, reply], tools, add_generation_prompt=False, **kwargs)
    n = min(len(gen_text), len(before))
    cut = next((i for i in range(n) if gen_text[i] != before[i]), n)
    opening = gen_text[cut:]
    at = hist.rfind(opening) if opening else -1
    if at < 0:
        return (
            f"the generation prompt {opening[-40:]!r} is not how the template renders the "
            "turn in history (the prompt the model saw cannot be the full render's prefix)"
        )
    body = hist[at + len(opening) :]
    close = min(
        ((body.find(t), i) for i, t in renderer.eog_text.items() if t in body), default=None
    )
    if close is None:
        return "the template writes no end-of-turn token after the turn"
    return body[: close[0]], close[1]


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class AuditReport:
    template: str
    tokenizer: str
    stand_in_markers: list[str]
    steps: list[Step]
    tool_incremental: str  # can tool results be appended one by one (not only as a batch)?

    def summary(self) -> dict[str, str]:
        """kind -> 'plain/think' statuses (worst per variant)."""
        order = ["MISMATCH", "error", "fallback", "n/a", "exact"]
        out: dict[str, dict[str, str]] = {}
        for s in self.steps:
            cur = out.setdefault(s.kind, {}).get(s.variant, "exact")
            out[s.kind][s.variant] = min(cur, s.status, key=order.index)
        return {k: f"{v.get('plain', '-')}/{v.get('think', '-')}" for k, v in out.items()}

    def policy(self) -> Policy:
        return Policy.from_steps(self.steps)

    @property
    def silent_mismatches(self) -> list[Step]:
        return [s for s in self.steps if s.status == "MISMATCH"]

    def to_json(self) -> dict:
        return {**asdict(self), "summary": self.summary()}


VARIANT_KWARGS: dict[str, dict] = {"plain": {}, "think": {"enable_thinking": True}}


def audit(renderer: Renderer, name: str = "", markers: list[str] | None = None) -> AuditReport:
    steps: list[Step] = []
    for variant, reasoning in (("plain", False), ("think", True)):
        for conv in battery(reasoning):
            # a harness that sends reasoning back runs the model with thinking on
            kwargs = VARIANT_KWARGS[variant]
            steps.extend(play(renderer, conv, variant, TOOLS, **kwargs))
    return AuditReport(name, renderer.tok.source, markers or [], steps, _tool_incremental(renderer))


def _tool_incremental(renderer: Renderer) -> str:
    conv = battery(False)[1].messages  # tool-chain
    try:
        one = renderer.render(conv[:4], TOOLS, add_generation_prompt=False)
        two = renderer.render(conv[:5], TOOLS, add_generation_prompt=False)
    except TemplateError:
        return "error"
    return "yes" if two.startswith(one) else "batch only"


def behaviour(report: AuditReport) -> dict[str, str]:
    """What the gateway will do per kind of appended message, in words."""
    words = {
        "exact": "extends recorded tokens",
        "fallback": "new segment (re-render)",
        "n/a": "not applicable",
        "error": "template error",
        "MISMATCH": "MISMATCH",
    }
    out = {}
    for kind, pair in report.summary().items():
        plain, think = pair.split("/")
        out[kind] = (
            words[plain] if plain == think else f"{words[plain]} (with reasoning: {words[think]})"
        )
    return out
