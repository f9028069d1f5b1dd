"""Coding-agent sessions (issue 28): Turnstile next to a plain relay in front of one fake engine
with a realistic per-token latency, at 32-384 concurrent sessions, in one run.

Set-up (printed with the results):

- the workload (``_agent_workload.py``, deterministic from ``--seed``): three harnesses, one per
  wire dialect Turnstile serves (``/v1/chat/completions``, ``/v1/responses``,
  ``/v1/messages``), each with a ~25-30k-token system prompt and 20-24 tool schemas; sessions
  of 50-200 turns whose tool results (0.5-5k tokens each) take the context to 110-200k
  tokens; replies of a thought and 1-3 parallel tool calls; half the sessions stream. Each
  turn the harness sends the whole history with the reply and the tool results appended, as
  agent harnesses do (raw aiohttp + orjson: the load generator must not be the bottleneck);
- sessions start where the benchmark resumes them (a turn drawn from each session's length,
  the history up to it sent whole at warm-up, not measured), so every cell holds contexts of
  every depth at once; a session that ends is replaced by a fresh one from turn 0;
- the fake engine (this script, ``--serve-fake``): vLLM's token-in ``/inference/v1/generate``
  for Turnstile and the three dialects' endpoints for the relay, answering each turn with the
  reply the workload names for it (carried in ``max_tokens``, which both paths forward) as
  Qwen2.5 Hermes tool calls, so Turnstile's parser finds the calls and the sessions chain;
  latency = prefill per 1k prompt tokens + decode per sampled token (streamed in events of
  ``--chunk`` tokens); the relay's prompt tokens are estimated from its body's bytes (the
  ratio calibrated on this workload with the real tokenizer and template);
- the relay is ``_relays.py``'s aiohttp relay (reads and parses the body, forwards the bytes);
  both proxies on core 1, the load generator on core 0, the fake engine unpinned; relay and
  Turnstile alternate cell by cell (ABBA), each sent the same sessions and turns;
- per cell: turns/s relative to the relay, proxy CPU per turn (/proc, all threads) and turns
  per CPU-second, added latency p50/p99 (Turnstile's minus the relay's over the same turns);
  ``zero`` mode repeats the sweep with no engine latency (the proxies' cap);
- ``deep``: 32 sessions resumed at contexts >= 100k tokens, zero latency: turns per CPU-second
  at 100k-token contexts (``--profile``: py-spy over Turnstile's cell, folded by part);
- ``flat``: one 200-turn session from turn 0, relay and Turnstile turn by turn: CPU per turn
  over the session;
- RSS of each proxy per live session; and, read from Turnstile's store after the run, whether
  every call after a session's first extended its recorded tokens (the run fails otherwise).

    python benchmarks/agent_sessions.py            # the full run (~17 minutes on 2 shared cores)
    python benchmarks/agent_sessions.py --quick    # smoke run (< 60 s, small counts)
    python benchmarks/agent_sessions.py --fold RAW --cpu-ms X   # fold a py-spy profile
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _machine
import _records
import _report
import _servers
import _workload
import numpy as np
import orjson
import xxhash
from _agent_workload import Plan, Reply, Workload

from turnstile.testing.asgi import asgi_body, asgi_lifespan

LOADGEN_CPU, PROXY_CPU = 0, 1
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
HERE = Path(__file__).resolve()


# ---------------------------------------------------------------------------------------------
# the fake engine


def _events(kind: str, payloads: list[tuple[str, dict]]) -> list[bytes]:
    if kind == "chat":
        return [b"data: " + orjson.dumps(p) + b"\n\n" for _, p in payloads] + [b"data: [DONE]\n\n"]
    return [f"event: {e}\ndata: ".encode() + orjson.dumps(p) + b"\n\n" for e, p in payloads]


def _pieces(text: str, n: int) -> list[str]:
    n = max(1, n)
    step = max(1, -(-len(text) // n))
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]


def _formats(v: int, r: dict, chunk: int) -> dict[str, tuple[bytes, list[bytes]]]:
    """One reply in every shape the fake answers: token-in vLLM and the three dialects."""
    ids = r["token_ids"]
    n = len(ids)
    lps = [round(-0.05 - (i % 7) * 0.11, 4) for i in range(n)]
    usage = {"prompt_tokens": 1000, "completion_tokens": n, "total_tokens": 1000 + n}

    def gen_choice(tids: list[int], tlps: list[float], finish: str | None) -> dict:
        return {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": tids,
            "logprobs": {
                "content": [
                    {"token_id": t, "logprob": lp, "rank": 1, "top_logprobs": []}
                    for t, lp in zip(tids, tlps, strict=True)
                ]
            },
        }

    rid = f"gen-{v}"
    gen_whole = orjson.dumps(
        {"request_id": rid, "usage": usage, "choices": [gen_choice(ids, lps, "stop")]}
    )
    gen_ev = []
    for i in range(0, n, chunk):
        last = i + chunk >= n
        ch = gen_choice(ids[i : i + chunk], lps[i : i + chunk], "stop" if last else None)
        gen_ev.append(b"data: " + orjson.dumps({"request_id": rid, "choices": [ch]}) + b"\n\n")
    gen_ev.append(b"data: " + orjson.dumps({"request_id": rid, "usage": usage, "choices": []}))
    gen_ev[-1] += b"\n\n"
    gen_ev.append(b"data: [DONE]\n\n")

    events = max(2, -(-n // chunk))
    calls = [
        (f"{v}_{k}", name, json.dumps(args), args) for k, (name, args) in enumerate(r["calls"])
    ]
    t_ev = max(
        1,
        events
        * len(r["thought"])
        // max(1, len(r["thought"]) + sum(len(a) for _, _, a, _ in calls)),
    )
    a_ev = max(1, (events - t_ev) // len(calls))
    thought = r["thought"]

    # Chat Completions
    def chunk_(delta: dict, finish: str | None = None) -> tuple[str, dict]:
        return "", {
            "id": "chatcmpl-b",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": _workload.MODEL_NAME,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    tool_calls = [
        {"id": f"call_{cid}", "type": "function", "function": {"name": name, "arguments": a}}
        for cid, name, a, _ in calls
    ]
    chat_whole = orjson.dumps(
        {
            "id": "chatcmpl-b",
            "object": "chat.completion",
            "created": 0,
            "model": _workload.MODEL_NAME,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": thought, "tool_calls": tool_calls},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": usage,
        }
    )
    cp = [chunk_({"role": "assistant", "content": ""})]
    cp += [chunk_({"content": p}) for p in _pieces(thought, t_ev)]
    for k, (cid, name, a, _) in enumerate(calls):
        head = {"index": k, "id": f"call_{cid}", "type": "function"}
        cp.append(chunk_({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
        cp += [
            chunk_({"tool_calls": [{"index": k, "function": {"arguments": p}}]})
            for p in _pieces(a, a_ev)
        ]
    cp.append(chunk_({}, "tool_calls"))

    # Responses
    output: list[dict] = [
        {
            "type": "message",
            "id": f"msg_{v}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": thought, "annotations": []}],
        }
    ]
    output += [
        {
            "type": "function_call",
            "id": f"fc_{cid}",
            "call_id": f"call_{cid}",
            "name": name,
            "arguments": a,
            "status": "completed",
        }
        for cid, name, a, _ in calls
    ]
    resp = {
        "id": f"resp_{v}",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": _workload.MODEL_NAME,
        "output": output,
        "usage": {"input_tokens": 1000, "output_tokens": n, "total_tokens": 1000 + n},
    }
    rp: list[tuple[str, dict]] = [
        (
            "response.created",
            {
                "type": "response.created",
                "response": {**resp, "status": "in_progress", "output": []},
            },
        )
    ]
    rp += [
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": f"msg_{v}",
                "output_index": 0,
                "content_index": 0,
                "delta": p,
            },
        )
        for p in _pieces(thought, t_ev)
    ]
    for k, (cid, _, a, _) in enumerate(calls):
        rp += [
            (
                "response.function_call_arguments.delta",
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": f"fc_{cid}",
                    "output_index": k + 1,
                    "delta": p,
                },
            )
            for p in _pieces(a, a_ev)
        ]
    rp.append(("response.completed", {"type": "response.completed", "response": resp}))

    # Messages
    content: list[dict] = [{"type": "text", "text": thought}]
    content += [
        {"type": "tool_use", "id": f"toolu_{cid}", "name": name, "input": args}
        for cid, name, _, args in calls
    ]
    msg = {
        "id": f"msg_{v}",
        "type": "message",
        "role": "assistant",
        "model": _workload.MODEL_NAME,
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 1000, "output_tokens": n},
    }
    mp: list[tuple[str, dict]] = [
        (
            "message_start",
            {"type": "message_start", "message": {**msg, "content": [], "stop_reason": None}},
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    mp += [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
        )
        for p in _pieces(thought, t_ev)
    ]
    mp.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    for k, (cid, name, a, _) in enumerate(calls):
        block = {"type": "tool_use", "id": f"toolu_{cid}", "name": name, "input": {}}
        mp.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": k + 1, "content_block": block},
            )
        )
        mp += [
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": k + 1,
                    "delta": {"type": "input_json_delta", "partial_json": p},
                },
            )
            for p in _pieces(a, a_ev)
        ]
        mp.append(("content_block_stop", {"type": "content_block_stop", "index": k + 1}))
    mp.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
        )
    )
    mp.append(("message_stop", {"type": "message_stop"}))
    return {
        "/inference/v1/generate": (gen_whole, gen_ev),
        "/v1/chat/completions": (chat_whole, _events("chat", cp)),
        "/v1/responses": (orjson.dumps(resp), _events("responses", rp)),
        "/v1/messages": (orjson.dumps(msg), _events("messages", mp)),
    }


def _int_after(body: bytes, key: bytes) -> int | None:
    i = body.find(key)
    if i < 0:
        return None
    j = i + len(key)
    while j < len(body) and body[j : j + 1] == b" ":
        j += 1
    k = j
    while k < len(body) and 48 <= body[k] <= 57:
        k += 1
    return int(body[j:k]) if k > j else None


def prompt_digest(ids: Any) -> str:
    """A prompt's token IDs, hashed (the fake keeps this, not the IDs)."""
    return xxhash.xxh3_128_hexdigest(np.asarray(ids, dtype=np.int32).tobytes())


