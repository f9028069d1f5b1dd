"""Passthrough capture: forward Chat Completions to an engine that renders them itself, and
record the token IDs it reports.

For models Turnstile cannot render (or as a cross-check of its own rendering), the request
goes to the engine's ``/v1/chat/completions`` as the harness sent it, plus only what is needed
to get the tokens back: vLLM ``return_token_ids`` (``prompt_token_ids`` on the response, or on
the first chunk when streaming; per-choice ``token_ids``, delta IDs per chunk),
``return_weight_versions`` (vLLM 0.33+) and ``logprobs``; SGLang ``return_input_ids_in_sglext`` /
``return_output_ids_in_sglext`` (``sglext`` on the response, or on a final ``choices: []``
chunk) and ``logprobs``. What the harness did not ask for is taken out of the response again,
so the harness sees the engine's own answer.

The engine renders every prompt, so nothing prevents retokenization drift: it is *detected*.
A call whose prompt IDs start with a recorded call's prompt + completion is that call's child
(the rest is its prompt delta). A call that extends no recorded call starts a new segment, and
the record says why and exactly where it left the closest recorded conversation:

- ``first_call``: the session's first call;
- ``drift``: the request's messages continue a recorded call (its request + the reply we
  returned, compared as the default mode compares them), but the engine's prompt IDs do not
  extend that call's prompt + completion: the engine re-tokenized or re-rendered history;
- ``history_diverged``: the messages continue no recorded call (edited or compacted history,
  or assistant turns that were not sampled here);
- ``new_conversation``: no assistant message at all (a new conversation, a subagent, a retry
  of a first call).

Every segment root after the first carries ``info.drift``: the token index where the prompt
leaves the closest recorded call, which call's prompt delta or completion holds that token,
and the recorded and received token IDs (and their text, from the engine's detokenizer) around
it. ``segment_detail`` says the same in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ..chat.history import prefix_hashes, root_hash
from ..engines.base import (
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    SCALED_LOGPROBS,
    EngineError,
    SamplingParams,
    logprob_unfitness,
)
from ..engines.http import HTTPEngine, error_message, sse_data, version_tuple
from ..store.sqlite import CallRecord, Store, new_id
from .control import PolicyControl
from .errors import APIError
from .lineage import (
    LineageIndex,
    Node,
    common_prefix,
    describe,
    divergence,
    extends,
    new_node,
)
from .requests import ChatRequest

CHAT = "/v1/chat/completions"
DIALECTS = ("vllm", "sglang")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens",
                 "seed", "stop", "stop_token_ids", "logit_bias", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "n", "logprobs", "top_logprobs",
                 "tool_choice", "response_format", "ignore_eos", "min_tokens")
POLICY_ABORT = "The call was aborted for a policy (weight) update; retry it."


class EngineHTTPError(EngineError):
    """The engine answered with an error: its status and OpenAI-shaped body, to relay."""

    def __init__(self, message: str, status: int, engine_status: int, error: dict):
        super().__init__(message, status)
        self.engine_status = engine_status
        self.error = error


def relay_status(engine_status: int) -> int:
    """The harness's status for an engine error. The body went to the engine unchanged, so a
    4xx (bad field, unknown model, context exceeded, rate limit) is the harness's own; 503
    stays retryable; anything else is the upstream failing (502)."""
    if 400 <= engine_status < 500 and engine_status != 408:
        return engine_status
    return 503 if engine_status == 503 else 502


def _api_error(exc: EngineError) -> APIError:
    if isinstance(exc, EngineHTTPError) and exc.status < 500:
        e = exc.error
        return APIError(exc.status, str(e.get("message") or exc), e.get("param"),
                        e.get("code") if isinstance(e.get("code"), str) else None,
                        e.get("type") if isinstance(e.get("type"), str) else None)
    return APIError(exc.status, str(exc),
                    type_="engine_unavailable" if exc.status == 503 else "engine_error")


class PassthroughEngine(HTTPEngine):
    """One OpenAI-compatible engine that renders prompts itself and reports token IDs."""

    name = "passthrough"

    def __init__(self, url: str, dialect: str = "vllm", *, logprobs_mode: str | None = None,
                 original_logprobs: bool = False, timeout: float = 600.0):
        """``dialect``: how to ask for token IDs ("vllm" or "sglang"). ``logprobs_mode``: vLLM's
        ``--logprobs-mode`` when known; ``original_logprobs``: SGLang returns logprobs before
        temperature scaling (``SGLANG_RETURN_ORIGINAL_LOGPROB``)."""
        super().__init__(url, timeout)
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, not {dialect!r}")
        self.dialect = dialect
        self.label = "vLLM" if dialect == "vllm" else "SGLang"
        self.name = f"passthrough-{dialect}"
        self.model: str | None = None
        self.version: str | None = None
        self.logprobs_mode = logprobs_mode
        self.logprobs_mode_source = "declared" if logprobs_mode else "assumed"
        if dialect == "sglang":
            self.logprobs_mode = RAW_LOGPROBS if original_logprobs else SCALED_LOGPROBS
            self.logprobs_mode_source = "declared" if original_logprobs else "default"

    async def refresh(self) -> None:
        """Served model and context length (``/v1/models``); vLLM's version and, in dev mode,
        its ``--logprobs-mode`` (``/server_info``)."""
        models = await self._get_json("/v1/models")
        if not isinstance(models, dict) or not models.get("data"):
            raise EngineError(f"{self.label} at {self.url} has no /v1/models answer yet", 503)
        card = models["data"][0]
        self.model = card.get("id")
        self.context_length = int(card.get("max_model_len") or 0)
        if self.dialect != "vllm":
            return
        ver = await self._get_json("/version")
        if isinstance(ver, dict) and ver.get("version"):
            self.version = str(ver["version"])
        if self.logprobs_mode_source != "declared":
            info = await self._get_json("/server_info?config_format=json")
            config = info.get("vllm_config") if isinstance(info, dict) else None
            mode = ((config.get("model_config") or {}).get("logprobs_mode")
                    if isinstance(config, dict) else None)
            if isinstance(mode, str):
                self.logprobs_mode, self.logprobs_mode_source = mode, "server"

    @property
    def logprob_kind(self) -> str:
        return self.logprobs_mode or RAW_LOGPROBS

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        if params is None and self.logprobs_mode_source == "assumed":
            return ("passthrough: vLLM's --logprobs-mode could not be read (GET /server_info "
                    "needs VLLM_SERVER_DEV_MODE=1); assuming raw_logprobs, which are not "
                    "behaviour-policy logprobs once temperature, top_p/top_k or logit_bias "
                    "change the sampling distribution. For RL start vLLM with --logprobs-mode "
                    "processed_logprobs and pass --engine-logprobs-mode.")
        return logprob_unfitness(self.logprob_kind, params)

    async def pause(self, mode: str) -> str:
        """Forward a weight-update pause to the engine's own route, where it has one."""
        if self.dialect == "vllm":
            return await self._post_admin(f"/pause?mode={'abort' if mode == 'abort' else 'wait'}")
        body = {"mode": "abort" if mode == "abort" else "in_place"}
        return await self._post_admin("/pause_generation", body)

    async def resume(self) -> str:
        if self.dialect == "vllm":
            return await self._post_admin("/resume")
        return await self._post_admin("/continue_generation", {})

    async def open_chat(self, body: dict) -> aiohttp.ClientResponse:
        """POST the chat request; the open response on 200 (the caller closes it), else the
        engine's error as :class:`EngineHTTPError`, or 503 when it cannot be reached."""
        try:
            resp = await self.session.post(self.url + CHAT, data=orjson.dumps(body),
                                           headers={"content-type": "application/json"})
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineError(f"{self.label} at {self.url} is unreachable: {exc}", 503) from exc
        if resp.status == 200:
            return resp
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            raw = b""
        finally:
            resp.release()
        raise self.http_error(resp.status, raw)

    def http_error(self, status: int, raw: bytes) -> EngineHTTPError:
        err: dict = {}
        try:
            body = orjson.loads(raw)
            if isinstance(body, dict):
                e = body.get("error")
                err = e if isinstance(e, dict) else body
        except orjson.JSONDecodeError:
            pass
        return EngineHTTPError(f"{self.label} {CHAT} answered {status}: {error_message(raw)}",
                               relay_status(status), status, err)

    async def detokenize(self, ids: list[int]) -> str | None:
        """The engine's text for ``ids`` (best effort, for drift reports): vLLM
        ``/detokenize``, SGLang ``/v1/detokenize``."""
        path = "/detokenize" if self.dialect == "vllm" else "/v1/detokenize"
        body: dict = {"tokens": list(ids)}
        if self.model:
            body["model"] = self.model
        try:
            status, raw = await self._request("POST", path, body, timeout=5)
            out = orjson.loads(raw) if status == 200 else None
        except (EngineError, orjson.JSONDecodeError):
            return None
        if isinstance(out, dict):
            text = out.get("prompt", out.get("text"))
            return text if isinstance(text, str) else None
        return None


