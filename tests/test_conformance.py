"""Differential conformance: generated harness conversations through the real gateway code, for
every corpus template.

Hypothesis builds conversations out of the shapes harnesses send (text parts, mixed appends,
system/developer messages mid-conversation, parallel calls, renamed IDs, reasoning echoed or
dropped, ``null``/``""`` content, a stop token at the length cap, stop by length, end-of-turn
marker text inside content). Each call goes through ``Gateway.complete`` with an engine that
records what it received and answers with the tokens the test chose: the model is played by the
template itself (it samples exactly its template's rendering of a reply) or by random tokens of
the real vocabulary.

The truth is the template's own full render of the conversation (with each echoed reply being
the reply we returned), as an engine builds it. For every call that extended a recorded call:
the prompt the engine received equals that render in text, and its new tokens equal the render's
last tokens. Anything else must be a new segment with a reason. Zero silent mismatches.
"""

from __future__ import annotations

import asyncio
import json
import random
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import turnstile_testbed as testbed
from turnstile.chat.audit import audit
from turnstile.chat.audit_battery import TOOLS
from turnstile.chat.audit_corpus import corpus_renderer
from turnstile.chat.patches import apply_patches
from turnstile.chat.render import Renderer
from turnstile.chat.template import ChatTemplate, TemplateError
from turnstile.dialects.chat.request import parse_chat_request
from turnstile.engines.base import SamplingParams
from turnstile.errors import APIError
from turnstile.gateway.token_in.gateway import Gateway
from turnstile.parsing.detect import detect_format
from turnstile.store.store import Store
from turnstile.testing.mock_engine import MockEngine, Reply

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

TEMPLATES = sorted(p.stem for p in testbed.templates_dir().glob("*.jinja"))
# templates with their own real vocabulary: random tokens are meaningful there
REAL_VOCAB = [
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "Qwen-Qwen3-0.6B",
    "meta-llama-Llama-3.1-8B-Instruct",
    "google-gemma-4-31B-it",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "microsoft-Phi-3.5-mini-instruct",
]
CHECKED: dict[str, int] = {}  # template -> calls checked (printed at the end)
# why a call that continues the conversation (same first message, same template) may still
# start a segment: the policy or the template will not extend, or the echo no longer matches
# what was recorded. Never "first_call", "new_conversation" or "template_changed".
CONTINUED_BREAKS = {
    "template_policy",
    "template_not_prefix_preserving",
    "unsampled_assistant_message",
    "history_diverged",
}


class Script:
    """What the engine samples next (``MockEngine``'s handler): ``next`` is (ids, finish)."""

    def __init__(self) -> None:
        self.next: tuple[list[int], str] = ([], "stop")

    def __call__(self, prompt: list[int], params: SamplingParams) -> Reply:
        return Reply(self.next[0], self.next[1])


class ScriptedEngine(MockEngine):
    """A ``MockEngine`` whose replies a test sets (``engine.next``)."""

    handler: Script

    def __init__(self) -> None:
        super().__init__(Script(), name="scripted")

    @property
    def next(self) -> tuple[list[int], str]:
        return self.handler.next

    @next.setter
    def next(self, value: tuple[list[int], str]) -> None:
        self.handler.next = value


_VOCABS: dict = {}  # each corpus vocabulary loaded once (a GGUF vocabulary: ~2 s)


@cache
def _setup(name: str) -> tuple[Renderer, object, object]:
    r, _ = corpus_renderer(
        str(testbed.templates_dir() / f"{name}.jinja"), str(testbed.models_dir()), _VOCABS
    )
    source, applied = apply_patches(r.template.source)
    if applied:
        r = Renderer(r.tok, ChatTemplate(source, r.tok.special_tokens))
    return r, audit(r, name).policy(), detect_format(r.template.source)


def _gateway(name: str, tmp: Path) -> tuple[Gateway, ScriptedEngine]:
    renderer, policy, choice = _setup(name)
    engine = ScriptedEngine()
    return Gateway(renderer, engine, Store(tmp), name, choice, policy), engine


