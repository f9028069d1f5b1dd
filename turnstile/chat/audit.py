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
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

from tokenizers import AddedToken

from .policy import Policy, append_kind
from .render import NotPrefixPreserving, Renderer
from .template import ChatTemplate, TemplateError
from .tokenizer import LoadedTokenizer

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOLS = [WEATHER_TOOL, TIME_TOOL]


def _call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _assistant(content: str | None, calls: list[dict] | None = None,
               reasoning: str | None = None) -> dict:
    m: dict = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = calls
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def _tool(cid: str, content: str, name: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "What's the weather in Paris?"}
USER2 = {"role": "user", "content": "And should I take an umbrella?"}
SYSTEM_MID = {"role": "system", "content": "Answer in one short sentence."}
DEVELOPER = {"role": "developer", "content": "Be brief."}


@dataclass
class Conversation:
    """Messages plus which assistant turns are 'sampled' and how (stop or length). Each step
    is judged under the append kind the gateway gives its new messages (``append_kind``)."""

    name: str
    messages: list[dict]
    truncated: set[int] = field(default_factory=set)  # assistant indices cut by length


def battery(reasoning: bool) -> list[Conversation]:
    """Every append kind the gateway extends must be played here: what is not played starts
    a new segment at run time. Kinds after a second tool round are played too (templates that
    count rounds or track state across messages differ only there)."""
    r = (lambda text: text) if reasoning else (lambda text: None)
    a_call = _assistant("", [_call("call00001", "get_weather", '{"city": "Paris"}')],
                        r("I should call the weather tool."))
    a_call2 = _assistant(None, [_call("call00003", "get_time", '{"city": "Paris"}')],
                         r("Now the time."))  # null content, as parsed replies carry it
    a_par = _assistant("", [_call("call00001", "get_weather", '{"city": "Paris"}'),
                            _call("call00002", "get_time", '{"city": "Paris"}')],
                       r("Two tools at once."))
    a_final = _assistant("It is 18 C and sunny in Paris.", None, r("The tool says 18 C."))
    a_final2 = _assistant("No umbrella needed today.", None, r("Sunny means no rain."))
    a_long = _assistant("Paris is the capital of France and its weather today is mild and",
                        None, r("Let me describe Paris."))
    t1 = _tool("call00001", '{"temp_c": 18}', "get_weather")
    t2 = _tool("call00002", '{"time": "14:05"}', "get_time")
    t3 = _tool("call00003", '{"time": "14:05"}', "get_time")
    return [
        Conversation("tool-then-user", [SYSTEM, USER1, a_call, t1, a_final, USER2, a_final2]),
        Conversation("tool-chain", [SYSTEM, USER1, a_call, t1, a_call2, t3, a_final]),
        Conversation("parallel-batch", [SYSTEM, USER1, a_par, t1, t2, a_final]),
        Conversation("length-then-user", [SYSTEM, USER1, a_long, USER2, a_final2],
                     truncated={2}),
        Conversation("no-system", [USER1, a_call, t1, a_final, USER2, a_final2]),
        # mixed appends, after one and after two tool rounds
        Conversation("tool+user", [SYSTEM, USER1, a_call, t1, {**USER2}, a_final2]),
        Conversation("round2-tool+user", [SYSTEM, USER1, a_call, t1, a_call2, t3, USER2,
                                          a_final2]),
        Conversation("tool+system", [SYSTEM, USER1, a_call, t1, SYSTEM_MID, a_final]),
        Conversation("round2-tool+system", [SYSTEM, USER1, a_call, t1, a_call2, t3,
                                            SYSTEM_MID, a_final]),
        # system / developer messages in the middle of the conversation
        Conversation("system-mid", [SYSTEM, USER1, a_final, SYSTEM_MID, USER2, a_final2]),
        Conversation("system-only", [SYSTEM, USER1, a_final, SYSTEM_MID, a_final2]),
        Conversation("developer-mid", [SYSTEM, USER1, a_final, DEVELOPER, USER2, a_final2]),
        Conversation("user-after-round2", [USER1, a_call, t1, a_call2, t3, a_final, USER2,
                                           a_final2]),
    ]


