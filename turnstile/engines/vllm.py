"""vLLM, token-in through ``POST /inference/v1/generate`` (or ``/v1/completions``).

``/inference/v1/generate`` (vLLM 0.25+) takes ``token_ids`` and a raw ``SamplingParams`` object
and returns the sampled ``token_ids`` with their logprobs: nothing is rendered, detokenized or
re-tokenized on the way. From 0.31 it exists only when vLLM is started with
``--enable-scale-out`` (0.31 answers 404 without it, 0.32+ 403 "Scale-out endpoints are
disabled"). ``api="auto"`` (the default) probes at start which route is served and generates
through ``/inference/v1/generate`` where it is, else through ``/v1/completions`` with a
token-ID prompt, ``return_token_ids`` and ``return_tokens_as_token_ids`` (logprob entries named
``"token_id:N"``), which any recent vLLM accepts, and logs the choice; ``api="generate"`` or
``"completions"`` forces a route. A server with no usable route is :class:`EngineUnusable` at
start (``turnstile serve`` refuses to start, saying why), not a 502 on every call.

Shapes per version (read from the vLLM wheels, see ``shared/research/engines.md``):

- 0.29-0.31: logprobs in the chat shape, ``{"token": "token_id:N", "logprob", "bytes",
  "top_logprobs"}``; no ``stop_reason``, no ``weight_versions``.
- 0.32: integer ``token_id`` entries with ``rank``; ``stop_reason`` and ``weight_versions``
  spans on the choice (the final chunk when streaming); top-k lists cut to ``max(k, 1)``.
- 0.32 with scale-out also serves ``/inference/v1/abort_requests`` (seen on the real CPU
  build; tests/test_vllm_real.py).
- 0.33: as 0.32, top-k lists not cut.

Sampling is fully specified: vLLM's ``SamplingParams`` defaults are neutral, but
``/v1/completions`` fills every unset field from the model's ``generation_config.json``
(Qwen ships ``top_k=20, repetition_penalty=1.05``), so temperature, top-p, top-k, min-p and the
penalties are always sent. Which kind of logprob comes back is a server flag
(``--logprobs-mode``); it is read from ``/server_info`` when vLLM runs in dev mode, or declared
by whoever starts Turnstile, and otherwise vLLM's default (``raw_logprobs``) is assumed.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence

import orjson

from ..media import MediaPrompt
from .base import (
    PROCESSED_LOGITS,
    PROCESSED_LOGPROBS,
    RAW_LOGITS,
    RAW_LOGPROBS,
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
    EngineUnusable,
    HTTPEngine,
    error_message,
    new_request_id,
    version_tuple,
)
from .prompt_json import wire_ids
from .routing import parse_option
from .vllm_media import content_parts
from .vllm_reader import COMPLETIONS, GENERATE, Reader, RouteGone

LOGPROBS_MODES = (RAW_LOGPROBS, PROCESSED_LOGPROBS, RAW_LOGITS, PROCESSED_LOGITS)
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
SCALE_OUT_HINT = (
    "vLLM serves /inference/v1/generate only when started with "
    "--enable-scale-out (vLLM 0.31 and later): restart it with "
    "`vllm serve ... --enable-scale-out`"
)


def status_of(said: str) -> int:
    head = said.split(" ", 1)[0]
    return int(head) if head.isdigit() else 0


class VLLMServer(HTTPEngine):
    """What every adapter of a vLLM server knows, whichever route it generates through (token
    IDs here, Chat Completions in engine-rendered capture): its version, model and context,
    its ``--logprobs-mode``, and its pause routes."""

    label = "vLLM"

    def __init__(
        self,
        url: str,
        *,
        logprobs_mode: str | None = None,
        timeout: float = ENGINE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ):
        """``logprobs_mode``: the server's ``--logprobs-mode`` when known."""
        super().__init__(url, timeout, connect_timeout)
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
            return (
                "vLLM's --logprobs-mode could not be read (GET /server_info needs "
                "VLLM_SERVER_DEV_MODE=1); assuming vLLM's default raw_logprobs, which are "
                "not behaviour-policy logprobs once temperature != 1, top_p < 1 or "
                "logit_bias change the sampling distribution. For RL start vLLM with "
                "--logprobs-mode processed_logprobs and tell Turnstile "
                "(--engine-logprobs-mode)."
            )
        return logprob_unfitness(self.logprob_kind, params)


