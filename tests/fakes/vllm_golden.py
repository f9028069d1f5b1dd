"""The requests the vLLM fake is checked with against a real vLLM, and the structure of an
answer: what ``record_vllm_golden.py`` writes into ``golden/`` from a real server, what
``tests/test_vllm_golden.py`` compares the fake with, and what ``tests/test_vllm_real.py``
checks the live server still answers.

The structure is the answer with its values taken out: status, media type, JSON keys, nesting
and value types, the SSE framing (``data:`` lines, ``[DONE]``, comments; a run of chunks of
one shape counted once); the few values that say which kind of answer it is (``object``,
``finish_reason``, ``output_mode``, an error's ``type`` and ``code``) are kept. Sampled values,
ids and timestamps are not: the fake's toy model samples differently, by design. What is
compared of the values is their counts (``facts``): token IDs, logprob entries, usage, echoed
prompt IDs and SSE events, which must agree inside one answer (``inconsistencies``) and with
the engine's where the request fixes them (``fact_differences``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

GOLDEN = Path(__file__).parent / "golden" / "vllm-0.32.0.json"
MAIN, DEFAULTS = "main", "defaults"  # the server a case runs on (see record_vllm_golden.py)
# What a case's server is started with (the real module's flags; the fake's equivalents in
# tests/test_vllm_golden.py): MAIN with scale-out, processed logprobs, 2048 tokens, dev mode.
MAIN_FLAGS = ["--enable-scale-out", "--logprobs-mode", "processed_logprobs"]
MAIN_FLAGS += ["--max-model-len", "2048"]
MAIN_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
KEPT = {"object", "finish_reason", "output_mode", "status", "is_paused"}
# values whose type depends on the server's state, not the request: SGLang's cache details
# (null on a prompt with nothing cached, else {"device", "host"})
OPAQUE = {"cached_tokens_details"}
KEPT_IN_ERROR = {"type", "code"}
PROMPT = [28, 33, 44, 51]  # byte-level tokens in both vocabularies (the fake's has 96)
CONTEXT = 2048
NEAR_FULL = PROMPT * 510  # 2040 tokens: 8 left (a prefix cached after the first, ~10 s)
TOO_LONG = PROMPT * 513  # 2052 tokens
NO_END = {"0": -100.0, "2": -100.0, "95": -100.0}  # SmolLM2's end tokens, the fake's EOS


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: dict | None = None
    server: str = MAIN
    only: tuple[str, ...] = ()  # dotted paths: compare just these parts (a huge answer)
    stream: bool = False
    notes: str = ""
    headers: dict = field(default_factory=dict)


def _sp(**kw: Any) -> dict:
    return {"max_tokens": 4, "temperature": 0.0, "logit_bias": NO_END, **kw}


def cases(model: str) -> list[Case]:
    """Every shape the fake serves, in the order they run (pause before resume; the weight
    version set, read, and set back). ``model``: the served model's id."""
    gen = "/inference/v1/generate"

    def generate(name: str, stream: bool = False, **body: Any) -> Case:
        body = {"request_id": f"golden-{name}", "token_ids": PROMPT, **body, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return Case(name, "POST", gen, body, stream=stream)

    def completions(name: str, stream: bool = False, **kw: Any) -> Case:
        body = {
            "model": model,
            "prompt": PROMPT,
            **_sp(),
            "echo": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **kw,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return Case(name, "POST", "/v1/completions", body, stream=stream)

    def chat(name: str, stream: bool = False, **kw: Any) -> Case:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Hi"}],
            **_sp(),
            "logprobs": True,
            "top_logprobs": 2,
            "return_token_ids": True,
            **kw,
            "stream": stream,
        }
        body = {k: v for k, v in body.items() if v is not None}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return Case(name, "POST", "/v1/chat/completions", body, stream=stream)

    return [
        Case("version", "GET", "/version"),
        Case("models", "GET", "/v1/models"),
        Case("health", "GET", "/health"),
        Case(
            "server_info",
            "GET",
            "/server_info?config_format=json",
            only=("vllm_config.model_config.logprobs_mode", "vllm_config.model_config.model"),
        ),
        generate("generate_logprobs", sampling_params=_sp(logprobs=2)),
        generate("generate_plain", sampling_params=_sp()),
        generate("generate_stream_logprobs", True, sampling_params=_sp(logprobs=1)),
        generate("generate_stream_plain", True, sampling_params=_sp()),
        generate("generate_stop_string", sampling_params=_sp(stop=["x"], detokenize=True)),
        Case("generate_no_token_ids", "POST", gen, {"sampling_params": _sp()}),
        generate("generate_empty_token_ids", token_ids=[], sampling_params=_sp()),
        generate("generate_no_sampling_params"),
        generate("generate_bad_temperature", sampling_params=_sp(temperature=-1.0)),
        generate("generate_too_many_logprobs", sampling_params=_sp(logprobs=50)),
        # vLLM 0.32 generates to the end of the context (finish_reason "length") when
        # max_tokens passes it; a prompt that fills it is refused
        generate(
            "generate_to_the_context_end", token_ids=NEAR_FULL, sampling_params=_sp(max_tokens=20)
        ),
        generate(
            "generate_stream_to_the_context_end",
            True,
            token_ids=NEAR_FULL,
            sampling_params=_sp(max_tokens=20),
        ),
        generate("generate_prompt_past_the_context", token_ids=TOO_LONG, sampling_params=_sp()),
        completions("completions_logprobs", logprobs=2),
        completions("completions_plain"),
        completions("completions_stream_logprobs", True, logprobs=1),
        completions("completions_stream_plain", True),
        completions("completions_to_the_context_end", prompt=NEAR_FULL, max_tokens=20),
        completions("completions_prompt_past_the_context", prompt=TOO_LONG),
        chat("chat"),
        chat("chat_stream", True),
        chat("chat_plain", logprobs=False, top_logprobs=None, return_token_ids=False),
        chat("chat_stream_plain", True, logprobs=False, top_logprobs=None, return_token_ids=False),
        chat("chat_unknown_model", model="no-such-model"),
        Case("abort_requests", "POST", "/inference/v1/abort_requests", {"request_ids": ["x"]}),
        Case("abort_requests_no_ids", "POST", "/inference/v1/abort_requests", {}),
        Case("dev_abort_requests", "POST", "/abort_requests", {"request_ids": ["x"]}),
        Case("detokenize", "POST", "/detokenize", {"model": model, "tokens": PROMPT}),
        Case("pause", "POST", "/pause?mode=wait"),
        Case("is_paused_while_paused", "GET", "/is_paused"),
        Case("resume", "POST", "/resume"),
        Case("is_paused", "GET", "/is_paused"),
        Case("update_weight_version", "POST", "/update_weight_version", {"new_version": "g1"}),
        Case("weight_info", "GET", "/weight_info"),
        Case("weight_version_back", "POST", "/update_weight_version", {"new_version": "default"}),
        Case(
            "generate_scale_out_off",
            "POST",
            gen,
            {"token_ids": PROMPT, "sampling_params": _sp()},
            server=DEFAULTS,
        ),
        Case(
            "abort_requests_scale_out_off",
            "POST",
            "/inference/v1/abort_requests",
            {"request_ids": ["x"]},
            server=DEFAULTS,
        ),
    ]


def _pick(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def shape(value: Any, key: str = "", in_error: bool = False) -> Any:
    """The structure of a JSON value (see the module's docstring)."""
    if key in OPAQUE:
        return "any"
    if isinstance(value, dict):  # keys named by a token ("token_id:25") count as one
        named = {re.sub(r"^token_id:\d+$", "token_id:N", k): v for k, v in value.items()}
        return {k: shape(v, k, in_error or k == "error") for k, v in sorted(named.items())}
    if isinstance(value, list):
        kinds = {json.dumps(shape(v), sort_keys=True) for v in value}
        return ["list", *(json.loads(k) for k in sorted(kinds))]
    if key in KEPT or (in_error and key in KEPT_IN_ERROR):
        return {"=": value}
    if value is None:
        return "null"
    return type(value).__name__  # bool, int, float, str


def sse_shape(raw: bytes) -> dict:
    """A stream's framing: its events in order (a run of one shape once: how many events a
    stream has depends on the tokens and, in SGLang's cumulative streams, on how fast the
    client reads), and whether every event ends with a blank line."""
    text = raw.decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    out: list[Any] = []
    for event in events:
        kinds = []
        for line in event.split("\n"):
            if line.startswith(":"):
                kinds.append("comment")
            elif line == "data: [DONE]":
                kinds.append("[DONE]")
            elif line.startswith("data: "):
                kinds.append(shape(json.loads(line[6:])))
            else:
                kinds.append(f"other line: {line[:40]}")
        kind = kinds[0] if len(kinds) == 1 else kinds
        if not out or out[-1] != kind:
            out.append(kind)
    return {"events": out, "ends_with_blank_line": text.endswith("\n\n")}


def media(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip()


def answer(client: httpx.Client, base: str, case: Case) -> dict:
    """One case asked of a server: its status, media type, structure and the raw text."""
    url = base + case.path
    if case.stream:
        with client.stream(case.method, url, json=case.body) as r:
            raw = r.read()
    else:
        r = client.request(case.method, url, json=case.body)
        raw = r.content
    kind = media(r.headers.get("content-type"))
    if kind == "text/event-stream":
        structure: Any = sse_shape(raw)
    elif raw:
        try:
            value = json.loads(raw)
        except ValueError:
            structure = {"not json": raw.decode(errors="replace")[:80]}
        else:
            if case.only:
                value = {p: _pick(value, p) for p in case.only}
            structure = shape(value)
    else:
        structure = "empty"
    text = raw.decode(errors="replace")
    return {
        "status": r.status_code,
        "media_type": kind,
        "shape": structure,
        "facts": facts(case, text, kind, r.status_code),
        "example": text[:3000],
    }


def load() -> dict:
    return json.loads(GOLDEN.read_text())


def differences(golden: dict, got: dict, name: str) -> list[str]:
    """Where ``got`` differs from the golden answer, in words (empty: the same structure)."""
    out = []
    for key in ("status", "media_type"):
        if golden[key] != got[key]:
            out.append(f"{name}: {key} {got[key]!r}, the engine {golden[key]!r}")
    if golden["shape"] != got["shape"]:
        out += [f"{name}: {d}" for d in _diff(golden["shape"], got["shape"], "")]
    return out


def _diff(want: Any, got: Any, at: str) -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got:
                out.append(f"{at}.{k}: missing (the engine has {json.dumps(want[k])[:120]})")
            elif k not in want:
                out.append(f"{at}.{k}: not in the engine's answer ({json.dumps(got[k])[:120]})")
            else:
                out += _diff(want[k], got[k], f"{at}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [
            d
            for i, (w, g) in enumerate(zip(want, got, strict=True))
            for d in _diff(w, g, f"{at}[{i}]")
        ]
    if want != got:
        return [f"{at}: {json.dumps(got)[:200]}, the engine {json.dumps(want)[:200]}"]
    return []


# Values inside one answer. The structure above leaves values out; these are the counts an
# answer must agree with itself on (and, where the request fixes them, with the engine's):
# one logprob entry per sampled token ID, usage equal to what was sent and sampled, one SSE
# event per token, one ``[DONE]``.

TOKEN_PATHS = {"/inference/v1/generate", "/v1/completions", "/v1/chat/completions", "/generate"}


def _request_prompt(body: dict | None) -> int | None:
    for key in ("token_ids", "prompt", "input_ids"):
        value = (body or {}).get(key)
        if isinstance(value, list):
            return len(value)
    return None


def _events(raw: str) -> tuple[list[dict], int]:
    """A stream's JSON events and its number of ``[DONE]`` lines."""
    bodies, done = [], 0
    for event in raw.split("\n\n"):
        for line in event.split("\n"):
            if line == "data: [DONE]":
                done += 1
            elif line.startswith("data: "):
                bodies.append(json.loads(line[6:]))
    return bodies, done


def _vllm_choice(c: dict) -> tuple[int | None, int | None, list[int], int]:
    """A choice's token IDs, logprob entries, top-list lengths and text length."""
    ids = c.get("token_ids")
    lp = c.get("logprobs")
    entries: int | None = None
    tops: list[int] = []
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):  # generate, chat
        entries = len(lp["content"])
        tops = [len(e.get("top_logprobs") or []) for e in lp["content"]]
    elif isinstance(lp, dict) and isinstance(lp.get("tokens"), list):  # completions
        entries = len(lp["tokens"])
        assert len(lp["token_logprobs"]) == len(lp["text_offset"]) == entries, c
        tops = [len(t or {}) for t in lp.get("top_logprobs") or []]
    text = (
        c.get("text") if "text" in c else (c.get("delta") or c.get("message") or {}).get("content")
    )
    return (len(ids) if isinstance(ids, list) else None), entries, tops, len(text or "")


def facts(case: Case, raw: str, kind: str, status: int) -> dict | None:
    """The counts inside one token-bearing answer (``None`` for any other): the request's
    prompt length, usage, sampled token IDs, logprob entries, top-list lengths, echoed prompt
    IDs; for a stream its JSON events, those carrying tokens, and its ``[DONE]`` lines."""
    if status != 200 or case.path not in TOKEN_PATHS:
        return None
    stream = kind == "text/event-stream"
    bodies, done = _events(raw) if stream else ([json.loads(raw)], 0)
    if any("choices" not in b and "meta_info" not in b for b in bodies):
        return None  # an error inside a stream: no tokens
    out: dict[str, Any] = {"request_prompt": _request_prompt(case.body)}
    if stream:
        out |= {"events": len(bodies), "done": done}
    if any("meta_info" in b for b in bodies):  # SGLang: each event cumulative
        cumulative = [(len(b["output_ids"]), b["meta_info"]["completion_tokens"]) for b in bodies]
        last = bodies[-1]
        meta = last["meta_info"]
        lps = meta.get("output_token_logprobs")
        tops = meta.get("output_top_logprobs")
        return out | {
            "cumulative": all(a == b for a, b in cumulative)
            and [a for a, _ in cumulative] == sorted(a for a, _ in cumulative),
            "token_ids": len(last["output_ids"]),
            "usage": {"prompt": meta["prompt_tokens"], "completion": meta["completion_tokens"]},
            "logprobs": None if lps is None else len(lps),
            "logprobs_length": meta.get("output_token_logprobs_length"),
            "top": None if tops is None else sorted({len(t) for t in tops}),
            "top_lists": None if tops is None else len(tops),
        }
    n_ids: int | None = None
    n_lp: int | None = None
    tops_seen: set[int] = set()
    prompt_ids: int | None = None
    usage: dict | None = None
    token_events = 0
    for b in bodies:
        if isinstance(b.get("usage"), dict):
            u = b["usage"]
            usage = {
                "prompt": u["prompt_tokens"],
                "completion": u["completion_tokens"],
                "total": u["total_tokens"],
            }
        echoed = [b.get("prompt_token_ids")] + [c.get("prompt_token_ids") for c in b["choices"]]
        for p in echoed:
            if isinstance(p, list):
                prompt_ids = (prompt_ids or 0) + len(p)
        carries = False
        for c in b["choices"]:
            ids, entries, tops, text = _vllm_choice(c)
            if ids is not None:
                n_ids = (n_ids or 0) + ids
            if entries is not None:
                n_lp = (n_lp or 0) + entries
            tops_seen |= set(tops)
            carries = carries or bool(ids or entries or text)
        token_events += carries
    out |= {
        "usage": usage,
        "token_ids": n_ids,
        "logprobs": n_lp,
        "top": sorted(tops_seen) or None,
        "prompt_token_ids": prompt_ids,
    }
    if stream:
        out["token_events"] = token_events
    return out


def inconsistencies(f: dict | None) -> list[str]:
    """Where one answer's counts disagree with each other (empty: they agree)."""
    if f is None:
        return []
    out = []
    usage = f.get("usage")
    if usage is None:
        return ["no usage"]
    completion = usage["completion"]

    def same(what: str, value: object, want: object, of: str) -> None:
        if value is not None and want is not None and value != want:
            out.append(f"{what} {value} != {of} {want}")

    if "total" in usage:
        same(
            "usage.total_tokens", usage["total"], usage["prompt"] + completion, "prompt+completion"
        )
    same("usage.prompt_tokens", usage["prompt"], f["request_prompt"], "the request's prompt")
    same("echoed prompt_token_ids", f.get("prompt_token_ids"), usage["prompt"], "prompt_tokens")
    same("token IDs", f["token_ids"], completion, "usage.completion_tokens")
    same("logprob entries", f["logprobs"], completion, "usage.completion_tokens")
    same("output_token_logprobs_length", f.get("logprobs_length"), completion, "completion")
    same("top-logprob lists", f.get("top_lists"), completion, "usage.completion_tokens")
    if f.get("cumulative") is False:
        out.append("a cumulative event's output_ids and completion_tokens disagree")
    if "done" in f:
        same("[DONE] lines", f["done"], 1, "one")
    if "token_events" in f:  # one event per token, plus the usage event (include_usage)
        same("events carrying tokens", f["token_events"], completion, "usage.completion_tokens")
    return out


def golden_facts(recorded: dict, case: Case) -> dict | None:
    """The counts of a recorded answer: stored by the recorder (from the whole answer), else
    read from its example, which the recorder cut at 3000 characters: ``CUT`` when it was cut
    (not guessed), ``None`` for an answer that carries no tokens."""
    if "facts" in recorded:
        return recorded["facts"]
    if case.path not in TOKEN_PATHS or recorded["status"] != 200:
        return None
    try:
        return facts(case, recorded["example"], recorded["media_type"], recorded["status"])
    except ValueError:  # json: the example ends mid-answer
        return CUT


CUT = {"cut": True}  # a recorded example too long to read back (re-recording stores its facts)


def fact_differences(golden: dict | None, got: dict | None, case: Case) -> list[str]:
    """Where the fake's counts differ from the engine's for the same request: every count,
    but a chat prompt's length (the fake's chat template is its own toy one)."""

    def comparable(f: dict | None) -> dict | None:
        if f is None or case.path != "/v1/chat/completions":
            return f
        usage = {k: v for k, v in (f.get("usage") or {}).items() if k == "completion"}
        return {**f, "usage": usage, "prompt_token_ids": f.get("prompt_token_ids") is not None}

    want, have = comparable(golden), comparable(got)
    if want == have:
        return []
    if want is None or have is None:
        return [f"{case.name}: counts {have}, the engine {want}"]
    return [
        f"{case.name}: {k} {have.get(k)!r}, the engine {want.get(k)!r}"
        for k in sorted(set(want) | set(have))
        if want.get(k) != have.get(k)
    ]
