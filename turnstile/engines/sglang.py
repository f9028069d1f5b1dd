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

The sampler's own logprob (SGLang 0.5.23+, no server flag): a sampled call under a finite top-k
asks ``return_sampling_mask`` with ``sampling_logprobs_mode: "selected"``, and ``meta_info``
then carries, per output token, the kept token IDs (``output_token_sampling_mask``) and the
sampled token's logprob under the distribution it was drawn from, renormalised over that kept
set (``output_token_sampling_logprobs``). Those become the call's logprobs (kind
``processed_logprobs``, as vLLM's: what an importance weight divides by) and the kept mass of
each token, ``exp(scaled - sampled)``, the ``kept_mass`` array. SGLang refuses the mask under
top-p or min-p without a top-k (its scheduler wants ``1 <= top_k <=
--sampling-mask-max-tokens``), so such a call is not asked and its verdict says why.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence

import numpy as np
import orjson

from ..media import MediaPrompt
from ..token_arrays import KEPT_MASS, Rows
from .base import (
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    SCALED_LOGPROBS,
    EngineError,
    Finish,
    SamplingParams,
    Sent,
    TokenBatch,
    logprob_unfitness,
    sent_fields,
)
from .http import (
    CONNECT_TIMEOUT_S,
    ENGINE_TIMEOUT_S,
    HTTPEngine,
    gateway_status,
    json_object,
    new_request_id,
    version_tuple,
)
from .prompt_json import wire_ids
from .routing import NAME as ROUTED
from .routing import parse_option, shape_from_model_dir
from .routing import read as read_routing
from .sglang_media import check_echo, image_fields


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
        routed_experts: str | None = None,
    ):
        """``original_logprobs``: the server runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``.
        ``routed_experts``: record each token's routed experts ("on": the shape read from the
        served model's config.json; or "LAYERS,TOPK[,EXPERTS]"; see ``engines.routing``)."""
        super().__init__(url, timeout, connect_timeout)
        self.original_logprobs = original_logprobs
        self.routing, self.routing_shape = parse_option(routed_experts)
        self.model: str | None = None
        self.version: str | None = None
        self.weight_version: str | None = None
        self.incremental_streaming: bool | None = None

    async def pause(self, mode: str) -> str:
        """``POST /pause_generation`` (SGLang's modes: ``abort``, ``retract``, ``in_place``).
        ``hold`` sends ``retract``: Turnstile has cut its held calls' requests already (by rid,
        keeping what they sampled; it resubmits prompt + those tokens after the resume), and
        a request its abort has not reached yet is retracted, its KV freed, so the weight
        update can flush the cache (``in_place`` would keep the old weights' KV and make the
        flush fail while any request runs); abort sends ``abort``. Drain sends nothing: every
        SGLang mode stops running requests (``in_place``/``retract`` freeze them until the
        continue), and drain waits for them to finish; Turnstile's door holds new calls."""
        if mode not in ("abort", "hold"):
            return "/pause_generation: not sent (drain: SGLang would freeze the running calls)"
        body = {"mode": "abort" if mode == "abort" else "retract"}
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
            if self.routing and self.routing_shape is None:
                self.routing_shape = shape_from_model_dir(info.get("model_path"))
        model = await self._get_json("/model_info")
        if isinstance(model, dict):
            self.weight_version = model.get("weight_version")

    @property
    def logprob_kind(self) -> str:
        return RAW_LOGPROBS if self.original_logprobs else SCALED_LOGPROBS

    def asks_kept_set(self, params: SamplingParams) -> bool:
        """Whether a call with ``params`` asks for the sampler's logprobs and kept set: a
        sampled call under a finite top-k (SGLang refuses the mask without one), to a server
        known to be 0.5.23 or later, whose own logprobs are the scaled ones."""
        v = version_tuple(self.version)
        return (
            v is not None
            and v >= SAMPLING_MASK_SINCE
            and not self.original_logprobs
            and params.temperature > 0
            and params.top_k is not None
            and 1 <= params.top_k <= SAMPLING_MASK_TOP_K
        )

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        if params is not None and self.asks_kept_set(params):
            return logprob_unfitness(PROCESSED_LOGPROBS, params)
        return logprob_unfitness(self.logprob_kind, params)


# SGLang's sampling mask: the version whose request and answer fields this reads, and the
# largest top-k asked with it (its --sampling-mask-max-tokens defaults to 4096 and a kept set
# past it aborts the request; ties at the cut can add tokens, so leave half as headroom).
SAMPLING_MASK_SINCE = (0, 5, 23)
SAMPLING_MASK_TOP_K = 2048


# The sampler fields of ``/generate``'s ``sampling_params`` (wire name → SamplingParams field;
# None: fixed by Turnstile).
SAMPLER_WIRE: dict[str, str | None] = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": None,
    "ignore_eos": None,
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "sampling_seed": "seed",
    "logit_bias": "logit_bias",
    "ebnf": "grammar",
    "json_schema": "json_schema",
}


class SGLangEngine(SGLangServer):
    name = "sglang"

    def sent_sampling(self, params: SamplingParams) -> dict[str, Sent]:
        body = self.request_body((), params, False, "")
        return sent_fields(body["sampling_params"], SAMPLER_WIRE)

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
        if isinstance(prompt_ids, MediaPrompt):  # one placeholder each + image_data
            body.update(image_fields(prompt_ids))
        if self.routing:  # only the rows the parent's record does not hold
            body["return_routed_experts"] = True
            body["routed_experts_start_len"] = max(0, min(params.rows_from, len(prompt_ids)))
        if self.asks_kept_set(params):  # the sampler's own logprob of each sampled token
            body["return_sampling_mask"] = True
            body["sampling_logprobs_mode"] = "selected"
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
            _Reader(self, params, len(prompt_ids), prompt_ids, self.asks_kept_set(params)),
            lambda: self._abort(rid),
        ):
            yield batch