def fake_app(spec: dict) -> Any:
    """The fake engine. A request's reply is ``max_tokens - Workload.MAX_TOKENS`` (the workload
    names it); its prompt length is counted (token-in) or estimated from the body's bytes."""
    chunk = int(spec["chunk"])
    replies = spec["replies"]
    shapes = [_formats(v, r, chunk) for v, r in enumerate(replies)]
    n_tokens = [len(r["token_ids"]) for r in replies]
    bpt = spec["bytes_per_token"]  # per dialect path
    state = {"prefill": 0.0, "decode": 0.0}  # seconds per 1k prompt tokens, per sampled token
    # the recorder (``POST /record {"every": K}``): every K-th token-in request's prompt kept
    # as its length and digest, with the reply it was answered with
    recorder: dict[str, Any] = {"every": 0, "received": 0, "samples": []}
    sampled = []
    for shape in shapes:
        choice = orjson.loads(shape["/inference/v1/generate"][0])["choices"][0]
        lps = [e["logprob"] for e in choice["logprobs"]["content"]]
        sampled.append({"token_ids": choice["token_ids"], "logprobs": lps})
    json_h = [(b"content-type", b"application/json")]
    sse_h = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    models = orjson.dumps(
        {
            "object": "list",
            "data": [{"id": _workload.MODEL_NAME, "object": "model", "max_model_len": 1 << 20}],
        }
    )

    async def app(scope, receive, send):  # noqa: ANN001, ANN202
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send)
        path = scope["path"]
        body = await asgi_body(receive)
        if path == "/pace":
            p = orjson.loads(body)
            state["prefill"], state["decode"] = p["prefill_ms_per_1k"] / 1000, p["decode_ms"] / 1000
            path = "/health"
        if path == "/record":
            recorder.update(every=int(orjson.loads(body)["every"]), received=0, samples=[])
            path = "/health"
        if path == "/recorded":
            kept = {k: recorder[k] for k in ("received", "samples")}
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send(
                {"type": "http.response.body", "body": orjson.dumps({**kept, "sampled": sampled})}
            )
            return
        if path in ("/health", "/version", "/v1/models"):
            data = {"/health": b"{}", "/version": b'{"version":"0.33.0"}'}.get(path, models)
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send({"type": "http.response.body", "body": data})
            return
        if path == "/inference/v1/generate":
            i = body.find(b'"token_ids":[')
            prompt = body.count(b",", i, body.find(b"]", i)) + 1 if i >= 0 else 0
            mt = _int_after(body, b'"max_tokens":')
        elif path in bpt:
            prompt = int(len(body) / bpt[path])
            key = b'"max_output_tokens":' if path == "/v1/responses" else b'"max_tokens":'
            mt = _int_after(body, key)
        else:
            await send({"type": "http.response.start", "status": 404, "headers": json_h})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        v = (mt or 0) - Workload.MAX_TOKENS
        v = v if 0 <= v < len(shapes) else 0
        if path == "/inference/v1/generate" and recorder["every"]:
            recorder["received"] += 1
            if recorder["received"] % recorder["every"] == 0:
                req = orjson.loads(body)
                ids = req["token_ids"]
                recorder["samples"].append(
                    {"n": len(ids), "digest": prompt_digest(ids), "reply": v, "max_tokens": mt}
                )
        whole, events = shapes[v][path]
        stream = b'"stream":true' in body or b'"stream": true' in body
        prefill = prompt / 1000 * state["prefill"]
        decode = state["decode"]
        if not stream:
            if prefill or decode:
                await asyncio.sleep(prefill + decode * n_tokens[v])
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send({"type": "http.response.body", "body": whole})
            return
        await send({"type": "http.response.start", "status": 200, "headers": sse_h})
        if prefill:
            await asyncio.sleep(prefill)
        # The engine's events are spread over the decode time (token-in: one per `chunk`
        # tokens; the dialects' events as many, whatever their shape).
        gap = decode * n_tokens[v] / max(1, len(events) - 1) if decode else 0.0
        for j, ev in enumerate(events):
            if gap and j:
                await asyncio.sleep(gap)
            await send({"type": "http.response.body", "body": ev, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def start_fake(spec: Path, log: Path, cpu: int | None = None) -> tuple[_machine.Server, str]:
    """The fake engine; by default not pinned: it answers on whichever core the machine's
    other tenants leave free. ``cpu``: pinned there (a real engine runs on its own device)."""
    port = _machine.free_port()
    s = _machine.Server(
        [sys.executable, str(HERE), "--serve-fake", str(spec), "--port", str(port)],
        f"http://127.0.0.1:{port}/health",
        cpu,
        log,
    )
    return s, f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------
# the harness side


def tools_for(dialect: str, tools: list[dict]) -> list[dict]:
    if dialect == "chat":
        return tools
    if dialect == "responses":
        return [{"type": "function", **t["function"]} for t in tools]
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]


@dataclass
class Call:
    id: str
    name: str
    arguments: str  # JSON


def assistant_items(dialect: str, text: str | None, calls: list[Call]) -> list[dict]:
    """The assistant's turn as the harness appends it to its history, in its dialect."""
    if dialect == "chat":
        tcs = [
            {"id": x.id, "type": "function", "function": {"name": x.name, "arguments": x.arguments}}
            for x in calls
        ]
        return [{"role": "assistant", "content": text or None, "tool_calls": tcs}]
    if dialect == "responses":
        out: list[dict] = []
        if text:
            out.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            )
        out += [
            {"type": "function_call", "call_id": x.id, "name": x.name, "arguments": x.arguments}
            for x in calls
        ]
        return out
    blocks: list[dict] = [{"type": "text", "text": text}] if text else []
    blocks += [
        {"type": "tool_use", "id": x.id, "name": x.name, "input": json.loads(x.arguments)}
        for x in calls
    ]
    return [{"role": "assistant", "content": blocks}]