@dataclass
class _Link:
    """Where a prompt joins the session's tree."""

    prompt: array
    hashes: list[bytes]
    parent: Node | None = None
    reason: str | None = None
    detail: str | None = None
    drift: dict | None = None

    @property
    def delta(self) -> array:
        return self.prompt[self.parent.full_len:] if self.parent else self.prompt


# What the engine returned, per choice.


@dataclass
class _Choice:
    index: int
    ids: list[int] | None = None
    logprobs: list[dict] | None = None
    finish_reason: str | None = None
    stop: Any = None  # vLLM stop_reason / SGLang matched_stop
    weight_versions: list[dict] | None = None
    message: dict | None = None
    # streamed message parts
    role: str = "assistant"
    text: dict[str, list[str]] = field(default_factory=dict)  # content / reasoning / refusal
    tool_calls: dict[int, dict] = field(default_factory=dict)

    def add_delta(self, delta: dict) -> None:
        if delta.get("role"):
            self.role = delta["role"]
        for key in ("content", "reasoning", "reasoning_content", "refusal"):
            if isinstance(delta.get(key), str):
                self.text.setdefault(key, []).append(delta[key])
        for tc in delta.get("tool_calls") or ():
            cur = self.tool_calls.setdefault(int(tc.get("index", 0)), {
                "id": None, "type": "function", "function": {"name": None, "arguments": ""}})
            if tc.get("id"):
                cur["id"] = tc["id"]
            if tc.get("type"):
                cur["type"] = tc["type"]
            fn = tc.get("function") or {}
            if fn.get("name"):
                cur["function"]["name"] = fn["name"]
            if isinstance(fn.get("arguments"), str):
                cur["function"]["arguments"] += fn["arguments"]

    def assembled(self) -> dict:
        """The streamed assistant message, whole (for the record and message matching)."""
        if self.message is not None:
            return self.message
        msg: dict = {"role": self.role, "content": "".join(self.text.get("content", [])) or None}
        for key in ("reasoning", "reasoning_content", "refusal"):
            if key in self.text:
                msg[key] = "".join(self.text[key])
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg


@dataclass
class _Capture:
    """The prompt and completions an engine reported, from a response or from stream chunks."""

    dialect: str
    prompt_ids: list[int] | None = None
    choices: dict[int, _Choice] = field(default_factory=dict)
    usage: dict | None = None
    engine_id: str | None = None
    weight_version: Any = None  # SGLang metadata.weight_version (the whole response)
    weight_versions: list[dict] | None = None

    def choice(self, index: int) -> _Choice:
        return self.choices.setdefault(index, _Choice(index))

    def feed_response(self, resp: dict) -> None:
        self.engine_id = resp.get("id")
        self.usage = resp.get("usage")
        if self.dialect == "vllm":
            self.prompt_ids = resp.get("prompt_token_ids")
        else:
            ext = resp.get("sglext") or {}
            self.prompt_ids = ext.get("input_ids")
            meta = resp.get("metadata") or {}
            self.weight_version = meta.get("weight_version")
            self.weight_versions = meta.get("weight_versions") or None
        for ch in resp.get("choices") or ():
            c = self.choice(int(ch.get("index", 0)))
            c.message = ch.get("message")
            c.logprobs = (ch.get("logprobs") or {}).get("content")
            c.finish_reason = ch.get("finish_reason")
            c.stop = ch.get("stop_reason" if self.dialect == "vllm" else "matched_stop")
            c.weight_versions = ch.get("weight_versions")
            if self.dialect == "vllm":
                c.ids = ch.get("token_ids")
        if self.dialect == "sglang":
            outs = (resp.get("sglext") or {}).get("output_ids")
            for i, ids in enumerate(outs or ()):
                self.choice(i).ids = ids

    def feed_chunk(self, chunk: dict) -> None:
        self.engine_id = self.engine_id or chunk.get("id")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if self.dialect == "vllm" and chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        ext = chunk.get("sglext")
        if self.dialect == "sglang" and isinstance(ext, dict):
            if ext.get("input_ids") is not None:
                self.prompt_ids = ext["input_ids"]
            for i, ids in enumerate(ext.get("output_ids") or ()):
                self.choice(i).ids = ids
        for ch in chunk.get("choices") or ():
            c = self.choice(int(ch.get("index", 0)))
            c.add_delta(ch.get("delta") or {})
            lp = (ch.get("logprobs") or {}).get("content")
            if lp:
                c.logprobs = (c.logprobs or []) + lp
            if self.dialect == "vllm" and ch.get("token_ids"):
                c.ids = (c.ids or []) + list(ch["token_ids"])
            if ch.get("finish_reason") is not None:
                c.finish_reason = ch["finish_reason"]
            for key in ("stop_reason", "matched_stop"):
                if ch.get(key) is not None:
                    c.stop = ch[key]
            if ch.get("weight_versions"):
                c.weight_versions = ch["weight_versions"]

    def missing(self) -> str | None:
        """Why the capture is unusable, or None."""
        how = ("return_token_ids (vLLM 0.10 or later)" if self.dialect == "vllm" else
               "return_input_ids_in_sglext / return_output_ids_in_sglext (a recent SGLang)")
        if self.prompt_ids is None:
            return f"the engine returned no prompt token IDs: passthrough capture needs {how}"
        lost = [c.index for c in self.choices.values() if c.ids is None]
        if lost or not self.choices:
            return (f"the engine returned no completion token IDs (choice {lost or [0]}): "
                    f"passthrough capture needs {how}")
        return None