# What a harness does between calls, and how the model replies.
REPLY = st.sampled_from(["text", "call", "calls2", "text_eot", "call_eot"])
FINISH = st.sampled_from(["stop", "stop", "length", "stop_at_cap"])
ECHO = st.sampled_from(
    [
        "same",
        "null_content",
        "empty_content",
        "drop_reasoning",
        "rename_ids",
        "reserialize",
        "parts",
    ]
)
APPEND = st.sampled_from(
    [
        "next",
        "next+user",
        "next+system",
        "user",
        "system+user",
        "developer+user",
        "user_parts",
        "rewrite",
    ]
)
TURN = st.fixed_dictionaries(
    {"reply": REPLY, "finish": FINISH, "echo": ECHO, "append": APPEND, "reasoning": st.booleans()}
)
PLAN = st.fixed_dictionaries(
    {
        "system": st.booleans(),
        "parts": st.booleans(),
        "turns": st.lists(TURN, min_size=2, max_size=5),
        "seed": st.integers(0, 2**31),
    }
)


def _marker(renderer: Renderer) -> str:
    return next(iter(renderer.eog_text.values()), "<|endoftext|>")


def _reply(turn: dict, renderer: Renderer, n: int, think: bool) -> dict:
    eot = _marker(renderer) if turn["reply"].endswith("_eot") else ""
    m: dict = {"role": "assistant", "content": None}
    if turn["reply"].startswith("text"):
        m["content"] = f"Answer {n}: print('{eot}') is fine."
    else:
        k = 2 if turn["reply"] == "calls2" else 1
        m["content"] = ""
        m["tool_calls"] = [
            {
                "id": f"call{n}{i:04d}",
                "type": "function",
                "function": {
                    "name": TOOLS[i]["function"]["name"],
                    "arguments": json.dumps({"city": f"Paris{eot}" if eot else f"City {n}"}),
                },
            }
            for i in range(k)
        ]
    if think:
        m["reasoning_content"] = f"Thinking about step {n}."
    return m


SENTINEL = "\u2063"


@cache
def _plain(name: str):  # noqa: ANN202 - a tokenizers.Tokenizer
    """The vocabulary with special tokens encoded as ordinary text: how a model writes a
    marker's text inside its content (it cannot sample the marker token itself: the engine
    would stop there)."""
    from tokenizers import Tokenizer

    renderer = _setup(name)[0]
    plain = Tokenizer.from_str(renderer.tok.tokenizer.to_str())
    plain.encode_special_tokens = True
    return plain


def _sampled(
    name: str, history: list[dict], reply: dict, kwargs: dict
) -> tuple[str, list[int]] | None:
    """The template-played model: the reply's text as the template writes it, as tokens, with
    the end-of-turn token; marker text inside the reply is written as ordinary tokens. None
    when the template does not write such a turn."""
    from turnstile.chat.audit import _sampled_text

    renderer = _setup(name)[0]
    marker = _marker(renderer)
    probe = json.loads(json.dumps(reply).replace(json.dumps(marker)[1:-1], SENTINEL))
    try:
        got = _sampled_text(renderer, history, probe, TOOLS, kwargs)
    except TemplateError:
        return None
    if isinstance(got, str):
        return None
    text, stop = got
    real = renderer.render([*history, reply], TOOLS, add_generation_prompt=False, **kwargs)
    if text.replace(SENTINEL, marker) not in real:
        return None  # the template writes the marker text differently (escaped, CDATA)
    ids: list[int] = []
    for i, piece in enumerate(text.split(SENTINEL)):
        if i:
            ids += _plain(name).encode(marker, add_special_tokens=False).ids
        if piece:
            ids += renderer.encode_fragment(piece)
    return text.replace(SENTINEL, marker), ids + [stop]


def _echo(message: dict, how: str) -> dict:
    m = json.loads(json.dumps(message))
    if how == "null_content" and not m.get("content"):
        m["content"] = None
    elif how == "empty_content" and m.get("content") is None:
        m["content"] = ""
    elif how == "drop_reasoning":
        m.pop("reasoning_content", None)
    elif how == "rename_ids":
        for i, c in enumerate(m.get("tool_calls") or ()):
            c["id"] = f"renamed-by-the-harness-{i:06d}"
    elif how == "reserialize":
        for c in m.get("tool_calls") or ():
            c["function"]["arguments"] = json.dumps(
                json.loads(c["function"]["arguments"]), indent=1
            )
    elif how == "parts" and m.get("content"):
        m["content"] = [{"type": "text", "text": m["content"]}]
    return m