def result_items(dialect: str, calls: list[Call], outputs: list[str]) -> list[dict]:
    if dialect == "chat":
        return [
            {"role": "tool", "tool_call_id": x.id, "content": o}
            for x, o in zip(calls, outputs, strict=True)
        ]
    if dialect == "responses":
        return [
            {"type": "function_call_output", "call_id": x.id, "output": o}
            for x, o in zip(calls, outputs, strict=True)
        ]
    blocks = [
        {"type": "tool_result", "tool_use_id": x.id, "content": o}
        for x, o in zip(calls, outputs, strict=True)
    ]
    return [{"role": "user", "content": blocks}]


def parse_answer(dialect: str, body: bytes, stream: bool) -> tuple[str | None, list[Call]]:
    """The assistant's text and tool calls from an answer (whole or an SSE stream)."""
    if not stream:
        return _parse_whole(dialect, orjson.loads(body))
    datas = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            datas.append(orjson.loads(line[6:]))
    if dialect == "responses":
        done = next(d for d in reversed(datas) if d.get("type") == "response.completed")
        return _parse_whole(dialect, done["response"])
    text, calls = "", {}
    if dialect == "chat":
        for d in datas:
            for ch in d.get("choices") or []:
                delta = ch.get("delta") or {}
                text += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    cur = calls.setdefault(tc["index"], Call("", "", ""))
                    cur.id = tc.get("id") or cur.id
                    f = tc.get("function") or {}
                    cur.name += f.get("name") or ""
                    cur.arguments += f.get("arguments") or ""
    else:
        for d in datas:
            if d.get("type") == "content_block_start" and d["content_block"]["type"] == "tool_use":
                b = d["content_block"]
                calls[d["index"]] = Call(b["id"], b["name"], "")
            elif d.get("type") == "content_block_delta":
                delta = d["delta"]
                if delta["type"] == "text_delta":
                    text += delta["text"]
                elif delta["type"] == "input_json_delta":
                    calls[d["index"]].arguments += delta["partial_json"]
        for x in calls.values():
            x.arguments = x.arguments or "{}"
    return text or None, [calls[k] for k in sorted(calls)]


def _parse_whole(dialect: str, d: dict) -> tuple[str | None, list[Call]]:
    if dialect == "chat":
        m = d["choices"][0]["message"]
        calls = [
            Call(t["id"], t["function"]["name"], t["function"]["arguments"])
            for t in m.get("tool_calls") or []
        ]
        return m.get("content"), calls
    if dialect == "responses":
        text, calls = "", []
        for item in d["output"]:
            if item["type"] == "message":
                text += "".join(p.get("text", "") for p in item["content"])
            elif item["type"] == "function_call":
                calls.append(Call(item["call_id"], item["name"], item["arguments"]))
        return text or None, calls
    text, calls = "", []
    for b in d["content"]:
        if b["type"] == "text":
            text += b["text"]
        elif b["type"] == "tool_use":
            calls.append(Call(b["id"], b["name"], json.dumps(b["input"])))
    return text or None, calls


@dataclass
class Target:
    name: str
    url: str
    server: Any  # _machine.Server, or Workers (a process tree)
    headers: dict[str, str]
    http: Any = None
    # sessions opened with POST /v1/sessions, each called at its base URL (--workers:
    # its owning worker's port); None: calls name the session with X-Session-Id
    bases: dict[str, str] | None = None


class Workers:
    """``turnstile serve --workers N`` as one target: the front and its worker processes
    (CPU and memory summed over them)."""

    def __init__(self, server: _machine.Server):
        self.server = server
        self.proc = server.proc

    @property
    def pid(self) -> int:
        return self.server.pid

    def pids(self) -> list[int]:
        out, todo = [], [self.server.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(x) for x in f.read().split()]
        return out

    def cpu(self) -> float:
        return sum(_machine.cpu_seconds(p) for p in self.pids())

    def cpu_pair(self) -> tuple[float, float]:
        pairs = [(_machine.cpu_seconds(p), _machine.stat_cpu_seconds(p)) for p in self.pids()]
        return sum(a for a, _ in pairs), sum(b for _, b in pairs)

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Session:
    """One session as one target's harness holds it."""

    plan: Plan
    sid: str
    dialect: str
    head: dict  # the request's fixed fields
    hist: list[dict]
    turn: int
    context: int  # estimated prompt tokens of the next turn
    calls: int = 0


@dataclass
class Turn:
    target: str
    latency: float
    context: int
    ok: bool
    first: bool


@dataclass
class Harness:
    """The load generator: sessions per target, built from the workload."""

    wl: Workload
    run_id: str
    mix: tuple[float, float, float]
    fresh_next: int = 1_000_000
    sids: dict[str, str] = field(default_factory=dict)  # Turnstile's sessions: their kind
    errors: list[str] = field(default_factory=list)
    fake: Any = None  # the fake engine's server (its CPU is shown per cell)

    def session(self, target: str, plan: Plan) -> Session:
        wl, h = self.wl, self.wl.harnesses[plan.harness]
        d = h.dialect
        user = wl.user(plan)
        head: dict[str, Any] = {"model": _workload.MODEL_NAME}
        if d == "chat":
            hist: list[dict] = [
                {"role": "system", "content": h.system},
                {"role": "user", "content": user},
            ]
        elif d == "responses":
            head["instructions"] = h.system
            hist = [{"type": "message", "role": "user", "content": user}]
        else:
            head["system"] = h.system
            hist = [{"role": "user", "content": user}]
        head["tools"] = tools_for(d, h.tools)
        ctx = wl.base_tokens(plan)
        for t in range(plan.start):  # the turns before the one it resumes at, as sampled
            r = wl.replies[wl.variant(plan, t)]
            calls = [
                Call(f"call_{plan.index}_{t}_{k}", n, json.dumps(a))
                for k, (n, a) in enumerate(r.calls)
            ]
            hist += assistant_items(d, r.thought, calls)
            hist += result_items(d, calls, [wl.output(plan, t, k)[0] for k in range(len(calls))])
            ctx += wl.turn_tokens(plan, t)
        sid = f"{self.run_id}-{plan.index}"
        if target in ("turnstile", "workers"):
            self.sids[sid] = f"{d}{' stream' if plan.stream else ''}"
        return Session(plan, sid, d, head, hist, plan.start, ctx)

    async def base(self, t: Target, sid: str) -> str:
        """The session's origin + ``/s/<capability>``, opened on first use (``--workers``)."""
        assert t.bases is not None
        if sid not in t.bases:
            async with t.http.post(
                t.url + "/v1/sessions", data=orjson.dumps({"id": sid}), headers=t.headers
            ) as r:
                base = (await r.json())["base_url"]
            t.bases[sid] = base.removesuffix("/v1")
        return t.bases[sid]

    def fresh(self) -> int:
        self.fresh_next += 1
        return self.fresh_next

    def body(self, s: Session) -> tuple[str, bytes]:
        v = self.wl.variant(s.plan, s.turn)
        key = "max_output_tokens" if s.dialect == "responses" else "max_tokens"
        hist_key = "input" if s.dialect == "responses" else "messages"
        payload = {
            **s.head,
            hist_key: s.hist,
            key: Workload.MAX_TOKENS + v,
            "stream": s.plan.stream,
        }
        return PATHS[s.dialect], orjson.dumps(payload)

    async def step(self, t: Target, s: Session) -> Turn:
        """One turn: send the history, read the answer, append it and the tool results."""
        path, body = self.body(s)
        expect: Reply = self.wl.replies[self.wl.variant(s.plan, s.turn)]
        first = s.calls == 0
        ctx = s.context
        t0 = time.perf_counter()
        try:
            if t.bases is None:
                url, headers = t.url + path, {**t.headers, "x-session-id": s.sid}
            else:
                url, headers = await self.base(t, s.sid) + path, t.headers
            async with t.http.post(url, data=body, headers=headers) as r:
                raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {raw[:300]!r}")
            lat = time.perf_counter() - t0
            text, calls = parse_answer(s.dialect, raw, s.plan.stream)
            if [x.name for x in calls] != [n for n, _ in expect.calls]:
                raise RuntimeError(
                    f"calls {[x.name for x in calls]} != {[n for n, _ in expect.calls]}"
                )
        except Exception as exc:  # noqa: BLE001 - counted and shown
            self.errors.append(f"{t.name} {s.dialect} turn {s.turn}: {type(exc).__name__}: {exc}")
            if len(self.errors) <= 3:
                print(f"    error: {self.errors[-1][:300]}", flush=True)
            s.turn = s.plan.turns  # the session ends
            return Turn(t.name, time.perf_counter() - t0, ctx, False, first)
        outs = [self.wl.output(s.plan, s.turn, k)[0] for k in range(len(calls))]
        s.hist += assistant_items(s.dialect, text, calls)
        s.hist += result_items(s.dialect, calls, outs)
        s.context += self.wl.turn_tokens(s.plan, s.turn)
        s.turn += 1
        s.calls += 1
        return Turn(t.name, lat, ctx, True, first)