@dataclass
class Step:
    conversation: str
    variant: str  # "plain" | "think"
    kind: str
    status: str
    detail: str = ""


def _assistant_indices(msgs: list[dict]) -> list[int]:
    return [i for i, m in enumerate(msgs) if m["role"] == "assistant"]


def play(renderer: Renderer, conv: Conversation, variant: str, tools: list[dict],
         **kwargs: object) -> list[Step]:
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
    asst = _assistant_indices(msgs)
    steps: list[Step] = []
    render = renderer.template.render
    prompt: list[int] | None = None  # what the gateway sent for the current turn

    def step(kind: str, status: str, detail: str = "") -> None:
        steps.append(Step(conv.name, variant, kind, status, detail))

    for a, b in zip(asst, asst[1:], strict=False):
        kind = append_kind(msgs[a + 1:b])
        try:
            truth = renderer.render_full(msgs[:b], tools, **kwargs)
            gen = renderer.render_full(msgs[:a], tools, **kwargs)
            hist = tok.encode(render(msgs[:a + 1], tools, add_generation_prompt=False, **kwargs))
        except TemplateError as exc:
            step(kind, "error", str(exc)[:160])
            break
        sent = prompt if prompt is not None else gen
        truncated = a in conv.truncated
        gen_ok = hist[:len(gen)] == gen
        if gen_ok:
            turn = hist
            # The engine stops at the first end-of-turn token the model samples: the turn's
            # close is the first one after the turn begins (Apriel writes "<|end|>\n</s>":
            # the model samples <|end|>, the rest belongs to the next prompt).
            stop_at = next((i for i in range(len(gen), len(hist)) if hist[i] in eog), None)
            if stop_at is None:
                # No close inside the turn (GLM): the model's stop token opens the next message.
                if truth[:len(hist)] == hist and len(truth) > len(hist) and \
                        truth[len(hist)] in eog:
                    stop_at, turn = len(hist), truth
                else:
                    step(kind, "n/a", "the template writes no end-of-turn token after the turn")
                    prompt = None
                    continue
            sampled = turn[len(gen):stop_at if truncated else stop_at + 1]
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
            delta, seam = renderer.extension(msgs[a], msgs[a + 1:b], tools, stop, system, **kwargs)
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
            said = render(msgs[:a], tools, add_generation_prompt=True, **kwargs) + text + (
                "" if truncated else renderer.eog_text[stop_id]) + seam.text
            ok = said == full and (not delta or truth[len(truth) - len(delta):] == delta)
            note += "; tokens kept as sampled where the turn meets the prompt"
        if ok:
            step(kind, "exact", note)
            prompt = incremental
        else:
            at = _common(incremental, truth)
            step(kind, "MISMATCH",
                 f"token {at}: incremental {tok.decode(incremental[at:at + 8])!r} vs full "
                 f"{tok.decode(truth[at:at + 8])!r}")
            prompt = None
    return steps


def _sampled_text(renderer: Renderer, history: list[dict], reply: dict, tools: list[dict],
                  kwargs: dict) -> tuple[str, int] | str:
    """The reply's text as the template writes it after its generation prompt, and the
    end-of-turn token that closes it; or why there is none. Used when the prompt's tokens are
    not a prefix of the rendered history (token boundaries then differ too)."""
    render = renderer.template.render
    gen_text = render(history, tools, add_generation_prompt=True, **kwargs)
    before = render(history, tools, add_generation_prompt=False, **kwargs)
    hist = render([*history, reply], tools, add_generation_prompt=False, **kwargs)
    n = min(len(gen_text), len(before))
    cut = next((i for i in range(n) if gen_text[i] != before[i]), n)
    opening = gen_text[cut:]
    at = hist.rfind(opening) if opening else -1
    if at < 0:
        return (f"the generation prompt {opening[-40:]!r} is not how the template renders the "
                "turn in history (the prompt the model saw cannot be the full render's prefix)")
    body = hist[at + len(opening):]
    close = min(((body.find(t), i) for i, t in renderer.eog_text.items() if t in body),
                default=None)
    if close is None:
        return "the template writes no end-of-turn token after the turn"
    return body[:close[0]], close[1]


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
    return AuditReport(name, renderer.tok.source, markers or [], steps,
                       _tool_incremental(renderer))