def _logprob_values(c: _Choice, dialect: str) -> tuple[list[float], str | None]:
    """One logprob per completion token, aligned with the IDs (NaN where unknown), and a note
    when the engine's list could not be aligned."""
    ids = c.ids or []
    entries = c.logprobs
    if not entries:
        return [math.nan] * len(ids), None
    if len(entries) == len(ids) - 1 and dialect == "sglang" and c.finish_reason in (
            "stop", "tool_calls") and c.stop == ids[-1]:
        # SGLang streams a token's logprob with that step's text; the stop token has none.
        entries = [*entries, {}]
    if len(entries) != len(ids):
        return [math.nan] * len(ids), (f"the engine returned {len(entries)} logprob entries for "
                                       f"{len(ids)} tokens: not aligned, recorded as unknown")
    out = []
    for i, (tid, e) in enumerate(zip(ids, entries, strict=True)):
        named = e.get("token_id")
        token = e.get("token")
        if named is None and isinstance(token, str) and token.startswith("token_id:"):
            named = token[9:]
        if named is not None and str(named) != str(tid):
            return [math.nan] * len(ids), (f"logprob entry {i} is for token {named}, not the "
                                           f"sampled {tid}: recorded as unknown")
        v = e.get("logprob")
        out.append(math.nan if v is None else float(v))
    return out, None


def _token_versions(spans: list[dict] | None, n: int) -> list | None:
    if not spans:
        return None
    out: list = [None] * n
    for s in spans:
        for i in range(max(0, int(s["start"])), min(n, int(s["end"]))):
            out[i] = s["version"]
    return out


# Taking out of the response what the harness did not ask for.


@dataclass
class _Asked:
    """What the harness itself asked the engine for (kept in the response)."""

    prompt_ids: bool
    output_ids: bool
    logprobs: bool
    weight_versions: bool


_EMPTY = (None, "", [], {})


def _strip_choice(ch: dict, asked: _Asked, dialect: str, stream: bool) -> None:
    if not asked.output_ids and dialect == "vllm" and "token_ids" in ch:
        ch["token_ids"] = None
    if not asked.logprobs and "logprobs" in ch:
        ch["logprobs"] = None
    if not asked.weight_versions and "weight_versions" in ch:
        if stream:
            del ch["weight_versions"]  # only the final chunk carries it, when asked
        else:
            ch["weight_versions"] = None


def _strip_sglext(holder: dict, asked: _Asked) -> None:
    ext = holder.get("sglext")
    if not isinstance(ext, dict):
        return
    if not asked.prompt_ids:
        ext.pop("input_ids", None)
    if not asked.output_ids:
        ext.pop("output_ids", None)
    if all(v in _EMPTY for v in ext.values()):
        holder["sglext"] = None


def strip_response(resp: dict, asked: _Asked, dialect: str) -> dict:
    """The engine's response as it would be without Turnstile's additions (fields the engine
    always writes become null again, as they are when not requested)."""
    if dialect == "vllm" and not asked.prompt_ids and "prompt_token_ids" in resp:
        resp["prompt_token_ids"] = None
    if dialect == "sglang":
        _strip_sglext(resp, asked)
    for ch in resp.get("choices") or ():
        _strip_choice(ch, asked, dialect, stream=False)
    return resp


def strip_chunk(chunk: dict, asked: _Asked, dialect: str) -> dict | None:
    """A stream chunk without Turnstile's additions, or None for a chunk the engine sent only
    because of them (the ID chunk; a token chunk whose text is empty)."""
    if dialect == "vllm" and not asked.prompt_ids:
        chunk.pop("prompt_token_ids", None)
    had_ext = isinstance(chunk.get("sglext"), dict)
    if dialect == "sglang":
        _strip_sglext(chunk, asked)
    choices = chunk.get("choices")
    if not choices:
        if had_ext and chunk.get("sglext") is None and not chunk.get("usage"):
            return None
        return chunk
    for ch in choices:
        _strip_choice(ch, asked, dialect, stream=True)
    if not asked.output_ids and not asked.logprobs:
        kept = [ch for ch in choices if ch.get("finish_reason") is not None or
                any(v not in _EMPTY for v in (ch.get("delta") or {}).values())]
        if not kept and not chunk.get("usage"):
            return None
        chunk["choices"] = kept
    return chunk


# The gateway.


def _loads(raw: bytes, what: str) -> dict:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EngineError(f"the engine sent invalid JSON in {what}: {raw[:200]!r}", 502) \
            from exc
    if not isinstance(obj, dict):
        raise EngineError(f"the engine sent {type(obj).__name__} in {what}, not an object", 502)
    return obj


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"Invalid '{param}': {message}", param, code="invalid_value")