def _appended(turn: dict, echoed: dict, n: int, parts: bool) -> list[dict]:
    user = {"role": "user", "content": f"Next question {n}?"}
    if parts or turn["append"] == "user_parts":
        user["content"] = [
            {"type": "text", "text": f"Next question {n}"},
            {"type": "text", "text": "please."},
        ]
    results = [
        {
            "role": "tool",
            "tool_call_id": c["id"],
            "name": c["function"]["name"],
            "content": f'{{"temp_c": {10 + n}}}',
        }
        for c in echoed.get("tool_calls") or ()
    ]
    system = {"role": "system", "content": "Be brief."}
    kind = turn["append"]
    if kind.startswith("next"):
        head = results or [user]
        return (
            head
            + ([user] if kind == "next+user" and results else [])
            + ([system] if kind == "next+system" else [])
        )
    if kind == "system+user":
        return results + [system, user]
    if kind == "developer+user":
        return results + [{"role": "developer", "content": "Be brief."}, user]
    return results + [user]


def _check(
    renderer: Renderer,
    gw: Gateway,
    engine: ScriptedEngine,
    session: str,
    truth_msgs: list[dict],
    kwargs: dict,
    random_model: bool,
    prev_id: str | None,
    restart: str | None,
) -> None:
    """``prev_id``: the session's call before this one; ``restart``: the reason this call
    must start a segment with (the first call, a rewritten history), ``None`` when it
    continues the conversation: then it extends exactly ``prev_id``, or starts a segment for
    one of the reasons a continued conversation can have."""
    rec = gw.store.calls(session)[-1]
    where = f"call {rec.seq} ({rec.seam}): "
    if restart is not None:
        assert (rec.parent_id, rec.segment_reason) == (None, restart), where + (
            f"expected a new segment ({restart}), got parent {rec.parent_id} "
            f"({rec.segment_reason}: {rec.info.get('segment_detail')})"
        )
        return
    if rec.parent_id is None:
        assert rec.segment_reason in CONTINUED_BREAKS, where + (
            f"a continued conversation broke with {rec.segment_reason!r}: "
            f"{rec.info.get('segment_detail')}"
        )
        return
    assert rec.parent_id == prev_id, where + f"extends {rec.parent_id}, not the last call {prev_id}"
    sent = engine.received[-1]
    # the template's own render of the conversation as Turnstile declares it gives it to the
    # template (developer messages as system ones where the template would drop them)
    shown = renderer.as_rendered(truth_msgs)
    full_text = renderer.template.render(shown, TOOLS, add_generation_prompt=True, **kwargs)
    full = renderer.render_full(truth_msgs, TOOLS, **kwargs)
    delta = list(rec.prompt_delta)
    tok = renderer.tok
    assert not delta or full[len(full) - len(delta) :] == delta, (
        where + f"delta {tok.decode(delta)!r} is not the full render's tail "
        f"{tok.decode(full[len(full) - len(delta) :])!r}"
    )
    parent = gw.tree(session).nodes[rec.parent_id]
    if random_model:
        last = parent.completion_ids[-1] if len(parent.completion_ids) else None
        assert not (delta and last in tok.eog_token_ids and delta[0] == last), (
            where + "the close was repeated after a sampled stop token"
        )
    else:
        assert tok.decode(sent) == tok.decode(tok.encode(full_text)), (
            where + f"prompt text differs from the full render:\n{tok.decode(sent)[-300:]!r}"
            f"\n{full_text[-300:]!r}"
        )
    CHECKED[gw.model_name] = CHECKED.get(gw.model_name, 0) + 1