def _tool_incremental(renderer: Renderer) -> str:
    conv = battery(False)[1].messages  # tool-chain
    try:
        one = renderer.template.render(conv[:4], TOOLS, add_generation_prompt=False)
        two = renderer.template.render(conv[:5], TOOLS, add_generation_prompt=False)
    except TemplateError:
        return "error"
    return "yes" if two.startswith(one) else "batch only"


def behaviour(report: AuditReport) -> dict[str, str]:
    """What the gateway will do per kind of appended message, in words."""
    words = {"exact": "extends recorded tokens", "fallback": "new segment (re-render)",
             "n/a": "not applicable", "error": "template error", "MISMATCH": "MISMATCH"}
    out = {}
    for kind, pair in report.summary().items():
        plain, think = pair.split("/")
        out[kind] = words[plain] if plain == think else \
            f"{words[plain]} (with reasoning: {words[think]})"
    return out


# Stand-in tokenizers for templates without a matching vocabulary in the corpus.

_MARKER = re.compile(
    r"<\|[^|<>\s'\"{}]{1,40}\|>"  # <|im_start|>
    r"|<\uff5c[^\uff5c]{1,40}\uff5c>"  # <｜tool▁calls▁begin｜>
    r"|\[/?[A-Z][A-Z_]{2,30}\]"  # [INST], [TOOL_CALLS]
    r"|<\|?[a-z_]{2,30}\|>|<\|[a-z_]{2,30}>"  # <turn|>, <|turn>
    r"|<(?:start|end)_of_[a-z_]+>"  # <start_of_turn>
    r"|<[A-Z_]{3,30}>"  # <SPECIAL_12>-like
)


def template_markers(source: str) -> list[str]:
    """Special-looking markers a template writes, in order of first appearance."""
    seen: dict[str, None] = {}
    for m in _MARKER.finditer(source):
        seen.setdefault(m.group(0))
    return list(seen)


def stand_in(base: LoadedTokenizer, source: str) -> tuple[LoadedTokenizer, list[str]]:
    """``base`` with the template's markers that it lacks added as special tokens, and an
    end-of-turn set read off a render (the first marker after an assistant turn's text)."""
    markers = template_markers(source)
    added = [m for m in markers if len(base.encode(m)) != 1]
    tok = base.tokenizer.__class__.from_str(base.tokenizer.to_str())
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in added])
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    for t in special.values():
        if len(base.encode(t)) != 1:
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False)])
    loaded = replace(base, tokenizer=tok, chat_template=source, special_tokens=special,
                     bos_token="<s>", eos_token="</s>",
                     source=f"stand-in({base.source.rsplit('/', 1)[-1]})")
    eog = set(base.eog_token_ids) | {tok.token_to_id("</s>")}
    for close in _derive_turn_close(ChatTemplate(source, special), markers):
        if tok.token_to_id(close) is None:
            tok.add_special_tokens([AddedToken(close, special=True, normalized=False)])
            added.append(close)
        eog.add(tok.token_to_id(close))
    return replace(loaded, eog_token_ids=frozenset(i for i in eog if i is not None)), added


def _derive_turn_close(template: ChatTemplate, markers: list[str]) -> list[str]:
    """The marker that closes an assistant turn; for templates without one (GLM), the
    markers that open the next message, which such models sample as their stop token."""
    probe = "XQZPROBE"
    call = _assistant("", [_call("call00001", "get_weather", '{"city": "XQZPROBE"}')])
    tool = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18"}
    probes = [  # (conversation, may the close be a bare string rather than a marker?)
        ([USER1, _assistant(probe)], True),
        ([USER1, call], False),
        ([USER1, _assistant(probe), USER2], False),
        ([USER1, call, tool], False),
    ]
    found: list[str] = []
    for i, (conv, bare) in enumerate(probes):
        try:
            full = template.render(conv, TOOLS, add_generation_prompt=False)
        except TemplateError:
            continue
        at = full.rfind(probe)
        if at < 0:
            continue
        tail = full[at + len(probe):]
        hits = sorted((tail.find(m), m) for m in markers if m in tail)
        if not hits and bare and tail.strip() and len(tail.strip()) <= 24:
            hits = [(0, tail.strip())]  # a close in no marker syntax we know: "[e~[", ...
        if hits and hits[0][1] not in found:
            found.append(hits[0][1])
        if found and i == 1:
            return found  # turns have their own close (plain and tool-call turns)
    return found


