"""Engine-rendered capture: an engine's own ``/v1/chat/completions``, asked to report the token
IDs it rendered and sampled.

The request goes as the harness sent it, plus only what brings the tokens back; what the
harness did not ask for is taken out of the response again. How to ask, where the IDs come
back and what to strip is an engine's *chat dialect* (``chat_dialects``: :class:`VLLMChat`,
:class:`SGLangChat`); everything else about the server (model, context, version, logprob kind,
pause routes) is the same as for its token-in adapter, whose server half
(:class:`~.vllm.VLLMServer`, :class:`~.sglang.SGLangServer`) the capture engines share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import orjson

from .base import PROCESSED_LOGPROBS, EngineError, SamplingParams
from .capture_dialects import Asked, ChatDialect, SGLangChat, VLLMChat
from .http import (
    CONNECT_TIMEOUT_S,
    ENGINE_TIMEOUT_S,
    HTTPEngine,
    error_message,
    json_object,
    timed_out,
)
from .sglang import SGLangServer
from .vllm import VLLMServer

CHAT = "/v1/chat/completions"
DIALECTS = ("vllm", "sglang")


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


def loads(raw: bytes, what: str) -> dict:
    """An engine's JSON object, or :class:`EngineError` (502) saying what was wrong with it."""
    return json_object(raw, "the engine", f" in {what}")


# What the engine returned, per choice.