def _loads(raw: bytes) -> dict:
    return json_object(raw, "SGLang /generate")


class _Reader:
    """Accumulates ``/generate`` bodies or stream events into token events and a Finish."""

    def __init__(
        self,
        engine: SGLangEngine,
        params: SamplingParams,
        prompt_len: int,
        prompt: Sequence[int] = (),
        kept: bool = False,
    ):
        self.engine, self.params, self.prompt_len = engine, params, prompt_len
        # asked for the sampler's logprobs: each token's kept mass (NaN where none came)
        self.kept = kept
        self.kept_mass: list[float] = []
        self.sampler_logprobs = 0  # tokens whose logprob is the sampler's
        # a prompt with images: SGLang's echoed expansion is checked on the first answer
        self.media = prompt if isinstance(prompt, MediaPrompt) else None
        self.ids: list[int] = []
        self.pending = TokenBatch()
        self.meta: dict = {}
        self.routed: object = None  # meta_info.routed_experts (the finished answer's)

    def feed(self, obj: dict, cumulative: bool | None) -> None:
        """``cumulative``: True for a whole response, None to tell from the event itself."""
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) and code >= 400 else 400
            raise EngineError(f"SGLang /generate answered {status}: {msg}", gateway_status(status))
        if self.media is not None:
            check_echo(self.media, obj.get("prompt_token_ids"))
            self.media = None  # checked: the same list on every event
        meta = obj.get("meta_info") or {}
        out_ids = [int(t) for t in obj.get("output_ids") or []]
        lps = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        sampled = (meta.get("output_token_sampling_logprobs") or []) if self.kept else []
        masks = (meta.get("output_token_sampling_mask") or []) if self.kept else []
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
        # the sampler's lists run beside the logprob lists (cumulative or deltas alike)
        at = have if cumulative else max(0, len(sampled) - len(new))
        for j, tid in enumerate(new):
            i = offset + j
            entry = lps[i] if i < len(lps) else None
            if entry is not None and len(entry) >= 2 and entry[1] == tid and entry[0] is not None:
                lp = float(entry[0])
            else:
                lp = math.nan
            if self.kept:
                lp = self._sampler_logprob(tid, lp, sampled, masks, at + j)
            top = None
            k = self.params.top_logprobs
            if k > 0:
                given = tops[i] if i < len(tops) and tops[i] else ()
                top = [(int(t[1]), float(t[0])) for t in given[:k] if t[0] is not None]
            self.pending.add(tid, lp, top)
        self.ids.extend(new)
        if meta:
            self.meta = meta
            if meta.get("routed_experts") is not None:
                self.routed = meta["routed_experts"]

    def _sampler_logprob(
        self, tid: int, scaled: float, sampled: list, masks: list, i: int
    ) -> float:
        """The sampled token's logprob under the sampler's distribution (SGLang's "selected"
        value), its kept mass noted; the scaled logprob where the answer has none for it (a
        token its kept set does not hold, a value that is not a logprob)."""
        value = sampled[i] if i < len(sampled) else None
        mask = masks[i] if i < len(masks) else None
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value <= 0
            and isinstance(mask, list)
            and tid in mask
        ):
            lp = float(value)
            # the kept set's mass under the scaled distribution (float32 rounding aside)
            mass = min(1.0, math.exp(scaled - lp)) if math.isfinite(scaled) else math.nan
            self.kept_mass.append(mass)
            self.sampler_logprobs += 1
            return lp
        self.kept_mass.append(math.nan)
        return scaled

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
        arrays, asked = {}, {}
        if self.engine.routing:
            got, asked[ROUTED] = read_routing(
                self.routed,
                start=max(0, min(self.params.rows_from, self.prompt_len)),
                prompt_len=self.prompt_len,
                completion_len=len(self.ids),
                shape=self.engine.routing_shape,
                npy=False,
            )
            if got is not None:
                arrays[ROUTED] = got
        kind = self.engine.logprob_kind
        if self.kept:
            kind, asked[KEPT_MASS.name] = self._kept(arrays)
        return Finish(
            reason=reason,
            stop_token_id=stop_token,
            stop_string=stop_string,
            prompt_tokens=int(meta.get("prompt_tokens") or self.prompt_len),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            engine_request_id=meta.get("id"),
            weight_version=str(version) if version is not None else None,
            weight_versions=[dict(s) for s in spans] if spans else None,
            logprob_kind=kind,
            arrays=arrays,
            asked=asked,
        )

    def _kept(self, arrays: dict[str, Rows]) -> tuple[str, dict]:
        """The call's logprob kind and what the record says of the sampler's logprobs: the
        sampler's own (``processed_logprobs``) when every sampled token got one, their kept
        masses in ``arrays``; else SGLang's scaled kind, and why."""
        n, got = len(self.ids), self.sampler_logprobs
        said: dict = {"asked": True, "mode": "selected", "rows": got}
        if n and got == n:
            values = np.asarray(self.kept_mass[:n], dtype=np.float32)
            arrays[KEPT_MASS.name] = Rows(self.prompt_len, values)
            return PROCESSED_LOGPROBS, said
        if n:
            said["note"] = (
                f"SGLang returned the sampler's logprob for {got} of {n} sampled tokens "
                "(output_token_sampling_logprobs): the call's logprobs are not all the "
                "sampler's"
            )
        return self.engine.logprob_kind, said