# Which corpus vocabulary matches which corpus template (by model family); others get a
# stand-in built on the Qwen2 vocabulary.
MATCHING_VOCAB = {
    "Qwen-Qwen2.5-7B-Instruct": "qwen2", "Qwen-QwQ-32B": "qwen2", "Qwen-Qwen3-0.6B": "qwen2",
    "Qwen3-Coder": "qwen2", "Qwen3.5-4B": "qwen35",
    "meta-llama-Llama-3.1-8B-Instruct": "llama-bpe",
    "meta-llama-Llama-3.2-3B-Instruct": "llama-bpe",
    "meta-llama-Llama-3.3-70B-Instruct": "llama-bpe",
    "CohereForAI-c4ai-command-r-plus-tool_use": "command-r",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r",
    "google-gemma-4-31B-it": "gemma-4", "google-gemma-4-31B-it-interleaved": "gemma-4",
    "microsoft-Phi-3.5-mini-instruct": "phi-3",
}


def corpus_renderer(template_path: str, models_dir: str,
                    cache: dict[str, LoadedTokenizer] | None = None
                    ) -> tuple[Renderer, list[str]]:
    """A renderer for a corpus template: its matching tokenizer, or a stand-in."""
    from pathlib import Path

    from .tokenizer import load_tokenizer

    path = Path(template_path)
    source = path.read_text()
    vocab = MATCHING_VOCAB.get(path.stem)
    cache = cache if cache is not None else {}
    key = vocab or "qwen2"
    if key not in cache:
        cache[key] = load_tokenizer(str(Path(models_dir) / f"ggml-vocab-{key}.gguf"))
    base = cache[key]
    if vocab is not None:
        tok = replace(base, chat_template=source)
        added: list[str] = []
    else:
        tok, added = stand_in(base, source)
    return Renderer(tok, ChatTemplate(source, tok.special_tokens)), added


def battery_kinds() -> list[str]:
    """The append kinds the battery plays, in order of first appearance."""
    seen: dict[str, None] = {}
    for conv in battery(False):
        asst = _assistant_indices(conv.messages)
        for a, b in zip(asst, asst[1:], strict=False):
            seen.setdefault(append_kind(conv.messages[a + 1:b]))
    return list(seen)


def corpus_table(templates_dir: str, models_dir: str) -> str:
    """Markdown table of the audit over every template in a corpus directory: per append
    kind, the worst step without/with reasoning (plain/think)."""
    from pathlib import Path

    from .patches import apply_patches

    cache: dict[str, LoadedTokenizer] = {}
    kinds = battery_kinds()
    rows = ["| template | tokenizer | patches | " + " | ".join(kinds)
            + " | one-by-one tool results | gateway policy |",
            "|" + "---|" * (len(kinds) + 5)]
    for path in sorted(Path(templates_dir).glob("*.jinja")):
        renderer, added = corpus_renderer(str(path), models_dir, cache)
        source, applied = apply_patches(renderer.template.source)
        if applied:
            renderer = Renderer(renderer.tok, ChatTemplate(source, renderer.tok.special_tokens))
        report = audit(renderer, path.stem, added)
        summary = report.summary()
        policy = report.policy()
        segs = [f"{k}/{v}" for k in kinds for v in ("plain", "think")
                if not policy.allows(k, v)]
        # the tokenizer's file name, not the machine path it was loaded from
        tok = Path(report.tokenizer.removeprefix("stand-in(").rstrip(")")).name
        tok = (f"stand-in({tok})" if report.tokenizer.startswith("stand-in(") else tok) + (
            f" + {', '.join(added)}" if added else "")
        rows.append(f"| {path.stem} | {tok.replace('|', '&#124;')} | {', '.join(applied)} | "
                    + " | ".join(summary.get(k, "-") for k in kinds)
                    + f" | {report.tool_incremental} | "
                    + ("new segment on " + ", ".join(segs) if segs else "extend") + " |")
    return "\n".join(rows)