class PassthroughGateway:
    """The gateway interface ``server.app`` drives (``complete``, ``stream``, ``forget``,
    ``parse_request``, ``store``, ``engine``, ``control``, ``model_name``), in capture mode."""

    # The engine renders; whether its template reads ``tools`` is not Turnstile's to know.
    template_ignores_tools = False

    def __init__(self, engine: Any, store: Store, model_name: str, dialect: str = "vllm"):
        """``engine``: a :class:`PassthroughEngine`, or a replica pool of them."""
        self.engine = engine
        self.primary: PassthroughEngine = (engine.replicas[0] if hasattr(engine, "replicas")
                                           else engine)
        self.store = store
        self.model_name = model_name
        self.dialect = dialect
        self.control = PolicyControl()
        self._index: dict[str, LineageIndex] = {}

    # sessions

    def forget(self, session_id: str) -> None:
        self._index.pop(session_id, None)
        if hasattr(self.engine, "forget"):
            self.engine.forget(session_id)

    def index(self, session_id: str) -> LineageIndex:
        """The session's token index, rebuilt from the store the first time after a restart."""
        idx = self._index.get(session_id)
        if idx is None:
            idx = LineageIndex.from_calls(self.store.calls(session_id))
            self._index[session_id] = idx
        return idx

    # the request

    def parse_request(self, body: Any) -> ChatRequest:
        """Only what Turnstile itself relies on is checked; every other field is the engine's
        to accept or refuse (its 4xx reaches the harness as is)."""
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object.", None,
                           code="invalid_request_body")
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad("messages", "expected a non-empty list of messages.")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages[{i}].role", "expected a message object with a role.")
        for key in ("stream", "logprobs", "return_token_ids"):
            if body.get(key) is not None and not isinstance(body[key], bool):
                raise _bad(key, "expected a boolean.")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise _bad("n", "expected an integer >= 1.")
        opts = body.get("stream_options")
        kwargs = body.get("chat_template_kwargs")
        tools = body.get("tools")
        return ChatRequest(
            messages=msgs, model=body.get("model") if isinstance(body.get("model"), str) else None,
            tools=tools if isinstance(tools, list) else None, stream=bool(body.get("stream")),
            include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
            logprobs=bool(body.get("logprobs")),
            template_kwargs=kwargs if isinstance(kwargs, dict) else {}, raw=body)

    def outgoing(self, req: ChatRequest, engine: PassthroughEngine
                 ) -> tuple[dict, _Asked, list[str]]:
        """The body for the engine: the harness's, plus what brings the tokens back."""
        raw = req.raw
        body = dict(raw)
        if self.dialect == "vllm":
            asked = _Asked(bool(raw.get("return_token_ids")), bool(raw.get("return_token_ids")),
                           bool(raw.get("logprobs")), bool(raw.get("return_weight_versions")))
            add = {"return_token_ids": True, "logprobs": True}
            v = version_tuple(engine.version)
            if v is not None and v >= (0, 33):  # older servers ignore it, stricter ones refuse
                add["return_weight_versions"] = True
        else:
            asked = _Asked(bool(raw.get("return_input_ids_in_sglext")),
                           bool(raw.get("return_output_ids_in_sglext")),
                           bool(raw.get("logprobs")), True)
            add = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True,
                   "logprobs": True}
        added = [k for k, v in add.items() if body.get(k) is not True]
        body.update(add)
        return body, asked, added

    async def _target(self, session_id: str) -> tuple[PassthroughEngine, Any]:
        """The engine for this session (a replica pool keeps a session on one replica)."""
        try:
            bound = self.engine.pick(session_id)
        except EngineError as exc:
            raise _api_error(exc) from exc
        engine = getattr(bound, "engine", bound)
        if engine.model is None:  # unreachable when Turnstile started: learn its version now
            with contextlib.suppress(EngineError):
                await engine.refresh()
        return engine, bound

    @staticmethod
    def _failed(bound: Any, exc: EngineError) -> None:
        """A replica that could not serve a call gets no new sessions until it is healthy."""
        pool = getattr(bound, "pool", None)
        if pool is not None and exc.status in (502, 503) and \
                not isinstance(exc, EngineHTTPError):
            pool.healthy[bound.index] = False

    # linking

    def _hashes(self, req: ChatRequest) -> list[bytes]:
        return prefix_hashes(root_hash(req.tools, req.template_kwargs), req.messages)

    async def link(self, idx: LineageIndex, req: ChatRequest, hashes: list[bytes],
                   prompt: array, engine: PassthroughEngine) -> _Link:
        """Parent by exact token prefix; otherwise a new segment, with where it diverged.

        When the messages continue a recorded call (its request + the reply we returned),
        the prompt must extend *that* call's prompt + completion: extending only an ancestor
        (the engine re-tokenized the reply) is drift, not a branch."""
        link = _Link(prompt, hashes)
        continued = None  # the call the messages continue
        for k in range(len(req.messages) - 1, 0, -1):
            cid = idx.replies.get(hashes[k])
            if cid is not None and cid in idx.nodes:
                continued = idx.nodes[cid]
                break
        parent = idx.parent_of(prompt)
        if parent is not None and (continued is None or extends(continued, prompt)):
            link.parent = parent
            return link
        if not idx.nodes:
            link.reason = "first_call"
            return link
        if continued is not None:
            compared = continued
            common = common_prefix(prompt, continued.full())
            link.reason = "drift"
        else:
            compared, common = idx.closest(prompt)  # type: ignore[misc]
            link.reason = ("history_diverged" if any(m.get("role") == "assistant"
                                                     for m in req.messages)
                           else "new_conversation")
        link.drift = await self._where(compared, common, prompt, engine)
        link.detail = describe(link.reason, link.drift)
        return link

    async def _where(self, compared: Node, i: int, prompt: array,
                     engine: PassthroughEngine) -> dict:
        """:func:`divergence`, with the text of the tokens on both sides (the engine's)."""
        d = divergence(compared, i, prompt)
        recorded, received = d["recorded"]["ids"], d["received"]["ids"]
        k = i - d["window_start"]
        texts = await asyncio.gather(*(engine.detokenize(ids) for ids in (
            recorded, received, recorded[k:], received[k:])))
        tails = texts[2:]
        same = None
        if None not in tails:
            short, long_ = sorted(tails, key=len)  # type: ignore[arg-type]
            same = bool(short) and long_.startswith(short)
        d["recorded"].update(text=texts[0], text_from_index=tails[0])
        d["received"].update(text=texts[1], text_from_index=tails[1])
        # the text goes on the same from the divergence: a retokenization, not an edit
        d["same_text"] = same
        return d

    # recording

    def _record(self, session_id: str, idx: LineageIndex, link: _Link | None,
                choice: _Choice | None,
                cap: _Capture | None, status: str, error: str | None, started: float,
                body: dict, added: list[str], response: object = None,
                notes: list[str] | None = None) -> CallRecord:
        """One call (one choice) committed to the store, then added to the session's index."""
        call_id = new_id("call_")
        ids = array("i", (choice.ids or []) if choice else [])
        values, note = _logprob_values(choice, self.dialect) if choice else ([], None)
        notes = [*(notes or []), *([note] if note else [])]
        message = choice.assembled() if choice and status == "ok" else None
        prompt = link.prompt if link else array("i")
        parent = link.parent if link else None
        reply_hash = None
        if link is not None and message is not None:
            reply_hash = prefix_hashes(link.hashes[-1], [message])[1]
        spans = (choice.weight_versions if choice else None) or (cap.weight_versions if cap
                                                                 else None)
        version = _token_versions(spans, len(ids)) or (cap.weight_version if cap else None)
        stop_token = stop_string = None
        if choice is not None:
            if isinstance(choice.stop, int) and not isinstance(choice.stop, bool):
                stop_token = choice.stop
            elif isinstance(choice.stop, str):
                stop_string = choice.stop
            elif choice.finish_reason in ("stop", "tool_calls") and ids:
                stop_token = ids[-1]  # stopped on EOS (vLLM reports no stop_reason for it)
        usage = (cap.usage if cap else None) or {}
        seq = idx.n_calls
        idx.n_calls += 1
        sampling = {k: body[k] for k in SAMPLING_KEYS if k in body and k not in added}
        info = {
            "model": self.model_name,
            "mode": "passthrough",
            "engine": self.engine.name,
            "engine_model": self.primary.model,
            "fingerprint": None,  # the engine rendered the prompt
            "segment_detail": link.detail if link else None,
            "drift": link.drift if link else None,
            "sampling": sampling,
            "added_fields": added,
            "logprob_kind": self.primary.logprob_kind,
            "logprob_warning": self._logprob_warning(body),
            "engine_request_id": cap.engine_id if cap else None,
            "weight_version": version if version is not None else self.control.version,
            "weight_versions": spans,
            "policy_version": self.control.version,
            "stop_string": stop_string,
            "choice_index": choice.index if choice else None,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "cached_tokens": int(((usage.get("prompt_tokens_details") or {})
                                            .get("cached_tokens")) or 0),
                      "engine": usage or None},
            "timings": {"started": started, "latency_s": time.time() - started},
            "capture_notes": notes or None,
            "stream": bool(body.get("stream")),
        }
        rec = CallRecord(
            id=call_id, session_id=session_id, seq=seq,
            parent_id=parent.id if parent else None,
            segment_reason=link.reason if link else None,
            reused_prefix_len=parent.full_len if parent else 0,
            prompt_delta=link.delta if link else array("i"), completion_ids=ids,
            completion_logprobs=array("f", values), finish_reason=choice.finish_reason
            if choice else None, stop_token_id=stop_token, seam=None, status=status,
            error=error, message=message, history_hash=reply_hash, info=info)
        self.store.add_call(rec, request_body=body, response_body=response)
        if status == "ok" and link is not None:
            idx.add(new_node(call_id, parent, rec.prompt_delta, ids, seq, prompt))
            if reply_hash is not None:
                idx.replies[reply_hash] = call_id
        return rec

    def _logprob_warning(self, body: dict) -> str | None:
        kind = self.primary.logprob_kind
        if kind == PROCESSED_LOGPROBS:
            return None
        unset = [k for k in ("temperature", "top_p") if body.get(k) is None]
        if unset:
            return (f"{' and '.join(unset)} not in the request: the engine used its defaults "
                    "(vLLM and SGLang take them from the model's generation_config), unknown to "
                    f"Turnstile; recorded {kind} may not be behaviour-policy logprobs")
        lb = body.get("logit_bias") or {}
        params = SamplingParams(
            max_tokens=1, temperature=float(body["temperature"]), top_p=float(body["top_p"]),
            logit_bias={int(k): float(v) for k, v in lb.items()} if isinstance(lb, dict)
            else {})
        warning = self.primary.logprob_warning(params)
        top_k = body.get("top_k")
        if warning is None and isinstance(top_k, int) and top_k > 0:
            warning = (f"recorded {kind} are taken before top_k {top_k} changed the sampling "
                       "distribution: they are not behaviour-policy logprobs")
        return warning

    def _record_all(self, session_id: str, idx: LineageIndex, link: _Link, cap: _Capture,
                    started: float, body: dict, added: list[str], response: object) -> None:
        notes = []
        usage = cap.usage or {}
        n_out = sum(len(c.ids or []) for c in cap.choices.values())
        if isinstance(usage.get("prompt_tokens"), int) and \
                usage["prompt_tokens"] != len(link.prompt):
            notes.append(f"usage.prompt_tokens is {usage['prompt_tokens']} but the engine "
                         f"returned {len(link.prompt)} prompt token IDs")
        if isinstance(usage.get("completion_tokens"), int) and usage["completion_tokens"] != n_out:
            notes.append(f"usage.completion_tokens is {usage['completion_tokens']} but the engine "
                         f"returned {n_out} completion token IDs (vLLM hides the IDs of reasoning "
                         "it does not stream when include_reasoning is false)")
        for i in sorted(cap.choices):
            self._record(session_id, idx, link, cap.choices[i], cap, "ok", None, started, body,
                         added, response, notes)

    def _record_failure(self, session_id: str, status: str, error: str, started: float,
                        body: dict, added: list[str], cap: _Capture | None = None,
                        link: _Link | None = None, response: object = None) -> None:
        """A call the harness did not get whole: recorded with whatever tokens came back."""
        idx = self.index(session_id)
        if link is None and cap is not None and cap.prompt_ids is not None:
            link = _Link(array("i", cap.prompt_ids), [])
            link.parent = idx.parent_of(link.prompt)
        choices = [cap.choices[i] for i in sorted(cap.choices)] if cap and cap.choices else [None]
        for c in choices:
            self._record(session_id, idx, link, c, cap, status, error, started, body, added,
                         response)

    # the call

    async def complete(self, session_id: str, req: ChatRequest) -> dict:
        await self.control.admit()  # waits while a weight update has generation paused
        try:
            return await self._complete(session_id, req)
        finally:
            self.control.leave()

    async def _complete(self, session_id: str, req: ChatRequest) -> dict:
        started = time.time()
        engine, bound = await self._target(session_id)
        body, asked, added = self.outgoing(req, engine)
        cap = _Capture(self.dialect)
        try:
            try:
                resp = await engine.open_chat(body)
                try:
                    raw = await resp.read()
                finally:
                    resp.release()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise EngineError(f"{engine.label} at {engine.url} failed: {exc}", 502) from exc
            data = _loads(raw, "its response")
            cap.feed_response(data)
            problem = cap.missing()
            if problem:
                raise EngineError(problem, 502)
        except EngineError as exc:
            self._failed(bound, exc)
            self._record_failure(session_id, "error", str(exc), started, body, added, cap)
            raise _api_error(exc) from exc
        except asyncio.CancelledError:
            if not self.control.aborted():
                raise
            self._record_failure(session_id, "aborted", POLICY_ABORT, started, body, added, cap)
            raise APIError(503, POLICY_ABORT, code="policy_update",
                           type_="engine_unavailable") from None
        idx = self.index(session_id)
        link = await self.link(idx, req, self._hashes(req), array("i", cap.prompt_ids or []),
                               engine)
        self._record_all(session_id, idx, link, cap, started, body, added, data)
        out = orjson.loads(raw) if self.store.keep_bodies else data  # the kept body stays whole
        return strip_response(out, asked, self.dialect)

    async def stream(self, session_id: str, req: ChatRequest) -> AsyncIterator[dict]:
        """Chunks of a streamed completion. The engine's answer to the request (an error
        status, or the first chunk) is awaited here, so failures before the stream starts are
        HTTP errors; the call is recorded before the last chunk reaches the harness."""
        await self.control.admit()
        self.control.leave()  # the stream runs in the response's task: it enters there
        started = time.time()
        engine, bound = await self._target(session_id)
        body, asked, added = self.outgoing(req, engine)
        cap = _Capture(self.dialect)
        resp = None
        ready = False
        try:
            try:
                resp = await engine.open_chat(body)
                events = sse_data(resp).__aiter__()
                first = await anext(events, b"[DONE]")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise EngineError(f"{engine.label} at {engine.url} failed: {exc}", 502) from exc
            if first.strip() != b"[DONE]":
                chunk = self._chunk(engine, first)
                cap.feed_chunk(chunk)
                if self.dialect == "vllm" and cap.prompt_ids is None:
                    raise EngineError(cap.missing() or "no prompt token IDs", 502)
            else:
                chunk = None
            ready = True
        except EngineError as exc:
            self._failed(bound, exc)
            self._record_failure(session_id, "error", str(exc), started, body, added, cap)
            raise _api_error(exc) from exc
        finally:
            if not ready and resp is not None:
                resp.close()
        return self._stream(session_id, req, engine, bound, resp, events, chunk, cap, asked,
                            body, added, started)

    def _chunk(self, engine: PassthroughEngine, payload: bytes) -> dict:
        obj = _loads(payload, "a stream chunk")
        if ("error" in obj or obj.get("object") == "error") and not obj.get("choices"):
            err = obj.get("error", obj)  # {"error": {...}} or an ErrorResponse itself
            err = err if isinstance(err, dict) else {"message": err}
            code = err.get("code")
            status = int(code) if isinstance(code, int) or str(code).isdigit() else 500
            raise engine.http_error(status, orjson.dumps({"error": err}))
        return obj

    async def _stream(self, session_id: str, req: ChatRequest, engine: PassthroughEngine,
                      bound: Any, resp: aiohttp.ClientResponse, events: AsyncIterator[bytes],
                      first: dict | None, cap: _Capture, asked: _Asked, body: dict,
                      added: list[str], started: float) -> AsyncIterator[dict]:
        self.control.enter()
        keep = self.store.keep_bodies
        chunks: list[dict] = []  # as the engine sent them (kept with --keep-bodies)
        held: list[dict] = []  # from the finishing chunk on: sent after the call is recorded
        status, error = "aborted", "the client disconnected"
        done = first is None
        try:
            pending = [first] if first is not None else []
            while True:
                if pending:
                    chunk = pending.pop()
                else:
                    payload = await anext(events, None)
                    if payload is None:
                        break
                    if payload.strip() == b"[DONE]":
                        done = True
                        break
                    chunk = self._chunk(engine, payload)
                    cap.feed_chunk(chunk)
                ends = not chunk.get("choices") or any(
                    ch.get("finish_reason") is not None for ch in chunk["choices"])
                if keep:
                    chunks.append(chunk)
                    chunk = orjson.loads(orjson.dumps(chunk))
                out = strip_chunk(chunk, asked, self.dialect)
                if out is None:
                    continue
                if held or ends:
                    held.append(out)
                else:
                    yield out
            if not done:
                raise EngineError(f"{engine.label} ended the stream before [DONE]", 502)
            problem = cap.missing()
            if problem:
                raise EngineError(problem, 502)
            status, error = "ok", None
        except EngineError as exc:
            status, error = "error", str(exc)
            self._failed(bound, exc)
            raise _api_error(exc) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, error = "error", f"{engine.label} at {engine.url} failed: {exc}"
            raise APIError(502, error, type_="engine_error") from exc
        except asyncio.CancelledError:
            if self.control.aborted():
                error = POLICY_ABORT
                raise APIError(503, POLICY_ABORT, code="policy_update",
                               type_="engine_unavailable") from None
            raise
        finally:
            resp.close()
            if status != "ok":
                self._record_failure(session_id, status, error or "", started, body, added, cap,
                                     response={"chunks": chunks} if keep else None)
                self.control.leave()
        try:
            idx = self.index(session_id)
            link = await self.link(idx, req, self._hashes(req),
                                   array("i", cap.prompt_ids or []), engine)
            self._record_all(session_id, idx, link, cap, started, body, added,
                             {"chunks": chunks} if keep else None)
        finally:
            self.control.leave()
        for out in held:
            yield out