async def run_cell(
    h: Harness, t: Target, slots: list[Session], turns_each: int, stagger: float
) -> dict:
    """Every slot's session makes ``turns_each`` turns (a session that ends is replaced by a
    fresh one); the proxy's CPU and the wall time over the cell."""
    done: list[Turn] = []

    async def worker(i: int) -> None:
        await asyncio.sleep(stagger * i / max(1, len(slots)))
        for _ in range(turns_each):
            s = slots[i]
            if s.turn >= s.plan.turns:
                s = slots[i] = h.session(t.name, h.wl.plan(h.fresh(), True, h.mix))
            done.append(await h.step(t, s))

    cpu0 = t.server.cpu_pair()
    side0 = (h.fake.cpu_pair()[1] if h.fake else 0.0, sum(os.times()[:2]))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(len(slots))))
    wall = time.perf_counter() - t0
    cpu1 = t.server.cpu_pair()
    side1 = (h.fake.cpu_pair()[1] if h.fake else 0.0, sum(os.times()[:2]))
    fine, ticks = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    used = fine if fine >= ticks - 0.02 else ticks
    ok = [x for x in done if x.ok]
    return {
        "target": t.name,
        "turns": len(ok),
        "errors": len(done) - len(ok),
        "wall": wall,
        "cpu": used,
        "engine_cpu": side1[0] - side0[0],  # the fake engine's CPU seconds in the cell
        "loadgen_cpu": side1[1] - side0[1],  # the load generator's (this process)
        "lat": [x.latency for x in ok],
        "ctx": [x.context for x in ok],
    }


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_of(server: Any) -> int:
    """RSS of a target's process, or summed over a ``Workers`` tree."""
    return sum(rss(p) for p in server.pids()) if isinstance(server, Workers) else rss(server.pid)


def start_workers(
    n: int, engine_url: str, data: Path, cpus: str, log: Path
) -> tuple[_machine.Server, str]:
    """``turnstile serve --workers n`` (the CLI, as an operator runs it) in front of the fake
    engine's token-in route."""
    port = _machine.free_port()
    s = _machine.Server(
        [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "serve",
            *_servers.serve_options(engine_url, data),
            "--port",
            str(port),
            "--workers",
            str(n),
            "--log-level",
            "warning",
        ],
        f"http://127.0.0.1:{port}/health",
        cpus,  # type: ignore[arg-type]  # taskset's list, e.g. "0,1"
        log,
        env={"TURNSTILE_TOKEN": _servers.TOKEN},
        timeout=300,
    )
    return s, f"http://127.0.0.1:{port}"


async def warm(h: Harness, t: Target, slots: list[Session], conc: int = 8) -> None:
    """Each session's first call: the history up to the turn it resumes at, whole."""
    sem = asyncio.Semaphore(conc)

    async def one(s: Session) -> None:
        async with sem:
            await h.step(t, s)

    await asyncio.gather(*(one(s) for s in slots))


# ---------------------------------------------------------------------------------------------
# calibration, checks, profile