# The sampler fields of vLLM's ``SamplingParams`` on either route (wire name → Turnstile's
# SamplingParams field; None: fixed by Turnstile).
SAMPLER_WIRE: dict[str, str | None] = {
    "n": None,
    "max_tokens": "max_tokens",
    "min_tokens": None,
    "ignore_eos": None,
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "seed": "seed",
    "logit_bias": "logit_bias",
    "structured_outputs": "grammar",
}


class VLLMEngine(VLLMServer):
    name = "vllm"

    def sent_sampling(self, params: SamplingParams) -> dict[str, Sent]:
        sent = sent_fields(self._sampling(params, self.route == COMPLETIONS), SAMPLER_WIRE)
        if params.json_schema is not None and "structured_outputs" in sent:
            sent["structured_outputs"] = Sent("json_schema", sent["structured_outputs"].value)
        return sent

    def __init__(
        self,
        url: str,
        *,
        api: str = "auto",
        logprobs_mode: str | None = None,
        timeout: float = ENGINE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        routed_experts: str | None = None,
    ):
        """``api``: "auto" (``/inference/v1/generate`` when the server has it), "generate" or
        "completions". ``logprobs_mode``: the server's ``--logprobs-mode`` when known.
        ``routed_experts``: record each token's routed experts ("on": the server runs with
        ``--enable-return-routed-experts``; see ``engines.routing``)."""
        if api not in ("auto", "generate", "completions"):
            raise ValueError(f"api must be auto, generate or completions, not {api!r}")
        super().__init__(
            url, logprobs_mode=logprobs_mode, timeout=timeout, connect_timeout=connect_timeout
        )
        self.api = api
        self.routing, self.routing_shape = parse_option(routed_experts)
        self.route: str | None = {"generate": GENERATE, "completions": COMPLETIONS}.get(api)
        self._disabled: str | None = None  # why /inference/v1/generate cannot be used
        self.route_note: str | None = None  # the route chosen at start, and why

    async def refresh(self) -> None:
        """The server's facts, then the route (decided once, when the server first answers)."""
        await super().refresh()
        if self.route_note is None:
            await self._choose_route()

    async def _probe(self, route: str) -> tuple[bool | None, str]:
        """Is ``route`` served? An empty body is refused by validation (400/422) where it is,
        and by the route itself where it is missing (404, 405) or switched off (403): nothing
        is generated. None: the server gave no clear answer (not up yet)."""
        status, raw = await self._request("POST", route, {}, timeout=30)
        said = f"{status} {error_message(raw)}".strip()
        if status in (400, 422):
            return True, said
        if status in (403, 404, 405):
            return False, said
        return None, said

    async def _choose_route(self) -> None:
        """``auto``: ``/inference/v1/generate`` where it is served, else ``/v1/completions``;
        a forced route must be served. No usable route: :class:`EngineUnusable`, so that
        ``turnstile serve`` refuses to start instead of answering every call 502."""
        name = f"vLLM {self.version}" if self.version else "vLLM"
        tried: list[str] = []
        for route in (GENERATE, COMPLETIONS):
            if self.api != "auto" and route != self.route:
                continue
            served, said = await self._probe(route)
            if served is None:
                return  # not up yet: decided at the next refresh
            if served:
                self.route, self._disabled = route, None
                why = "" if route == GENERATE or self.api != "auto" else f" ({tried[0]})"
                self.route_note = f"{name} at {self.url}: generating through {route}{why}"
                print(f"turnstile: {self.route_note}", file=sys.stderr, flush=True)
                return
            status = status_of(said)
            scale_out_off = status == 403 or (self._v or (0,)) >= (0, 31)
            hint = f" ({SCALE_OUT_HINT})" if route == GENERATE and scale_out_off else ""
            tried.append(f"{route} answered {said}{hint}")
        routes = " and ".join(tried)
        self._disabled = f"{name} at {self.url} serves no token-in route: {routes}"
        raise EngineUnusable(self._disabled, 502)

    def _route_missing(self, status: int, raw: bytes) -> None:
        """``/inference/v1/generate`` refused a call (403: scale-out off on 0.32+; 404: off on
        0.31, or a vLLM without it): under ``auto`` the call goes to ``/v1/completions``, a
        forced ``generate`` says how to fix the server."""
        if self.api == "auto":
            self.route, self._disabled = COMPLETIONS, None
            return
        name = f"vLLM {self.version}" if self.version else "vLLM"
        hint = SCALE_OUT_HINT if status == 403 or (self._v or (0,)) >= (0, 31) else ""
        self._disabled = (
            f"{name} at {self.url} answered {status} to {GENERATE} "
            f"({error_message(raw)}). {hint or 'This vLLM has no such route'}, or use the "
            f"vLLM completions route (--vllm-api completions)."
        )

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

    def request_body(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        stream: bool,
        request_id: str,
        route: str,
    ) -> dict:
        sent = prompt_ids
        if isinstance(prompt_ids, MediaPrompt):
            if route != GENERATE:
                raise EngineError(
                    "images need vLLM's /inference/v1/generate (vllm serve --enable-scale-out);"
                    " /v1/completions takes no images",
                    400,
                )
            sent = prompt_ids.collapsed()  # vLLM expands each placeholder itself
        if route == GENERATE:
            body: dict = {
                "request_id": request_id,
                "token_ids": wire_ids(sent),
                "sampling_params": self._sampling(params, False),
                "stream": stream,
            }
        else:
            body = {
                "prompt": wire_ids(prompt_ids),
                **self._sampling(params, True),
                "echo": False,
                "stream": stream,
                "request_id": request_id,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            }
            if self.model:
                body["model"] = self.model
            if self._v is None or self._v >= (0, 33):
                body["return_weight_versions"] = True
        if isinstance(prompt_ids, MediaPrompt):  # images: one placeholder each + the bytes
            body["content_parts"] = content_parts(prompt_ids)
            body["return_token_ids"] = True
        if self.routing:  # only the rows the parent's record does not hold
            start = max(0, min(params.rows_from, len(prompt_ids)))
            if route == GENERATE:
                body["sampling_params"]["routed_experts_prompt_start"] = start
            else:
                body["routed_experts_prompt_start"] = start
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _abort_ids(self, route: str, request_id: str) -> list[str]:
        """Engine-side ids: vLLM prefixes the id it was given."""
        if route == GENERATE:
            return [f"generate-tokens-{request_id}"]
        return [f"cmpl-{request_id}-0", f"cmpl-{request_id}"]

    async def _abort(self, ids: list[str]) -> None:
        """``/inference/v1/abort_requests`` (0.32+, scale-out), else ``/abort_requests``
        (``--tokens-only`` or dev mode). Best effort: closing the connection already cancels."""
        for path in ("/inference/v1/abort_requests", "/abort_requests"):
            status, _ = await self._request("POST", path, {"request_ids": ids}, timeout=5)
            if status == 200:
                return

    # generation

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[TokenBatch | Finish]:
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
                raise EngineError(self._disabled, 502) if self._disabled else RouteGone()

        try:
            async for batch in self._generation(
                route,
                orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
                stream,
                Reader(
                    route,
                    params,
                    prompt_ids,
                    self.logprob_kind,
                    self._error,
                    routing=self.routing,
                    media=prompt_ids if isinstance(prompt_ids, MediaPrompt) else None,
                ),
                lambda: self._abort(ids),
                refused,
            ):
                yield batch
        except RouteGone:  # the route is gone and completions will do: try again there
            async for batch in self.generate(prompt_ids, params, stream):
                yield batch