def build(engine_urls: list[str], model_name: str, data: str | Path, dialect: str = "vllm",
          keep_bodies: bool = False, logprobs_mode: str | None = None,
          original_logprobs: bool = False) -> PassthroughGateway:
    """A passthrough gateway in front of one engine, or a replica pool of several."""
    replicas = [PassthroughEngine(u, dialect, logprobs_mode=logprobs_mode,
                                  original_logprobs=original_logprobs) for u in engine_urls]
    if len(replicas) == 1:
        engine: Any = replicas[0]
    else:
        from ..engines.pool import ReplicaPool

        engine = ReplicaPool(replicas)  # type: ignore[arg-type]
    return PassthroughGateway(engine, Store(data, keep_bodies=keep_bodies), model_name, dialect)


def run(args: argparse.Namespace) -> None:
    """``turnstile serve --mode passthrough``: no tokenizer, no template; ``--model`` is the
    name reported on ``/v1/models`` (use the engine's served name)."""
    import uvicorn

    from .app import create_app

    urls = [u for arg in args.engine_url for u in (
        Path(arg[1:]).read_text().split() if arg.startswith("@") else [arg])]
    dialect = "sglang" if args.engine == "sglang" else "vllm"
    gateway = build(urls, args.served_model_name or args.model, args.data, dialect,
                    keep_bodies=args.keep_bodies, logprobs_mode=args.engine_logprobs_mode,
                    original_logprobs=args.sglang_original_logprobs)
    public = args.public_url or f"http://{args.host}:{args.port}"
    app = create_app(gateway, public, max_body=args.max_body_mb << 20, token=args.trainer_token)
    print(f"turnstile: passthrough capture ({dialect} token-ID fields), model "
          f"{gateway.model_name}, engine at {', '.join(urls)}, records in {args.data}",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                loop="uvloop", http="httptools", access_log=False)
