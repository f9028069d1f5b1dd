"""SGLang, token-in through its native ``POST /generate`` with ``input_ids``.

The response carries the sampled ``output_ids`` (the sampled stop token included: SGLang trims
it from ``text`` only) and, with ``return_logprob``, ``meta_info.output_token_logprobs`` as
``[logprob, token_id, text|null]`` triples; ``logprob_start_len=-1`` keeps prompt logprobs out.
``meta_info.finish_reason`` is ``{"type": "stop", "matched": <token id | stop string>}``,
``{"type": "length", ...}`` or ``{"type": "abort", "message", "status_code"}``;
``meta_info.weight_version`` names the server's weights and ``weight_versions`` spans say which
version sampled which output tokens.

Streams are cumulative by default (each event repeats ``output_ids`` and the logprob lists so
far, and intermediate events may be skipped when the client is slow) or incremental with the
server flag ``--incremental-streaming-output`` (each event is a delta). Each event is read by
comparing its ``output_ids`` with ``meta_info.completion_tokens``, so both work without knowing
the flag. A cancelled call is aborted by ``rid`` (``POST /abort_request``).

SGLang's logprobs are ``log_softmax((logits + bias) / temperature)``: after temperature, before
top-k/top-p (``layers/sampler.py``); the raw ones when the request is greedy or the server runs
with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (say so with ``original_logprobs=True``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence

import orjson

from .base import (
    RAW_LOGPROBS,
    SCALED_LOGPROBS,
    EngineError,
    Finish,
    SamplingParams,
    TokenBatch,
    logprob_unfitness,
)
from .http import (
    CONNECT_TIMEOUT_S,
    ENGINE_TIMEOUT_S,
    HTTPEngine,
    gateway_status,
    json_object,
    new_request_id,
)
from .prompt_json import wire_ids


class SGLangServer(HTTPEngine):
    """What every adapter of an SGLang server knows, whichever route it generates through
    (``/generate`` here, Chat Completions in engine-rendered capture): its model, context,
    version and streaming mode, the kind of its logprobs, and its pause routes."""

    label = "SGLang"

    def __init__(
        self,
        url: str,
        *,
        original_logprobs: bool = False,
        timeout: float = ENGINE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ):
        """``original_logprobs``: the server runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``."""
        super().__init__(url, timeout, connect_timeout)
        self.original_logprobs = original_logprobs
        self.model: str | None = None
        self.version: str | None = None
        self.weight_version: str | None = None
        self.incremental_streaming: bool | None = None

    async def pause(self, mode: str) -> str:
        """``POST /pause_generation``: abort in-flight requests, or let them finish in place."""
        body = {"mode": "abort" if mode == "abort" else "in_place"}
        return await self._post_admin("/pause_generation", body)

    async def resume(self) -> str:
        return await self._post_admin("/continue_generation", {})

    async def refresh(self) -> None:
        """Served model and context length (``/v1/models``); version, streaming mode and weight
        version when the server shows them (``/server_info``, ``/model_info``)."""
        models = await self._get_json("/v1/models")
        if not isinstance(models, dict) or not models.get("data"):
            raise EngineError(f"SGLang at {self.url} has no /v1/models answer yet", 503)
        card = models["data"][0]
        self.model = card.get("id")
        self.context_length = int(card.get("max_model_len") or 0)
        info = await self._get_json("/server_info")
        if isinstance(info, dict):
            self.version = info.get("version") or self.version
            if "incremental_streaming_output" in info:
                self.incremental_streaming = bool(info["incremental_streaming_output"])
        model = await self._get_json("/model_info")
        if isinstance(model, dict):
            self.weight_version = model.get("weight_version")

    @property
    def logprob_kind(self) -> str:
        return RAW_LOGPROBS if self.original_logprobs else SCALED_LOGPROBS

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        return logprob_unfitness(self.logprob_kind, params)


class SGLangEngine(SGLangServer):
    name = "sglang"

    def request_body(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool, rid: str
    ) -> dict:
        sp: dict = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or -1,
            "min_p": params.min_p or 0.0,
            "frequency_penalty": params.frequency_penalty or 0.0,
            "presence_penalty": params.presence_penalty or 0.0,
            "repetition_penalty": params.repetition_penalty or 1.0,
            "min_new_tokens": 0,
            "n": 1,
            "ignore_eos": False,
            "skip_special_tokens": False,
            "no_stop_trim": False,
        }
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
        if params.logit_bias:
            sp["logit_bias"] = {str(int(k)): float(v) for k, v in params.logit_bias.items()}
        if params.grammar:
            sp["ebnf"] = params.grammar
        elif params.json_schema is not None:
            sp["json_schema"] = orjson.dumps(params.json_schema).decode()
        if params.seed is not None:
            sp["sampling_seed"] = params.seed  # honoured with --enable-deterministic-inference
        body: dict = {
            "rid": rid,
            "input_ids": wire_ids(prompt_ids),
            "sampling_params": sp,
            "stream": stream,
            "return_logprob": True,
            "logprob_start_len": -1,
            "return_text_in_logprobs": False,
        }
        if params.top_logprobs > 0:
            body["top_logprobs_num"] = params.top_logprobs
        return body

    async def _abort(self, rid: str) -> None:
        await self._request("POST", "/abort_request", {"rid": rid}, timeout=5)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[TokenBatch | Finish]:
        rid = new_request_id()
        body = self.request_body(prompt_ids, params, stream, rid)
        async for batch in self._generation(
            "/generate",
            orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            stream,
            _Reader(self, params, len(prompt_ids)),
            lambda: self._abort(rid),
        ):
            yield batch


def _loads(raw: bytes) -> dict:
    return json_object(raw, "SGLang /generate")


class _Reader:
    """Accumulates ``/generate`` bodies or stream events into token events and a Finish."""

    def __init__(self, engine: SGLangEngine, params: SamplingParams, prompt_len: int):
        self.engine, self.params, self.prompt_len = engine, params, prompt_len
        self.ids: list[int] = []
        self.pending = TokenBatch()
        self.meta: dict = {}

    def feed(self, obj: dict, cumulative: bool | None) -> None:
        """``cumulative``: True for a whole response, None to tell from the event itself."""
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) and code >= 400 else 400
            raise EngineError(f"SGLang /generate answered {status}: {msg}", gateway_status(status))
        meta = obj.get("meta_info") or {}
        out_ids = [int(t) for t in obj.get("output_ids") or []]
        lps = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        total = meta.get("completion_tokens")
        have = len(self.ids)
        if cumulative is None:
            # A cumulative event repeats everything so far (its length is the running
            # completion_tokens); an incremental one is a delta. Alike on the first event.
            if isinstance(total, int):
                cumulative = have > 0 and len(out_ids) == total
            elif self.engine.incremental_streaming is not None:
                cumulative = not self.engine.incremental_streaming
            else:
                cumulative = have > 0 and out_ids[:have] == self.ids
        if cumulative:
            if out_ids[:have] != self.ids:
                raise EngineError(
                    "SGLang's cumulative stream changed tokens it had already sent", 502
                )
            new = out_ids[have:]
            offset = have  # the logprob lists are cumulative too
        else:
            new = out_ids
            offset = len(lps) - len(new) if len(lps) > len(new) else 0
        for j, tid in enumerate(new):
            i = offset + j
            entry = lps[i] if i < len(lps) else None
            if entry is not None and len(entry) >= 2 and entry[1] == tid and entry[0] is not None:
                lp = float(entry[0])
            else:
                lp = math.nan
            top = None
            k = self.params.top_logprobs
            if k > 0:
                given = tops[i] if i < len(tops) and tops[i] else ()
                top = [(int(t[1]), float(t[0])) for t in given[:k] if t[0] is not None]
            self.pending.add(tid, lp, top)
        self.ids.extend(new)
        if meta:
            self.meta = meta

    def feed_whole(self, raw: bytes) -> None:
        self.feed(_loads(raw), cumulative=True)

    def feed_event(self, payload: bytes) -> None:
        self.feed(_loads(payload), cumulative=None)

    def take(self) -> TokenBatch:
        out, self.pending = self.pending, TokenBatch()
        return out

    def finish(self) -> Finish:
        meta = self.meta
        fr = meta.get("finish_reason")
        if not isinstance(fr, dict):
            raise EngineError("SGLang /generate ended without a finish reason", 502)
        kind = fr.get("type")
        if kind == "abort":
            status = fr.get("status_code")
            status = status if isinstance(status, int) and status >= 400 else 503
            raise EngineError(
                f"SGLang aborted the request after {len(self.ids)} tokens: "
                f"{fr.get('message') or 'aborted'}",
                gateway_status(status),
            )
        stop_token = stop_string = None
        reason = "length" if kind == "length" else "stop"
        matched = fr.get("matched")
        if kind == "stop":
            if isinstance(matched, int) and not isinstance(matched, bool):
                stop_token = matched
            elif isinstance(matched, str):
                stop_string = matched
        spans = meta.get("weight_versions") or None
        version = meta.get("weight_version")
        return Finish(
            reason=reason,
            stop_token_id=stop_token,
            stop_string=stop_string,
            prompt_tokens=int(meta.get("prompt_tokens") or self.prompt_len),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            engine_request_id=meta.get("id"),
            weight_version=str(version) if version is not None else None,
            weight_versions=[dict(s) for s in spans] if spans else None,
            logprob_kind=self.engine.logprob_kind,
        )