def play(name: str, plan: dict, tmp: Path, random_model: bool) -> None:
    renderer, _, _ = _setup(name)
    gw, engine = _gateway(name, tmp)
    tok = renderer.tok
    rng = random.Random(plan["seed"])
    session = f"s{plan['seed']}"
    gw.store.create_session({}, session)
    think = any(t["reasoning"] for t in plan["turns"])
    kwargs = {"enable_thinking": True} if think else {}
    msgs: list[dict] = [{"role": "system", "content": "You are terse."}] if plan["system"] else []
    msgs.append({"role": "user", "content": "What's the weather?"})
    truth = list(msgs)
    specials = set(tok.tokenizer.get_added_tokens_decoder()) | set(tok.eog_token_ids)
    ordinary = [
        i for i in range(100, min(tok.tokenizer.get_vocab_size(), 20000)) if i not in specials
    ]
    restart: str | None = "first_call"  # the reason the next call must start a segment with
    for n, turn in enumerate(plan["turns"]):
        body = {"messages": msgs, "tools": TOOLS, "chat_template_kwargs": kwargs}
        reply = _reply(turn, renderer, n, turn["reasoning"])
        if random_model:
            ids = [rng.choice(ordinary) for _ in range(rng.randint(1, 12))]
            stop = next(iter(tok.eog_token_ids))
        else:
            got = _sampled(name, truth, reply, kwargs)
            if got is None:
                return
            _, ids = got
            ids, stop = ids[:-1], ids[-1]
        finish = turn["finish"]
        if finish == "length":
            engine.next = (ids[: max(1, len(ids) // 2)], "length")
        elif finish == "stop_at_cap":  # the engine checks the cap first (vLLM): "length"
            engine.next = (ids + [stop], "length")
        else:
            engine.next = (ids + [stop], "stop")
        before = gw.store.calls(session)
        prev_id = before[-1].id if before else None
        try:
            out = asyncio.run(gw.complete(session, parse_chat_request(body)))
        except APIError as exc:
            assert exc.status == 400, exc
            note(f"the template refused: {exc}")
            return
        if gw.store.calls(session)[-1].parent_id is None:
            # A new segment is a full render of the messages as sent; calls that extend it
            # continue from that, with the replies we recorded.
            truth = list(msgs)
        _check(renderer, gw, engine, session, truth, kwargs, random_model, prev_id, restart)
        restart = None
        returned = out.message
        if not random_model:
            # The test's model only makes sense while our parse renders back to what it
            # sampled (a reply cut by length may not be the rendering of any message).
            again = _sampled(name, truth, {**returned}, kwargs)
            cut = engine.next[0] if finish == "length" else ids
            if again is None or again[1][:-1] != cut:
                return
        echoed = _echo(returned, turn["echo"])
        recorded = {**returned}
        if echoed.get("tool_calls"):
            recorded["tool_calls"] = [
                {**a, "id": b["id"]}
                for a, b in zip(returned["tool_calls"], echoed["tool_calls"], strict=True)
            ]
        new = _appended(turn, echoed, n, plan["parts"])
        if turn["append"] == "rewrite":  # compaction: history rewritten, a new segment
            msgs = msgs[:1] + [{"role": "user", "content": f"Summary of {n} turns."}]
            truth = list(msgs)
            restart = "history_diverged"  # its first message is the recorded one's
            continue
        msgs = msgs + [echoed] + new
        truth = truth + [recorded] + new


SETTINGS = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_played_model_never_mismatches_silently(name: str, tmp_path: Path) -> None:
    counter = iter(range(10**6))

    @SETTINGS
    @given(PLAN)
    def run(plan: dict) -> None:
        play(name, plan, tmp_path / f"run{next(counter)}", random_model=False)

    run()


@pytest.mark.parametrize("name", REAL_VOCAB)
def test_random_tokens_on_real_vocabularies_never_mismatch_silently(
    name: str, tmp_path: Path
) -> None:
    counter = iter(range(10**6))

    @SETTINGS
    @given(PLAN)
    def run(plan: dict) -> None:
        play(name, plan, tmp_path / f"run{next(counter)}", random_model=True)

    run()


@pytest.mark.parametrize(
    "name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "Qwen3-Coder"]
)
def test_the_check_really_compares_extended_calls(name: str, tmp_path: Path) -> None:
    """A fixed three-turn conversation through ``play``: each turn after the first extends the
    recorded tokens, so each must reach the token-for-token comparison (``_check``): the
    property tests above cannot pass by checking nothing (this used to be a count read after
    them, which depended on the order the tests ran in)."""
    before = CHECKED.get(name, 0)
    play(name, _plan(_turn(), _turn(), _turn()), tmp_path, random_model=False)
    assert CHECKED.get(name, 0) - before >= 2


# --- named regression cases (issue 10), each a fixed conversation through the same path -------


def _turn(**k: object) -> dict:
    return {
        "reply": "text",
        "finish": "stop",
        "echo": "same",
        "append": "next",
        "reasoning": False,
        **k,
    }


def _plan(*turns: dict, system: bool = True, parts: bool = False) -> dict:
    return {"system": system, "parts": parts, "turns": list(turns), "seed": 7}


def _calls(tmp: Path, name: str, plan: dict, random_model: bool = False) -> list:
    play(name, plan, tmp, random_model)
    store = Store(tmp)
    return store.calls(f"s{plan['seed']}")


def test_regression_text_parts_render_as_text(tmp_path: Path) -> None:
    calls = _calls(tmp_path, "Qwen-Qwen2.5-7B-Instruct", _plan(_turn(), _turn(), parts=True))
    assert len(calls) == 2 and calls[1].parent_id == calls[0].id  # extended, exactly


@pytest.mark.parametrize(
    "name",
    [
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        "Bielik-11B-v3.0-Instruct",
        "Cohere2MoE",
    ],
)
def test_regression_mixed_append_after_second_tool_round(name: str) -> None:
    """These extended [tool, user] after a second tool round with a wrong delta: the audit
    now plays that append and the policy refuses it unless it was exact."""
    renderer, policy, _ = _setup(name)
    report = audit(renderer)
    mixed = [s for s in report.steps if s.kind == "tool+user"]
    assert any(s.conversation == "round2-tool+user" for s in mixed)
    for s in mixed:
        assert s.status == "exact" or not policy.allows(s.kind, s.variant), s


def test_regression_stop_token_at_the_length_cap(tmp_path: Path) -> None:
    name = "Qwen-Qwen2.5-7B-Instruct"
    calls = _calls(tmp_path, name, _plan(_turn(finish="stop_at_cap"), _turn()))
    first, second = calls
    assert first.finish_reason == "stop" and first.info["engine_finish_reason"] == "length"
    assert "<|im_end|>" not in (first.message or {}).get("content", "")
    assert second.parent_id == first.id and second.seam == "stop"  # no second <|im_end|>


def _one_call(gw: Gateway, engine: ScriptedEngine, text: str, messages: list[dict]) -> dict:
    renderer = gw.renderer
    engine.next = (renderer.encode_fragment(text) + [min(renderer.tok.eog_token_ids)], "stop")
    body = {"messages": messages, "tools": TOOLS}
    return asyncio.run(gw.complete("s", parse_chat_request(body))).message


def test_regression_mistral_tool_call_ids(tmp_path: Path) -> None:
    gw, engine = _gateway("mistralai-Mistral-Nemo-Instruct-2407", tmp_path)
    gw.store.create_session({}, "s")
    msgs = [{"role": "user", "content": "Weather?"}]
    reply = _one_call(
        gw, engine, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', msgs
    )
    (cid,) = [c["id"] for c in reply["tool_calls"]]
    assert len(cid) == 9 and cid.isalnum()
    msgs += [reply, {"role": "tool", "tool_call_id": cid, "content": "18"}]
    _one_call(gw, engine, "Sunny.", msgs)  # the template accepts our ID: no 400
    # the startup audit found Mistral Nemo's template does not extend exactly on a tool
    # append after a call (the call's turn renders otherwise in history): a new segment, for
    # that reason, not an extension and not any other break
    first, second = gw.store.calls("s")
    assert (first.parent_id, first.segment_reason) == (None, "first_call")
    assert (second.parent_id, second.segment_reason) == (None, "template_policy")
    assert "'tool' messages" in second.info["segment_detail"]
    foreign = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0123456789abcdefghij",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0123456789abcdefghij", "content": "1"},
    ]
    assert "bcdefghij" in gw.renderer.template.render(foreign, TOOLS)  # last 9 kept, no 400


def test_regression_kimi_tool_call_ids(tmp_path: Path) -> None:
    gw, engine = _gateway("moonshotai-Kimi-K2", tmp_path)
    gw.store.create_session({}, "s")
    earlier = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "functions.get_time:0",
                "type": "function",
                "function": {"name": "get_time", "arguments": "{}"},
            }
        ],
    }
    msgs = [
        {"role": "user", "content": "Weather?"},
        earlier,
        {"role": "tool", "tool_call_id": "functions.get_time:0", "content": "9:00"},
    ]
    reply = _one_call(
        gw,
        engine,
        "<|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.get_weather:1<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        msgs,
    )
    assert [c["id"] for c in reply["tool_calls"]] == ["functions.get_weather:1"]