def calibrate(wl: Workload) -> dict[str, float]:
    """Bytes of each dialect's request per prompt token (the real template and tokenizer on
    sample sessions): how the fake estimates the relay's prompt length."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from turnstile.app.wiring import build_renderer

    renderer, _ = build_renderer(str(_workload.tiny_qwen2()))
    template = renderer.template
    h = Harness(wl, "cal", (1 / 3, 1 / 3, 1 / 3))
    out = {}
    for i, hz in enumerate(wl.harnesses):
        plan = Plan(999_000 + i, i, False, 60, 120_000, 40)
        # The same conversation in Chat Completions shape gives the token count.
        s = h.session("relay", plan)
        msgs = [
            {"role": "system", "content": hz.system},
            {"role": "user", "content": wl.user(plan)},
        ]
        for t in range(plan.start):
            r = wl.replies[wl.variant(plan, t)]
            calls = [Call(f"call_{t}_{k}", n, json.dumps(a)) for k, (n, a) in enumerate(r.calls)]
            msgs += assistant_items("chat", r.thought, calls)
            msgs += result_items(
                "chat", calls, [wl.output(plan, t, k)[0] for k in range(len(calls))]
            )
        text, _ = render_jinja_template(
            conversations=[template.messages(msgs)],
            tools=hz.tools,
            chat_template=template.source,
            add_generation_prompt=True,
            **template.variables,
        )
        tokens = len(wl.tok.encode(text[0]))
        out[PATHS[hz.dialect]] = len(h.body(s)[1]) / tokens
    return out


def check_store(data: Path, sids: dict[str, str]) -> dict:
    """Read Turnstile's records: every call after a session's first must extend the recorded
    tokens (no segment start, and its reused prefix = the previous call's prompt + completion)."""
    from turnstile.store.store import Store

    store = Store(data)
    out = {
        "sessions": 0,
        "calls": 0,
        "later": 0,
        "extended": 0,
        "exact": 0,
        "reasons": collections.Counter(),
    }
    for sid in sorted(sids):
        calls = store.calls(sid)
        if not calls:
            continue
        out["sessions"] += 1
        out["calls"] += len(calls)
        for prev, x in zip(calls, calls[1:], strict=False):
            out["later"] += 1
            if x.segment_reason is None and x.parent_id == prev.id:
                out["extended"] += 1
            else:
                out.setdefault("details", []).append(
                    str(x.info.get("segment_detail") or x.info)[:600]
                )
                out["reasons"][
                    f"{x.segment_reason or 'other parent'} ({sids[sid]}, call {x.seq})"
                ] += 1
            if x.reused_prefix_len == prev.reused_prefix_len + len(prev.prompt_delta) + len(
                prev.completion_ids
            ):
                out["exact"] += 1
    store.close()
    return out


def start_recording(fake_url: str, every: int) -> None:
    req = urllib.request.Request(
        fake_url + "/record", orjson.dumps({"every": every}), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def check_engine(fake_url: str, stores: list[Path], sids: dict[str, str]) -> dict:
    """Turnstile's records against what the fake engine received and sampled: every sampled
    request's prompt (its length and digest) must be the prompt of a recorded call (read as a
    trainer reads it, ``stitch`` per call) whose completion and logprobs are the reply the
    fake answered it with, its loss mask 1 exactly on them."""
    from turnstile.store.store import Store
    from turnstile.store.trajectories import stitch

    with urllib.request.urlopen(fake_url + "/recorded", timeout=60) as r:
        rec = orjson.loads(r.read())
    want = {(x["n"], x["digest"]): x for x in rec["samples"]}
    lengths = {n for n, _ in want}
    found: dict[tuple[int, str], Any] = {}
    for data in stores:
        store = Store(data)
        try:
            for sid in sorted(sids):
                calls = store.calls(sid)
                if not any(c.reused_prefix_len + len(c.prompt_delta) in lengths for c in calls):
                    continue
                for t in stitch(calls, "per_call"):
                    if t.prompt_len in lengths:
                        key = (t.prompt_len, prompt_digest(t.token_ids[: t.prompt_len]))
                        if key in want:
                            found[key] = t
        finally:
            store.close()
    out = {"received": rec["received"], "sampled": len(want), "matched": 0, "problems": []}
    for key, x in want.items():
        t = found.get(key)
        reply = rec["sampled"][x["reply"]]
        if t is None:
            out["problems"].append(f"a {x['n']}-token prompt the engine was sent is not recorded")
            continue
        n = t.prompt_len
        mask = np.asarray(t.loss_mask)
        ok = (
            t.token_ids[n:].tolist() == reply["token_ids"]
            and np.array_equal(
                np.asarray(t.logprobs[n:], dtype=np.float32),
                np.asarray(reply["logprobs"], dtype=np.float32),
            )
            and not mask[:n].any()
            and mask[n:].all()
        )
        if ok:
            out["matched"] += 1
        else:
            out["problems"].append(
                f"session {t.session_id} call {t.call_ids[-1]}: the record is not what the "
                f"engine sampled (reply {x['reply']})"
            )
    return out


PARTS = [  # (part, frame substrings): the first part whose frames a sample holds takes it
    (
        "record/commit: SQLite write (store thread)",
        ["Store.add_call", "Store.write", "store/writes.py", "_Writer"],
    ),
    (
        "record/commit: thread hand-off",
        ["ThreadPoolExecutor.submit", "_worker (concurrent", "call_soon_threadsafe"],
    ),
    (
        "record/commit: record built on the loop",
        ["TokenCall._commit", "TokenCall.record", "token_in/recording.py", "gateway/record.py"],
    ),
    ("session row on first use", ["SessionIndex.ensure", "session_index.py"]),
    ("tokenize the delta", ["LoadedTokenizer.encode", "PromptEncoder", "chat/encoding.py"]),
    ("render the delta (Jinja)", ["Renderer.", "chat/render.py", "chat/template.py", "jinja2"]),
    (
        "history: match + prefix hashes + context",
        [
            "SessionTree",
            "chat/history.py",
            "session_trees.py",
            "prefix_hashes",
            "root_hash",
            "build_prompt",
        ],
    ),
    (
        "engine client: request, response -> token events",
        ["engines/vllm", "engines/http", "vllm_reader", "aiohttp", "wire_ids"],
    ),
    ("detokenize + parse the completion", ["parsing/", "LoadedTokenizer.decode", "detokenize"]),
    (
        "streaming: chunks, events, SSE out",
        [
            "streamed.py",
            "streaming.py",
            "responses/stream.py",
            "EventStream",
            "dialects/messages/",
            "dialects/responses/",
        ],
    ),
    ("request: read body + JSON parse", ["read_json", "Request.body", "Request.stream"]),
    ("request: size limits", ["limits.py"]),
    (
        "request: validation + dialect -> ChatRequest",
        [
            "requests.py",
            "request_messages.py",
            "validation.py",
            "request_fields.py",
            "_request.py",
            "dialects/",
        ],
    ),
    (
        "gateway: admission, sampling, answer",
        [
            "gateway.py",
            "sampling.py",
            "prompting.py",
            "admission.py",
            "server/context.py",
            "contract.py",
        ],
    ),
    (
        "HTTP edge: uvicorn, Starlette, routes, auth, metrics",
        [
            "uvicorn",
            "starlette",
            "httptools",
            "routes_harness",
            "access.py",
            "error_handlers",
            "metrics.py",
            "error_log",
        ],
    ),
]


def fold(raw: Path) -> tuple[int, collections.Counter, collections.Counter, collections.Counter]:
    """py-spy's collapsed stacks -> samples per part, per leaf function, per Turnstile function
    (inclusive)."""
    total, parts, leaf, incl = (
        0,
        collections.Counter(),
        collections.Counter(),
        collections.Counter(),
    )
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        total += k
        frames = stack.split(";")
        if len(frames) > 1 and "LoadedTokenizer.decode" in frames[-1] and "start (" in frames[-2]:
            parts["the prompt's last 16 tokens decoded (Gateway.start)"] += k
            leaf[_fn(frames[-1])] += k
            continue
        for name, keys in PARTS:
            if any(key in f for f in frames for key in keys):
                parts[name] += k
                break
        else:
            loop = any(
                x in frames[-1] for x in ("Runner.run", "asyncio", "base_events", "run_forever")
            )
            parts["event loop (uvloop's C code: sockets, scheduling)" if loop else "other"] += k
        leaf[_fn(frames[-1])] += k
        for f in {_fn(f) for f in frames if "turnstile/" in f}:
            incl[f] += k
    return total, parts, leaf, incl


def _fn(frame: str) -> str:
    name, _, where = frame.partition(" (")
    path = where.split(":")[0]
    for cut in ("site-packages/", "turnstile/"):
        if cut in path:
            path = ("turnstile/" if cut == "turnstile/" else "") + path.split(cut)[-1]
    return f"{name} ({path})"


def print_profile(raw: Path, cpu_ms: float, title: str) -> None:
    total, parts, leaf, incl = fold(raw)
    if not total:
        print("(empty profile)")
        return
    print(f"\n{title}: {total} samples, {cpu_ms:.2f} ms of Turnstile CPU per turn")
    print(
        _report.table(
            ["part of the call", "% of samples", "ms per turn"],
            [[p, n / total * 100, cpu_ms * n / total] for p, n in parts.most_common()],
        )
    )
    print("\ntop functions, own time (leaf frames):")
    print(
        _report.table(
            ["function", "% of samples"], [[f, n / total * 100] for f, n in leaf.most_common(15)]
        )
    )
    print("\ntop Turnstile functions, including what they call:")
    print(
        _report.table(
            ["function", "% of samples"], [[f, n / total * 100] for f, n in incl.most_common(20)]
        )
    )


def start_spy(pid: int, out: Path, gil: bool = False) -> subprocess.Popen | None:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        exe = _machine.bench_venv() / "bin" / "py-spy"
    if not exe.exists():
        return None
    p = subprocess.Popen(
        [
            str(exe),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "250",
            "--nonblocking",
            "-o",
            str(out),
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    return p


# ---------------------------------------------------------------------------------------------
# the run


def summarize(rows: list[dict]) -> dict:
    turns = sum(r["turns"] for r in rows)
    lat = [x for r in rows for x in r["lat"]]
    return {
        "turns": turns,
        "errors": sum(r["errors"] for r in rows),
        "rate": turns / sum(r["wall"] for r in rows),
        "cpu_ms": sum(r["cpu"] for r in rows) / max(1, turns) * 1000,
        "per_core": turns / max(1e-9, sum(r["cpu"] for r in rows)),
        "p50": _report.pct(lat, 50) * 1000,
        "p99": _report.pct(lat, 99) * 1000,
        "ctx": statistics.median([x for r in rows for x in r["ctx"]] or [0]),
    }


async def sweep(args: argparse.Namespace, h: Harness, targets: list[Target], fake_url: str) -> dict:
    import aiohttp

    for t in targets:
        t.http = aiohttp.ClientSession(
            # Idle connections are dropped before the servers' own 5 s keep-alive closes them:
            # a connection reused just as the server closes it is reset (ECONNRESET), which
            # under this machine's contention failed turns of both proxies at 192-384 sessions.
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=900),
        )
    res: dict[str, Any] = {"cells": [], "rss": {}}
    top = max(args.conc)
    plans = [h.wl.plan(i, False, h.mix) for i in range(top)]
    pools = {t.name: [h.session(t.name, p) for p in plans] for t in targets}
    await pace(fake_url, 0.0, 0.0)
    for t in targets:
        rss0 = rss_of(t.server)
        t0 = time.time()
        await warm(h, t, pools[t.name])
        res["rss"][t.name] = {
            "before": rss0,
            "after": rss_of(t.server),
            "sessions": top,
            "tokens": sum(s.context for s in pools[t.name]),
        }
        print(f"  warm-up {t.name}: {top} sessions resumed in {time.time() - t0:.0f} s", flush=True)
    for mode in args.modes:
        if mode == "paced":
            await pace(fake_url, args.prefill_ms, args.decode_ms)
        else:
            await pace(fake_url, 0.0, 0.0)
        for conc in args.conc:
            if mode == "paced":
                each, stagger = args.paced_turns, mean_turn_s(h.wl, args)
            else:
                each, stagger = max(2, -(-args.zero_turns // conc)), 0.0
            rows: dict[str, list[dict]] = {t.name: [] for t in targets}
            order = targets + targets[::-1] if args.rounds > 1 else targets
            for t in order:
                spy_out = args.workdir / f"spy-{mode}-{conc}-{t.name}.txt"
                spy = (
                    start_spy(t.server.pid, spy_out, args.gil)
                    if args.profile_cell == f"{mode}:{conc}"
                    and t.name == "turnstile"
                    and not rows[t.name]
                    else None
                )
                r = await run_cell(h, t, pools[t.name][:conc], each, stagger)
                rows[t.name].append(r)
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(60)
                    res["profile"] = (str(spy_out), r["cpu"] / max(1, r["turns"]) * 1000)
                print(
                    f"  {mode:<5} {conc:>3} sessions {t.name:<9} "
                    f"{r['turns'] / r['wall']:7.1f} turns/s "
                    f"{r['cpu'] / max(1, r['turns']) * 1000:6.2f} ms CPU/turn  "
                    f"p50 {_report.pct(r['lat'], 50) * 1000:7.0f} ms  "
                    f"(engine {r['engine_cpu'] / r['wall']:.2f}, "
                    f"load generator {r['loadgen_cpu'] / r['wall']:.2f} cores)"
                    + (f"  {r['errors']} errors" if r["errors"] else ""),
                    flush=True,
                )
            res["cells"].append(
                {"mode": mode, "conc": conc, **{k: summarize(v) for k, v in rows.items()}}
            )
    for t in targets:
        res["rss"][t.name]["end"] = rss_of(t.server)
    one = [t for t in targets if t.name != "workers"]  # the deep and flat phases: per process
    if args.deep:
        res["deep"] = await deep(args, h, one, fake_url)
    if args.flat:
        res["flat"] = await flat(args, h, one)
    for t in targets:
        await t.http.close()
    return res


async def pace(fake_url: str, prefill: float, decode: float) -> None:
    import urllib.request

    def post() -> None:
        body = orjson.dumps({"prefill_ms_per_1k": prefill, "decode_ms": decode})
        with urllib.request.urlopen(
            urllib.request.Request(fake_url + "/pace", body, method="POST"), timeout=10
        ) as r:
            r.read()

    await asyncio.to_thread(post)


def mean_turn_s(wl: Workload, args: argparse.Namespace) -> float:
    n = statistics.mean(len(r.token_ids) + 1 for r in wl.replies)
    return (n * args.decode_ms + 100 * args.prefill_ms) / 1000


async def deep(args: argparse.Namespace, h: Harness, targets: list[Target], fake_url: str) -> dict:
    """Sessions resumed at >= 100k-token contexts, no engine latency: turns per CPU-second.
    With ``--baseline`` and two rounds the cells run ABBA (the same sessions go on); with
    four, ABBAABBA, and so on."""
    await pace(fake_url, 0.0, 0.0)
    plans = [h.wl.deep_plan(i, args.deep_context) for i in range(args.deep)]
    out: dict[str, Any] = {}
    slots: dict[str, list[Session]] = {}
    rows: dict[str, list[dict]] = {t.name: [] for t in targets}
    order = (
        (targets + targets[::-1]) * max(1, args.rounds // 2)
        if args.baseline and args.rounds > 1
        else targets
    )
    for t in order:
        if t.name not in slots:
            slots[t.name] = [h.session(t.name, p) for p in plans]
            await warm(h, t, slots[t.name])
        spy_out = args.workdir / f"spy-{t.name}-{len(rows[t.name])}.txt"
        spy = (
            start_spy(t.server.pid, spy_out, args.gil)
            if args.profile and t.name == "turnstile" and not rows[t.name]
            else None
        )
        r = await run_cell(h, t, slots[t.name], args.deep_turns, 0.0)
        rows[t.name].append(r)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
            out["profile"] = str(spy_out)
        x = summarize([r])
        print(
            f"  deep  {args.deep:>3} sessions {t.name:<9} {x['cpu_ms']:.2f} ms CPU/turn, "
            f"ctx median {x['ctx']:.0f}",
            flush=True,
        )
    for name, rs in rows.items():
        out[name] = summarize(rs)
    return out


async def flat(args: argparse.Namespace, h: Harness, targets: list[Target]) -> list[dict]:
    """One 200-turn session from turn 0, relay and Turnstile turn by turn (no engine latency):
    CPU of each proxy per turn."""
    plan = Plan(2_000_000, 0, False, args.flat, 190_000 if args.flat >= 150 else 60_000, 0)
    sessions = {t.name: h.session(t.name, plan) for t in targets}
    rows = []
    for turn in range(args.flat):
        row: dict[str, Any] = {"turn": turn + 1}
        for t in targets:
            cpu0 = t.server.cpu()
            x = await h.step(t, sessions[t.name])
            row[t.name] = (t.server.cpu() - cpu0) * 1000
            row["ctx"] = x.context
        rows.append(row)
    return rows


def report(args: argparse.Namespace, res: dict, check: dict) -> None:
    rows = []
    names = {"turnstile": "1 process", "workers": f"{args.workers} workers", "baseline": "baseline"}
    for cell, name in [(c, k) for c in res["cells"] for k in names if k in c]:
        r, t = cell["relay"], cell[name]
        rows.append(
            [
                cell["mode"],
                cell["conc"],
                names[name],
                t["turns"],
                r["errors"] + t["errors"],
                t["ctx"],
                r["rate"],
                t["rate"],
                t["rate"] / r["rate"],
                r["cpu_ms"],
                t["cpu_ms"],
                t["per_core"],
                t["p50"] - r["p50"],
                t["p99"] - r["p99"],
                r["p50"],
                r["p99"],
            ]
        )
    print(
        _report.table(
            [
                "engine",
                "sessions",
                "Turnstile",
                "turns",
                "errors",
                "context median",
                "relay turns/s",
                "Turnstile turns/s",
                "Turnstile / relay",
                "relay CPU ms/turn",
                "Turnstile CPU ms/turn",
                "Turnstile turns/CPU-s",
                "added p50 ms",
                "added p99 ms",
                "relay p50 ms",
                "relay p99 ms",
            ],
            rows,
            "\n### Throughput, CPU and added latency "
            "(each cell: the same sessions and turns for both)\n",
        )
    )
    mem = []
    for name, m in res["rss"].items():
        grow = m["after"] - m["before"]
        mem.append(
            [
                name,
                m["sessions"],
                m["tokens"],
                m["before"] / 2**20,
                m["after"] / 2**20,
                m["end"] / 2**20,
                grow / m["sessions"] / 2**20,
                grow / max(1, m["tokens"]),
            ]
        )
    print(
        _report.table(
            [
                "proxy",
                "sessions",
                "context tokens (all)",
                "RSS before MiB",
                "RSS after warm-up MiB",
                "RSS at end MiB",
                "MiB / session",
                "B / context token",
            ],
            mem,
            "\n### Memory: RSS growth over the warm-up (every session's history taken in)\n",
        )
    )
    if "deep" in res:
        d = res["deep"]
        r, t = d["relay"], d["turnstile"]
        print(
            _report.table(
                [
                    "proxy",
                    "turns",
                    "errors",
                    "context median",
                    "CPU ms/turn",
                    "turns / CPU-s",
                    "turns/s (wall)",
                    "p50 ms",
                ],
                [
                    [
                        k,
                        x["turns"],
                        x["errors"],
                        x["ctx"],
                        x["cpu_ms"],
                        x["per_core"],
                        x["rate"],
                        x["p50"],
                    ]
                    for k, x in d.items()
                    if k in ("relay", "turnstile", "baseline")
                ],
                f"\n### At >= {args.deep_context // 1000}k-token contexts, no engine latency "
                f"({args.deep} sessions)\n",
            )
        )
        print(
            f"Turnstile turns per CPU-second at >= {args.deep_context // 1000}k contexts: "
            f"{t['per_core']:.0f} (target >= 150); Turnstile / relay CPU "
            f"{t['cpu_ms'] / r['cpu_ms']:.2f}"
            + (
                f"; Turnstile / baseline CPU {t['cpu_ms'] / d['baseline']['cpu_ms']:.3f}"
                if "baseline" in d
                else ""
            )
        )
    if "flat" in res:
        fr = res["flat"]
        k = max(1, len(fr) // 8)
        out = []
        ratios = []
        for i in range(0, len(fr), k):
            w = fr[i : i + k]
            rl = statistics.median(x["relay"] for x in w)
            ts = statistics.median(x["turnstile"] for x in w)
            ratios.append(ts / rl)
            out.append([f"{w[0]['turn']}-{w[-1]['turn']}", w[-1]["ctx"], rl, ts, ts / rl])
        print(
            _report.table(
                [
                    "turns",
                    "context tokens (last)",
                    "relay CPU ms (median)",
                    "Turnstile CPU ms (median)",
                    "Turnstile / relay",
                ],
                out,
                f"\n### One {len(fr)}-turn session, turn by turn (no engine latency)\n",
            )
        )
        print(
            f"Turnstile / relay over the session: {min(ratios):.2f}-{max(ratios):.2f} "
            f"(last / first window {ratios[-1] / ratios[0]:.2f}; target: flat)"
        )
    print(
        f"\nchained: {check['extended']}/{check['later']} later calls extended the recorded tokens "
        f"({check['exact']} with reused prefix = previous prompt + completion), "
        f"{check['sessions']} sessions, {check['calls']} calls recorded"
        + (f"; segment starts: {dict(check['reasons'])}" if check["reasons"] else "")
    )
    for d in check.get("details", [])[:3]:
        print(f"  segment detail: {d}")
    wc = res.get("workers_check")
    if wc:
        print(
            f"chained ({args.workers} workers): {wc['extended']}/{wc['later']} later calls "
            f"extended the recorded tokens, {wc['sessions']} sessions, {wc['calls']} calls"
            + (f"; segment starts: {dict(wc['reasons'])}" if wc["reasons"] else "")
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts (the smoke test)")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--conc", default=None, help="concurrent sessions (32,96,192,384)")
    p.add_argument("--modes", default="paced,zero")
    p.add_argument("--prefill-ms", type=float, default=1.0, help="engine ms per 1k prompt tokens")
    p.add_argument("--decode-ms", type=float, default=15.0, help="engine ms per sampled token")
    p.add_argument("--chunk", type=int, default=16, help="sampled tokens per streamed event")
    p.add_argument("--paced-turns", type=int, default=None, help="turns per session per paced cell")
    p.add_argument("--zero-turns", type=int, default=None, help="turns per zero-latency cell")
    p.add_argument("--rounds", type=int, default=2, help="2: relay, Turnstile, Turnstile, relay")
    p.add_argument("--deep", type=int, default=None, help="sessions of the >=100k phase (0: skip)")
    p.add_argument("--deep-context", type=int, default=100_000)
    p.add_argument("--deep-turns", type=int, default=None)
    p.add_argument(
        "--flat", type=int, default=None, help="turns of the one-session phase (0: skip)"
    )
    p.add_argument("--profile", action="store_true", help="py-spy on Turnstile in the deep phase")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="also run `turnstile serve --workers N` (the CLI, sessions at their base URLs) in "
        "the sweep's cells, beside the one-process Turnstile",
    )
    p.add_argument(
        "--workers-cpus",
        default="0,1",
        help="the cores --workers' processes may run on (taskset's list; default 0,1)",
    )
    p.add_argument(
        "--engine-cpu",
        type=int,
        help="pin the fake engine to this core (default: unpinned, sharing the proxies' core)",
    )
    p.add_argument(
        "--profile-cell",
        metavar="MODE:CONC",
        help="py-spy on Turnstile's first run of one sweep cell (e.g. paced:384)",
    )
    p.add_argument(
        "--gil",
        action="store_true",
        help="py-spy samples only the thread holding the GIL (no waits for it, no fsyncs)",
    )
    p.add_argument("--fold", type=Path, help="fold a py-spy raw profile and exit")
    p.add_argument("--cpu-ms", type=float, default=1.0, help="with --fold: CPU ms per call")
    p.add_argument(
        "--baseline",
        metavar="SRC",
        help="also run the turnstile package from SRC (another checkout) in the deep phase",
    )
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--corrupt-record",
        action="store_true",
        help="a negative control: Turnstile's recorded logprobs are zeroed before the check, "
        "which must fail the run",
    )
    p.add_argument("--serve-fake", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fake:
        import uvicorn

        app = fake_app(json.loads(args.serve_fake.read_text()))
        # Connections stay open between turns (uvicorn closes idle ones after 5 s, and a
        # reconnect to a fake starved by the machine's other tenants can exceed Turnstile's
        # 5 s connect timeout: errors a real engine under no such load would not give).
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
            loop="uvloop",
            http="httptools",
            access_log=False,
            backlog=4096,
            timeout_keep_alive=900,
        )
        return
    if args.fold:
        print_profile(args.fold, args.cpu_ms, "py-spy profile")
        return
    q = args.quick
    args.conc = [int(x) for x in (args.conc or ("4,8" if q else "32,96,192,384")).split(",")]
    args.modes = [m for m in args.modes.split(",") if m]  # "": the deep / flat phases only
    args.paced_turns = args.paced_turns or (2 if q else 4)
    args.zero_turns = args.zero_turns or (8 if q else 400)
    args.deep = args.deep if args.deep is not None else (2 if q else 32)
    args.deep_turns = args.deep_turns or (2 if q else 8)
    args.flat = args.flat if args.flat is not None else (8 if q else 200)
    if q:
        args.decode_ms, args.prefill_ms, args.rounds = (
            min(args.decode_ms, 1.0),
            min(args.prefill_ms, 0.2),
            1,
        )
    _machine.pin(LOADGEN_CPU)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from turnstile.chat.tokenizer import load_tokenizer

    t_start = time.time()
    print("# Coding-agent sessions: Turnstile vs a plain relay, one fake engine")
    print(f"machine: {_machine.machine()}")
    tok = load_tokenizer(str(_workload.tiny_qwen2()))
    wl = Workload(args.seed, tok, (2_500, 3_000) if q else (25_000, 30_000))
    mix = (0.6, 0.2, 0.2)
    h = Harness(wl, f"a{args.seed}-{int(time.time()) % 100000}", mix)
    bpt = calibrate(wl)
    reps = [len(r.token_ids) + 1 for r in wl.replies]
    print(
        f"workload (seed {args.seed}): harnesses "
        + ", ".join(
            f"{x.dialect} ({x.system_tokens} system + {x.tools_tokens} tool-schema tokens, "
            f"{len(x.tools)} tools)"
            for x in wl.harnesses
        )
        + "; sessions 60/20/20% chat/responses/messages, half streaming, 50-200 turns, "
        "tool results 0.5-5k tokens; "
        f"{len(wl.replies)} replies of {min(reps)}-{max(reps)} tokens with 1-3 calls"
    )
    print(
        f"engine: prefill {args.prefill_ms:g} ms per 1k prompt tokens + decode "
        f"{args.decode_ms:g} ms per token "
        f"(paced) or none (zero), {args.chunk} tokens per streamed event; relay prompt estimate "
        + ", ".join(f"{k} {v:.2f} B/token" for k, v in bpt.items())
    )
    print(
        f"cells: sessions {args.conc}, modes {args.modes}, rounds "
        f"{'ABBA' if args.rounds > 1 else 'AB'}; proxies on core {PROXY_CPU}, load generator "
        f"on core {LOADGEN_CPU}, fake engine "
        + ("unpinned" if args.engine_cpu is None else f"on core {args.engine_cpu}")
    )
    spec = {
        "chunk": args.chunk,
        "bytes_per_token": bpt,
        "replies": [
            {"token_ids": [*r.token_ids, _workload.IM_END], "thought": r.thought, "calls": r.calls}
            for r in wl.replies
        ],
    }
    with _machine.workdir("agents") as wd:
        args.workdir = wd
        (wd / "spec.json").write_text(json.dumps(spec))
        fake, fake_url = start_fake(wd / "spec.json", wd / "fake.log", args.engine_cpu)
        h.fake = fake
        servers = [fake]
        try:
            relay, relay_url = _servers.start_relay(
                "relay-aiohttp", fake_url, PROXY_CPU, wd / "relay.log"
            )
            servers.append(relay)
            ts, ts_url = _servers.start_turnstile(
                fake_url, wd / "data", PROXY_CPU, wd / "turnstile.log"
            )
            servers.append(ts)
            if args.baseline:
                base, base_url = _servers.start_turnstile(
                    fake_url, wd / "data-base", PROXY_CPU, wd / "baseline.log", args.baseline
                )
                servers.append(base)
            targets = [
                Target("relay", relay_url, relay, {"content-type": "application/json"}),
                Target(
                    "turnstile",
                    ts_url,
                    ts,
                    {
                        "content-type": "application/json",
                        "authorization": f"Bearer {_servers.TOKEN}",
                        "anthropic-version": "2023-06-01",
                    },
                ),
            ]
            if args.baseline:
                targets.append(Target("baseline", base_url, base, targets[1].headers))
            if args.workers:
                w, w_url = start_workers(
                    args.workers, fake_url, wd / "data-workers", args.workers_cpus,
                    wd / "workers.log",
                )  # fmt: skip
                servers.append(w)
                targets.append(Target("workers", w_url, Workers(w), targets[1].headers, bases={}))
            start_recording(fake_url, 1 if q else 16)  # the servers' start-up probes left out
            res = asyncio.run(sweep(args, h, targets, fake_url))
            ts.stop()
            stores = [wd / "data"]
            if args.corrupt_record:
                _records.corrupt(wd / "data")
            check = check_store(wd / "data", h.sids)
            if args.workers:
                w.stop()
                res["workers_check"] = check_store(wd / "data-workers", h.sids)
                stores.append(wd / "data-workers")
            if args.baseline:
                base.stop()
                stores.append(wd / "data-base")
            engine_check = check_engine(fake_url, stores, h.sids)
        finally:
            for s in reversed(servers):
                s.stop()
        print(
            f"\nrun took {time.time() - t_start:.0f} s; load average now {os.getloadavg()[0]:.2f}"
        )
        if h.errors:
            print(f"{len(h.errors)} failed turns, e.g.:\n  " + "\n  ".join(h.errors[:5]))
        report(args, res, check)
        if "profile" in res:
            raw, cpu_ms = res["profile"]
            print_profile(Path(raw), cpu_ms, f"py-spy on Turnstile, {args.profile_cell} sessions")
            keep = Path(os.environ.get("AGENT_PROFILE_OUT", "/tmp/agent_sessions_spy.txt"))
            keep.write_bytes(Path(raw).read_bytes())
        if "deep" in res and "profile" in res["deep"]:
            print_profile(
                Path(res["deep"]["profile"]),
                res["deep"]["turnstile"]["cpu_ms"],
                f"py-spy on Turnstile, >= {args.deep_context // 1000}k contexts",
            )
            keep = Path(os.environ.get("AGENT_PROFILE_OUT", "/tmp/agent_sessions_spy.txt"))
            keep.write_bytes(Path(res["deep"]["profile"]).read_bytes())
        if args.json:
            res.pop("flat", None)
            for cell in res["cells"]:
                for k in ("relay", "turnstile"):
                    cell[k] = {a: b for a, b in cell[k].items()}
            args.json.write_text(
                json.dumps(
                    {
                        "cells": res["cells"],
                        "rss": res["rss"],
                        "check": {**check, "reasons": dict(check["reasons"])},
                    },
                    indent=1,
                    default=str,
                )
            )
    ec = engine_check
    print(
        f"records checked against the engine's own account: {ec['matched']}/{ec['sampled']} "
        f"distinct prompts sampled from the engine's {ec['received']} requests, recorded as "
        "sent and sampled"
    )
    if ec["problems"] or ec["sampled"] == 0:
        print("FAILED: records differ from what the engine received and sampled:")
        print("  " + "\n  ".join(ec["problems"][:10] or ["nothing was sampled"]))
        sys.exit(1)
    wc = res.get("workers_check")
    if wc and (wc["extended"] < wc["later"] or wc["exact"] < wc["later"]):
        print("FAILED: some calls through the workers did not extend the recorded tokens")
        sys.exit(1)
    if check["extended"] < check["later"] or check["later"] == 0:
        print("FAILED: some calls did not extend the recorded tokens")
        sys.exit(1)
    if check["exact"] < check["later"]:
        print("FAILED: some calls' reused prefix is not the previous prompt + completion")
        sys.exit(1)
    if h.errors:
        print(f"FAILED: {len(h.errors)} turns failed (see above)")
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
