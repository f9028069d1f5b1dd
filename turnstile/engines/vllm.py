"""vLLM, token-in through ``POST /inference/v1/generate`` (or ``/v1/completions``).

``/inference/v1/generate`` (vLLM 0.25+) takes ``token_ids`` and a raw ``SamplingParams`` object
and returns the sampled ``token_ids`` with their logprobs: nothing is rendered, detokenized or
re-tokenized on the way. From 0.31 it exists only when vLLM is started with
``--enable-scale-out`` (0.31 answers 404 without it, 0.32+ 403 "Scale-out endpoints are
disabled"); this adapter says so instead of failing obscurely. Versions without the route are
driven through ``/v1/completions`` with a token-ID prompt, ``return_token_ids`` and
``return_tokens_as_token_ids`` (logprob entries named ``"token_id:N"``), which any recent vLLM
accepts; ``api="completions"`` forces that route.

Shapes per version (read from the vLLM wheels, see ``shared/research/engines.md``):

- 0.29-0.31: logprobs in the chat shape, ``{"token": "token_id:N", "logprob", "bytes",
  "top_logprobs"}``; no ``stop_reason``, no ``weight_versions``.
- 0.32: integer ``token_id`` entries with ``rank``; ``stop_reason`` and ``weight_versions``
  spans on the choice (the final chunk when streaming); top-k lists cut to ``max(k, 1)``.
- 0.33: as 0.32, top-k lists not cut; ``/inference/v1/abort_requests``.

Sampling is fully specified: vLLM's ``SamplingParams`` defaults are neutral, but
``/v1/completions`` fills every unset field from the model's ``generation_config.json``
(Qwen ships ``top_k=20, repetition_penalty=1.05``), so temperature, top-p, top-k, min-p and the
penalties are always sent. Which kind of logprob comes back is a server flag
(``--logprobs-mode``); it is read from ``/server_info`` when vLLM runs in dev mode, or declared
by whoever starts Turnstile, and otherwise vLLM's default (``raw_logprobs``) is assumed.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence

import orjson

from .base import (
    PROCESSED_LOGITS,
    PROCESSED_LOGPROBS,
    RAW_LOGITS,
    RAW_LOGPROBS,
    EngineError,
    Finish,
    SamplingParams,
    TokenEvent,
    logprob_unfitness,
    wire_ids,
)
from .http import (
    HTTPEngine,
    error_message,
    json_object,
    new_request_id,
    version_tuple,
)

GENERATE = "/inference/v1/generate"
COMPLETIONS = "/v1/completions"
LOGPROBS_MODES = (RAW_LOGPROBS, PROCESSED_LOGPROBS, RAW_LOGITS, PROCESSED_LOGITS)
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
SCALE_OUT_HINT = ("vLLM serves /inference/v1/generate only when started with "
                  "--enable-scale-out (vLLM 0.31 and later): restart it with "
                  "`vllm serve ... --enable-scale-out`")


class VLLMServer(HTTPEngine):
    """What every adapter of a vLLM server knows, whichever route it generates through (token
    IDs here, Chat Completions in engine-rendered capture): its version, model and context,
    its ``--logprobs-mode``, and its pause routes."""

    label = "vLLM"

    def __init__(self, url: str, *, logprobs_mode: str | None = None, timeout: float = 600.0):
        """``logprobs_mode``: the server's ``--logprobs-mode`` when known."""
        super().__init__(url, timeout)
        if logprobs_mode is not None and logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        self.version: str | None = None
        self.model: str | None = None
        self.logprobs_mode = logprobs_mode
        self.logprobs_mode_source = "declared" if logprobs_mode else "assumed"

    @property
    def _v(self) -> tuple[int, ...] | None:
        return version_tuple(self.version)

    async def pause(self, mode: str) -> str:
        """``POST /pause`` (registered only with ``VLLM_SERVER_DEV_MODE=1``)."""
        return await self._post_admin(f"/pause?mode={'abort' if mode == 'abort' else 'wait'}")

    async def resume(self) -> str:
        return await self._post_admin("/resume")

    async def refresh(self) -> None:
        """Version, served model, context length and ``--logprobs-mode`` (dev mode only)."""
        ver = await self._get_json("/version")
        if isinstance(ver, dict) and ver.get("version"):
            self.version = str(ver["version"])
        models = await self._get_json("/v1/models")
        if not isinstance(models, dict) or not models.get("data"):
            raise EngineError(f"vLLM at {self.url} has no /v1/models answer yet", 503)
        card = models["data"][0]
        self.model = card.get("id")
        self.context_length = int(card.get("max_model_len") or 0)
        if self.logprobs_mode_source != "declared":
            info = await self._get_json("/server_info?config_format=json")
            mode = None
            if isinstance(info, dict) and isinstance(info.get("vllm_config"), dict):
                mode = (info["vllm_config"].get("model_config") or {}).get("logprobs_mode")
            if mode in LOGPROBS_MODES:
                self.logprobs_mode, self.logprobs_mode_source = mode, "server"

    @property
    def logprob_kind(self) -> str:
        return self.logprobs_mode or RAW_LOGPROBS

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        if params is None and self.logprobs_mode_source == "assumed":
            return ("vLLM's --logprobs-mode could not be read (GET /server_info needs "
                    "VLLM_SERVER_DEV_MODE=1); assuming vLLM's default raw_logprobs, which are "
                    "not behaviour-policy logprobs once temperature != 1, top_p < 1 or "
                    "logit_bias change the sampling distribution. For RL start vLLM with "
                    "--logprobs-mode processed_logprobs and tell Turnstile "
                    "(--engine-logprobs-mode).")
        return logprob_unfitness(self.logprob_kind, params)