@pytest.mark.parametrize("name", ["GLM-4.6", "GLM-4.7-Flash", "Qwen-Qwen2.5-7B-Instruct"])
def test_regression_end_marker_text_inside_content(name: str) -> None:
    """A coding agent writes the end-of-turn marker's text into a file: the close is found
    after the reply, so the delta holds the tool result only, as the full render does."""
    renderer = _setup(name)[0]
    marker = "<|endoftext|>"
    reply = {
        "role": "assistant",
        "content": f"Writing {marker}.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": json.dumps({"city": f"x{marker}y"}),
                },
            }
        ],
    }
    user = {"role": "user", "content": "go"}
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18"}
    stops = [i for i, t in renderer.eog_text.items() if t != marker]
    full = renderer.template.render([user, reply, tool], TOOLS, add_generation_prompt=True)
    seen = set()
    for stop in stops:
        try:
            delta, seam = renderer.extension(reply, [tool], TOOLS, stop)
        except Exception as exc:  # noqa: BLE001 - refusing (a new segment) is allowed
            seen.add(type(exc).__name__)
            continue
        assert full.endswith(seam.text) and "x" + marker not in seam.text, seam
        assert "Writing" not in seam.text
    assert seen <= {"NotPrefixPreserving"}


def test_regression_apriel_closes_at_the_first_end_marker() -> None:
    renderer = _setup("unsloth-Apriel-1.5")[0]
    report = audit(renderer)
    assert not report.silent_mismatches or all(
        not report.policy().allows(s.kind, s.variant) for s in report.silent_mismatches
    )