@dataclass
class Choice:
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
            cur = self.tool_calls.setdefault(
                int(tc.get("index", 0)),
                {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
            )
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

    def logprob_values(self, stop_unscored: bool) -> tuple[list[float], str | None]:
        """One logprob per completion token, aligned with the IDs (NaN where unknown), and a
        note when the engine's list could not be aligned. ``stop_unscored``: the engine sends
        no logprob entry for a stop token it sampled."""
        ids = self.ids or []
        entries = self.logprobs
        if not entries:
            return [math.nan] * len(ids), None
        if (
            len(entries) == len(ids) - 1
            and stop_unscored
            and self.finish_reason in ("stop", "tool_calls")
            and self.stop == ids[-1]
        ):
            entries = [*entries, {}]
        if len(entries) != len(ids):
            return [math.nan] * len(ids), (
                f"the engine returned {len(entries)} logprob entries for {len(ids)} tokens: "
                "not aligned, recorded as unknown"
            )
        out = []
        for i, (tid, e) in enumerate(zip(ids, entries, strict=True)):
            named = e.get("token_id")
            token = e.get("token")
            if named is None and isinstance(token, str) and token.startswith("token_id:"):
                named = token[9:]
            if named is not None and str(named) != str(tid):
                return [math.nan] * len(ids), (
                    f"logprob entry {i} is for token {named}, not "
                    f"the sampled {tid}: recorded as unknown"
                )
            v = e.get("logprob")
            out.append(math.nan if v is None else float(v))
        return out, None


@dataclass
class Capture:
    """The prompt and completions an engine reported, from a response or from stream chunks."""

    dialect: ChatDialect
    prompt_ids: list[int] | None = None
    choices: dict[int, Choice] = field(default_factory=dict)
    usage: dict | None = None
    engine_id: str | None = None
    weight_version: Any = None  # SGLang metadata.weight_version (the whole response)
    weight_versions: list[dict] | None = None

    def choice(self, index: int) -> Choice:
        return self.choices.setdefault(index, Choice(index))

    def feed_response(self, resp: dict) -> None:
        self.engine_id = resp.get("id")
        self.usage = resp.get("usage")
        for ch in resp.get("choices") or ():
            c = self.choice(int(ch.get("index", 0)))
            c.message = ch.get("message")
            c.logprobs = (ch.get("logprobs") or {}).get("content")
            c.finish_reason = ch.get("finish_reason")
            c.stop = ch.get(self.dialect.stop_key)
            c.weight_versions = ch.get("weight_versions")
        self.dialect.read_ids(self, resp, stream=False)

    def feed_chunk(self, chunk: dict) -> None:
        self.engine_id = self.engine_id or chunk.get("id")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        self.dialect.read_ids(self, chunk, stream=True)
        for ch in chunk.get("choices") or ():
            c = self.choice(int(ch.get("index", 0)))
            c.add_delta(ch.get("delta") or {})
            lp = (ch.get("logprobs") or {}).get("content")
            if lp:
                c.logprobs = (c.logprobs or []) + lp
            if ch.get("finish_reason") is not None:
                c.finish_reason = ch["finish_reason"]
            for key in ("stop_reason", "matched_stop"):
                if ch.get(key) is not None:
                    c.stop = ch[key]
            if ch.get("weight_versions"):
                c.weight_versions = ch["weight_versions"]

    def missing(self) -> str | None:
        """Why the capture is unusable, or None."""
        how = self.dialect.needs
        if self.prompt_ids is None:
            return f"the engine returned no prompt token IDs: passthrough capture needs {how}"
        lost = [c.index for c in self.choices.values() if c.ids is None]
        if lost or not self.choices:
            return (
                f"the engine returned no completion token IDs (choice {lost or [0]}): "
                f"passthrough capture needs {how}"
            )
        return None

    def logprob_values(self, c: Choice) -> tuple[list[float], str | None]:
        return c.logprob_values(self.dialect.stop_unscored)

    def usage_notes(self, n_prompt: int) -> list[str]:
        """Where the engine's usage disagrees with the token IDs it returned."""
        notes = []
        usage = self.usage or {}
        n_out = sum(len(c.ids or []) for c in self.choices.values())
        if isinstance(usage.get("prompt_tokens"), int) and usage["prompt_tokens"] != n_prompt:
            notes.append(
                f"usage.prompt_tokens is {usage['prompt_tokens']} but the engine "
                f"returned {n_prompt} prompt token IDs"
            )
        if isinstance(usage.get("completion_tokens"), int) and usage["completion_tokens"] != n_out:
            notes.append(
                f"usage.completion_tokens is {usage['completion_tokens']} but the engine "
                f"returned {n_out} completion token IDs (vLLM hides the IDs of reasoning "
                "it does not stream when include_reasoning is false)"
            )
        return notes


class LogprobSource(Protocol):
    @property
    def logprob_kind(self) -> str: ...

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None: ...


def request_logprob_warning(engine: LogprobSource, body: dict) -> str | None:
    """Why the logprobs recorded for a request the engine sampled with its own defaults (what
    the harness did not set) may not be behaviour-policy logprobs, or None."""
    kind = engine.logprob_kind
    if kind == PROCESSED_LOGPROBS:
        return None
    unset = [k for k in ("temperature", "top_p") if body.get(k) is None]
    if unset:
        return (
            f"{' and '.join(unset)} not in the request: the engine used its defaults "
            "(vLLM and SGLang take them from the model's generation_config), unknown to "
            f"Turnstile; recorded {kind} may not be behaviour-policy logprobs"
        )
    lb = body.get("logit_bias") or {}
    params = SamplingParams(
        max_tokens=1,
        temperature=float(body["temperature"]),
        top_p=float(body["top_p"]),
        logit_bias={int(k): float(v) for k, v in lb.items()} if isinstance(lb, dict) else {},
    )
    warning = engine.logprob_warning(params)
    top_k = body.get("top_k")
    if warning is None and isinstance(top_k, int) and top_k > 0:
        warning = (
            f"recorded {kind} are taken before top_k {top_k} changed the sampling "
            "distribution: they are not behaviour-policy logprobs"
        )
    return warning


class CaptureEngine(HTTPEngine):
    """The Chat Completions half of a capture engine; the server half comes from the token-in
    adapter of the same engine (see :func:`capture_engine`)."""

    dialect: ChatDialect
    model: str | None
    version: str | None

    if TYPE_CHECKING:  # from the server half (VLLMServer, SGLangServer)

        @property
        def logprob_kind(self) -> str: ...

        def logprob_warning(self, params: SamplingParams | None = None) -> str | None: ...

    def outgoing(self, raw: dict) -> tuple[dict, Asked, list[str]]:
        """The body for the engine: the harness's, plus what brings the tokens back; what the
        harness asked for itself, and which fields were added."""
        body = dict(raw)
        add, asked = self.dialect.request(raw, self.version)
        added = [k for k, v in add.items() if body.get(k) is not True]
        body.update(add)
        return body, asked, added

    async def open_chat(self, body: dict) -> aiohttp.ClientResponse:
        """POST the chat request; the open response on 200 (the caller closes it), else the
        engine's error as :class:`EngineHTTPError`, 504 past the engine timeout (a
        non-streamed answer's headers come with its end), or 503 when it cannot be reached."""
        try:
            resp = await self.session.post(
                self.url + CHAT,
                data=orjson.dumps(body),
                headers={"content-type": "application/json"},
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            if timed_out(exc):
                raise self._failed(exc) from exc
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
        return EngineHTTPError(
            f"{self.label} {CHAT} answered {status}: {error_message(raw)}",
            relay_status(status),
            status,
            err,
        )

    def chunk(self, payload: bytes) -> dict:
        """One stream chunk; an in-band error chunk raised as the engine's error."""
        obj = loads(payload, "a stream chunk")
        if ("error" in obj or obj.get("object") == "error") and not obj.get("choices"):
            err = obj.get("error", obj)  # {"error": {...}} or an ErrorResponse itself
            err = err if isinstance(err, dict) else {"message": err}
            code = err.get("code")
            status = (
                code if isinstance(code, int) else int(str(code)) if str(code).isdigit() else 500
            )
            raise self.http_error(status, orjson.dumps({"error": err}))
        return obj

    async def detokenize(self, ids: list[int]) -> str | None:
        """The engine's text for ``ids`` (best effort, for drift reports)."""
        body: dict = {"tokens": list(ids)}
        if self.model:
            body["model"] = self.model
        try:
            status, raw = await self._request("POST", self.dialect.detokenize_path, body, timeout=5)
            out = orjson.loads(raw) if status == 200 else None
        except (EngineError, orjson.JSONDecodeError):
            return None
        if isinstance(out, dict):
            text = out.get("prompt", out.get("text"))
            return text if isinstance(text, str) else None
        return None


class VLLMCaptureEngine(CaptureEngine, VLLMServer):
    name = "passthrough-vllm"
    dialect = VLLMChat()


class SGLangCaptureEngine(CaptureEngine, SGLangServer):
    name = "passthrough-sglang"
    dialect = SGLangChat()


def capture_engine(
    url: str,
    dialect: str = "vllm",
    *,
    logprobs_mode: str | None = None,
    original_logprobs: bool = False,
    timeout: float = ENGINE_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> VLLMCaptureEngine | SGLangCaptureEngine:
    """The capture engine for ``dialect`` at ``url``. ``logprobs_mode``: vLLM's
    ``--logprobs-mode`` when known; ``original_logprobs``: SGLang returns logprobs before
    temperature scaling (``SGLANG_RETURN_ORIGINAL_LOGPROB``)."""
    if dialect == "vllm":
        return VLLMCaptureEngine(
            url, logprobs_mode=logprobs_mode, timeout=timeout, connect_timeout=connect_timeout
        )
    if dialect == "sglang":
        return SGLangCaptureEngine(
            url,
            original_logprobs=original_logprobs,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )
    raise ValueError(f"dialect must be one of {DIALECTS}, not {dialect!r}")