class VLLMEngine(VLLMServer):
    name = "vllm"

    def __init__(self, url: str, *, api: str = "auto", logprobs_mode: str | None = None,
                 timeout: float = 600.0):
        """``api``: "auto" (``/inference/v1/generate`` when the server has it), "generate" or
        "completions". ``logprobs_mode``: the server's ``--logprobs-mode`` when known."""
        if api not in ("auto", "generate", "completions"):
            raise ValueError(f"api must be auto, generate or completions, not {api!r}")
        super().__init__(url, logprobs_mode=logprobs_mode, timeout=timeout)
        self.api = api
        self.route: str | None = {"generate": GENERATE, "completions": COMPLETIONS}.get(api)
        self._disabled: str | None = None  # why /inference/v1/generate cannot be used

    async def refresh(self) -> None:
        """The server's facts, then the route."""
        await super().refresh()
        if self.api == "auto":
            await self._probe_generate()

    async def _probe_generate(self) -> None:
        """An empty body is refused by validation (400) where the route exists, and by the
        route itself where it is missing (404) or switched off (403): nothing is generated."""
        status, raw = await self._request("POST", GENERATE, {}, timeout=30)
        if status in (400, 422):
            self.route, self._disabled = GENERATE, None
        elif status in (403, 404):
            self._route_missing(status, raw)

    def _route_missing(self, status: int, raw: bytes) -> None:
        """403 (0.32+) or 404 on 0.31+ means scale-out is off; a 404 from an older or unknown
        vLLM means the route does not exist there, and ``/v1/completions`` is used instead."""
        v = self._v
        if (v is not None and v < (0, 25)) or (status == 404 and (v is None or v < (0, 31))):
            self.route, self._disabled = COMPLETIONS, None
            return
        self.route = GENERATE
        name = f"vLLM {self.version}" if self.version else "vLLM"
        self._disabled = (f"{name} at {self.url} answered {status} to {GENERATE} "
                          f"({error_message(raw)}). {SCALE_OUT_HINT}, or use the vLLM "
                          f"completions route (api='completions').")

    # requests

    def _logprobs_count(self, k: int) -> int:
        """vLLM returns the sampled token first, then the top k; up to 0.32 the list is cut to
        ``max(k, 1)`` entries, which drops the k-th best whenever the sampled token is not among
        them. Asking for one more keeps the true top k (the list is re-sorted and cut to k)."""
        if k <= 0:
            return 0
        v = self._v
        if v is not None and v >= (0, 33):
            return k
        return min(k + 1, MAX_LOGPROBS) if k < MAX_LOGPROBS else k

    def _sampling(self, params: SamplingParams, completions: bool) -> dict:
        old = self._v is not None and self._v < (0, 25)
        sp: dict = {
            "n": 1,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or (-1 if old else 0),
            "min_p": params.min_p or 0.0,
            "presence_penalty": params.presence_penalty or 0.0,
            "frequency_penalty": params.frequency_penalty or 0.0,
            "repetition_penalty": params.repetition_penalty or 1.0,
            "max_tokens": params.max_tokens,
            "min_tokens": 0,
            "ignore_eos": False,
            "logprobs": self._logprobs_count(params.top_logprobs),
            "skip_special_tokens": False,
            "include_stop_str_in_output": False,
        }
        if params.seed is not None:
            sp["seed"] = params.seed
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
        if params.logit_bias:
            sp["logit_bias"] = {str(int(k)): float(v) for k, v in params.logit_bias.items()}
        if params.grammar:  # constrained decoding (xgrammar reads GBNF)
            sp["structured_outputs"] = {"grammar": params.grammar}
        elif params.json_schema is not None:
            sp["structured_outputs"] = {"json": params.json_schema}
        if completions:
            # OpenAI's logprobs count on /v1/completions: top entries beyond the sampled one.
            sp["logprobs"] = max(0, params.top_logprobs)
        else:
            # No stop strings: the engine need not detokenize at all.
            sp["detokenize"] = bool(params.stop)
        return sp

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool,
                     request_id: str, route: str) -> dict:
        if route == GENERATE:
            body: dict = {"request_id": request_id, "token_ids": wire_ids(prompt_ids),
                          "sampling_params": self._sampling(params, False), "stream": stream}
        else:
            body = {"prompt": wire_ids(prompt_ids), **self._sampling(params, True),
                    "echo": False, "stream": stream, "request_id": request_id,
                    "return_token_ids": True, "return_tokens_as_token_ids": True}
            if self.model:
                body["model"] = self.model
            if self._v is None or self._v >= (0, 33):
                body["return_weight_versions"] = True
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _abort_ids(self, route: str, request_id: str) -> list[str]:
        """Engine-side ids: vLLM prefixes the id it was given."""
        if route == GENERATE:
            return [f"generate-tokens-{request_id}"]
        return [f"cmpl-{request_id}-0", f"cmpl-{request_id}"]

    async def _abort(self, ids: list[str]) -> None:
        """``/inference/v1/abort_requests`` (0.33, scale-out), else ``/abort_requests``
        (``--tokens-only`` or dev mode). Best effort: closing the connection already cancels."""
        for path in ("/inference/v1/abort_requests", "/abort_requests"):
            status, _ = await self._request("POST", path, {"request_ids": ids}, timeout=5)
            if status == 200:
                return

    # generation

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = True
                       ) -> AsyncIterator[list[TokenEvent] | Finish]:
        if self.route is None:
            await self.refresh()
        route = self.route or GENERATE
        if route == GENERATE and self._disabled:
            raise EngineError(self._disabled, 502)
        request_id = new_request_id()
        body = self.request_body(prompt_ids, params, stream, request_id, route)
        ids = self._abort_ids(route, request_id)

        def refused(status: int, raw: bytes) -> None:
            if route == GENERATE and status in (403, 404):
                self._route_missing(status, raw)
                raise EngineError(self._disabled, 502) if self._disabled else _RouteGone()

        try:
            async for batch in self._generation(
                    route, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), stream,
                    _Reader(self, route, params, prompt_ids), lambda: self._abort(ids), refused):
                yield batch
        except _RouteGone:  # the route is gone and completions will do: try again there
            async for batch in self.generate(prompt_ids, params, stream):
                yield batch