def test_regression_unplayed_kinds_never_extend() -> None:
    _, policy, _ = _setup("google-gemma-4-31B-it")
    assert not policy.allows("tool", "plain")  # the audit could not play it: n/a
    assert not policy.allows("tool+user+tool", "plain")  # never played at all
    assert "never played" in policy.reason("tool+user+tool", "plain")


def test_regression_restart_with_another_template(tmp_path: Path) -> None:
    gw, engine = _gateway("Qwen-Qwen2.5-7B-Instruct", tmp_path)
    gw.store.create_session({}, "s")
    body = {"messages": [{"role": "user", "content": "hi"}]}
    engine.next = ([9707, 151645], "stop")
    reply = asyncio.run(gw.complete("s", parse_chat_request(body))).message
    other, engine2 = _gateway("Qwen3-Coder", tmp_path)  # same store, another template
    engine2.next = ([9707, 151645], "stop")
    nxt = {"messages": [*body["messages"], reply, {"role": "user", "content": "more"}]}
    asyncio.run(other.complete("s", parse_chat_request(nxt)))
    last = other.store.calls("s")[-1]
    assert last.parent_id is None and last.segment_reason == "template_changed"


def test_regression_retry_and_divergence_details(tmp_path: Path) -> None:
    gw, engine = _gateway("Qwen-Qwen2.5-7B-Instruct", tmp_path)
    gw.store.create_session({}, "s")
    first = {"messages": [{"role": "user", "content": "hi"}]}
    engine.next = ([9707, 151645], "stop")
    reply = asyncio.run(gw.complete("s", parse_chat_request(first))).message
    asyncio.run(gw.complete("s", parse_chat_request(first)))  # the same request again
    retry = gw.store.calls("s")[-1]
    assert retry.segment_reason == "first_call" and "retry" in retry.info["segment_detail"]
    edited = {**reply, "content": reply["content"] + " (edited by the harness)"}
    asyncio.run(
        gw.complete(
            "s",
            parse_chat_request(
                {"messages": [*first["messages"], edited, {"role": "user", "content": "more"}]}
            ),
        )
    )
    diverged = gw.store.calls("s")[-1]
    assert diverged.segment_reason == "history_diverged"
    assert "messages[1]" in diverged.info["segment_detail"]
    assert "content: recorded" in diverged.info["segment_detail"]


def test_regression_ambiguous_replies_pick_by_ids(tmp_path: Path) -> None:
    """Two siblings returned the same visible tool call; the echo's IDs say which one."""
    gw, engine = _gateway("Qwen-Qwen2.5-7B-Instruct", tmp_path)
    gw.store.create_session({}, "s")
    renderer = _setup("Qwen-Qwen2.5-7B-Instruct")[0]
    call = renderer.encode_fragment(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    replies = []
    for _ in range(2):
        engine.next = (call + [151645], "stop")
        out = asyncio.run(gw.complete("s", parse_chat_request(body)))
        replies.append(out.message)
    first_id = gw.store.calls("s")[0].id
    echoed = replies[0]  # the harness continues the first sibling, not the latest
    tool = {"role": "tool", "tool_call_id": echoed["tool_calls"][0]["id"], "content": "18"}
    engine.next = ([9707, 151645], "stop")
    asyncio.run(
        gw.complete(
            "s", parse_chat_request({**body, "messages": [*body["messages"], echoed, tool]})
        )
    )
    assert gw.store.calls("s")[-1].parent_id == first_id