class _RouteGone(Exception):
    """/inference/v1/generate is missing and /v1/completions will serve instead."""


def _loads(raw: bytes, route: str) -> dict:
    return json_object(raw, f"vLLM {route}")


class _Reader:
    """Turns response bodies / stream chunks of either route into events and one Finish."""

    def __init__(self, engine: VLLMEngine, route: str, params: SamplingParams,
                 prompt_ids: Sequence[int]):
        self.engine, self.route, self.params = engine, route, params
        self.prompt_len = len(prompt_ids)
        self.pending: list[TokenEvent] = []
        self.ids: list[int] = []
        self.final: dict | None = None  # the choice that carried finish_reason
        self.usage: dict | None = None
        self.request_id: str | None = None
        self.weight_versions: list[dict] | None = None

    def feed(self, obj: dict) -> None:
        if "error" in obj and not obj.get("choices"):
            err = obj["error"] if isinstance(obj["error"], dict) else {}
            code = int(err.get("code") or 500) if str(err.get("code", "")).isdigit() else 500
            raise self.engine._error(self.route, code, orjson.dumps(obj))
        self.request_id = obj.get("request_id") or obj.get("id") or self.request_id
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            events = self._events(choice)
            self.pending.extend(events)
            self.ids.extend(ev.token_id for ev in events)
            if choice.get("weight_versions"):
                self.weight_versions = choice["weight_versions"]
            if choice.get("finish_reason") is not None:
                self.final = choice

    def feed_whole(self, raw: bytes) -> None:
        self.feed(_loads(raw, self.route))

    feed_event = feed_whole

    def take(self) -> list[TokenEvent]:
        out, self.pending = self.pending, []
        return out

    def _events(self, choice: dict) -> list[TokenEvent]:
        k = self.params.top_logprobs
        lp = choice.get("logprobs")
        if self.route == GENERATE:
            entries = (lp or {}).get("content") or []
            ids = choice.get("token_ids")
            if ids is None:
                ids = [_entry_id(e) for e in entries]
            out = []
            n = len(entries)
            for i, tid in enumerate(ids):
                e = entries[i] if i < n else None
                if e is None or _entry_id(e) != tid:
                    out.append(TokenEvent(int(tid), math.nan))
                    continue
                top = _top_k([(_entry_id(t), float(t["logprob"]))
                              for t in e.get("top_logprobs") or ()], k) if k > 0 else None
                out.append(TokenEvent(int(tid), _num(e.get("logprob")), top))
            return out
        # /v1/completions: legacy parallel lists, tokens named "token_id:N"
        lp = lp or {}
        tokens = lp.get("tokens") or []
        values = lp.get("token_logprobs") or []
        tops = lp.get("top_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None:
            ids = [_placeholder_id(t) for t in tokens]
            if any(t is None for t in ids):
                raise EngineError("vLLM /v1/completions returned no token ids (this vLLM is too "
                                  "old for return_token_ids)", 502)
        out = []
        for i, tid in enumerate(ids):
            if i >= len(values) or values[i] is None:
                out.append(TokenEvent(int(tid), math.nan))
                continue
            named = _placeholder_id(tokens[i]) if i < len(tokens) else None
            if named is not None and named != tid:
                raise EngineError(f"vLLM /v1/completions logprob {i} is for token {named}, "
                                  f"not the sampled {tid}", 502)
            top_d = tops[i] if i < len(tops) and tops[i] else {}
            cands = [(_placeholder_id(t), float(v)) for t, v in top_d.items()]
            out.append(TokenEvent(int(tid), float(values[i]), _top_k(cands, k)))
        return out

    def finish(self) -> Finish:
        choice = self.final
        if choice is None:
            raise EngineError(f"vLLM {self.route} ended without a finish reason", 502)
        reason = choice.get("finish_reason")
        if reason in ("abort", "error"):
            raise EngineError(f"vLLM {reason}ed the request (finish_reason {reason!r}) after "
                              f"{len(self.ids)} tokens", 503)
        stop_token = stop_string = None
        if reason == "length":
            out_reason = "length"
        else:
            out_reason = "stop"
            stop_reason = choice.get("stop_reason")
            if isinstance(stop_reason, int) and not isinstance(stop_reason, bool):
                stop_token = stop_reason
            elif isinstance(stop_reason, str):
                stop_string = stop_reason
            elif reason == "stop" and self.ids:
                if "stop_reason" in choice:
                    stop_token = self.ids[-1]  # null stop_reason on "stop": the EOS token
                elif self.ids[-1] in self.params.stop_token_ids:
                    stop_token = self.ids[-1]  # 0.29-0.31 report no stop_reason
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        spans = self.weight_versions
        return Finish(
            reason=out_reason,
            stop_token_id=stop_token,
            stop_string=stop_string,
            prompt_tokens=int(usage.get("prompt_tokens") or self.prompt_len),
            cached_tokens=int(details.get("cached_tokens") or 0),
            engine_request_id=self.request_id,
            weight_version=spans[-1]["version"] if spans else None,
            weight_versions=[dict(s) for s in spans] if spans else None,
            logprob_kind=self.engine.logprob_kind,
        )


def _num(v: object) -> float:
    return math.nan if v is None else float(v)  # type: ignore[arg-type]


def _placeholder_id(token: object) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None


def _entry_id(e: dict) -> int | None:
    """0.32+: ``token_id``; up to 0.31: ``token`` = ``"token_id:N"``."""
    if "token_id" in e:
        return int(e["token_id"])
    return _placeholder_id(e.get("token"))


def _top_k(cands: list[tuple[int | None, float]], k: int) -> list[tuple[int, float]] | None:
    """The k most likely of the candidates vLLM returned (the sampled token first, then the
    top k or k+1): de-duplicated, best first."""
    if k <= 0:
        return None
    seen: dict[int, float] = {}
    for t, v in cands:
        if t is not None and t not in seen:
            seen[t] = v
    best = sorted(seen.items(), key=lambda kv: -kv[1])
    return best[:k]
