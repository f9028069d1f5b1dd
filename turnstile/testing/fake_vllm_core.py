"""The fake vLLM's core: what its routes share (the toy model, sampling checks, pacing,
routing) and the token-in route ``/inference/v1/generate`` with vLLM's admin routes. The
wire shapes are described in :mod:`turnstile.testing.fake_vllm`."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import routing, toychat
from .fake_server import FakeServer, sse
from .fake_vllm_wire import Invalid, dumps_pydantic, dumps_python, error, sampling_error
from .toy_model import EOS, Generation, Step, ToyModel

MODEL = "fake/tiny-model"
MAX_LOGPROBS = 20


class VLLMCore(FakeServer):
    """The fake vLLM's state, sampling and token-in route; ``fake_vllm.VLLMFake`` adds the
    route table (the other route families live in their own modules)."""

    def __init__(
        self,
        version: str = "0.32.0",
        *,
        scale_out: bool = True,
        logprobs_mode: str = "raw_logprobs",
        dev_mode: bool = False,
        max_model_len: int = 4096,
        tokens_per_chunk: int = 1,
        keep_alive: bool = False,
        completions: bool = True,
        routed_experts: routing.Router | None = None,
    ):
        super().__init__()
        self.router = routed_experts  # None: the server runs without routing capture
        self.weights = 0  # nonzero: prompt logprobs from other pseudo-weights (verify's tests)
        self.has_completions = completions  # False: no /v1/completions (no token-in route)
        self.version = version
        self.v = tuple(int(x) for x in version.split(".")[:2])
        self.scale_out = scale_out
        self.dev_mode = dev_mode
        self.max_model_len = max_model_len
        self.tokens_per_chunk = tokens_per_chunk
        self.keep_alive = keep_alive  # SSE comment lines between chunks (--sse-keep-alive)
        self.model = ToyModel(logprobs_mode)
        self.logprobs_mode = logprobs_mode
        self.chat = toychat.ChatScript()  # what /v1/chat/completions answers
        self.chat_log: list[dict] = []  # every chat completion: prompt and sampled ids
        self.paused = False  # dev mode's /pause, /resume, /is_paused
        # 0.32 names its build in every completion ("vllm-0.32.0-8a9c8d93"), older ones null
        self.fingerprint = f"vllm-{version}-fake" if self.v >= (0, 32) else None
        self.served_model = MODEL  # the name it serves (``--served-model-name``)

    async def get_version(self, request: Request) -> Response:
        return JSONResponse({"version": self.version})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.served_model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.served_model,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                    "object": "model_permission",
                    "created": int(time.time()),
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return Response(
            dumps_python({"object": "list", "data": [card]}), media_type="application/json"
        )

    async def server_info(self, request: Request) -> Response:
        config = {
            "model_config": {
                "model": self.served_model,
                "max_model_len": self.max_model_len,
                "logprobs_mode": self.logprobs_mode,
            }
        }
        if request.query_params.get("config_format") != "json":
            config = str(config)  # type: ignore[assignment]
        return JSONResponse({"vllm_config": config, "vllm_env": {}, "system_env": {}})

    async def disabled(self, request: Request) -> Response:
        await self.record(request)
        msg = (
            "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out "
            "to enable them."
        )
        return Response(
            dumps_python(error(msg, "PermissionDeniedError", 403)),
            status_code=403,
            media_type="application/json",
        )

    async def abort_requests(self, request: Request) -> Response:
        body = await self.record(request)
        if not isinstance(body, dict) or body.get("request_ids") is None:
            return Response(
                dumps_python(error("Missing 'request_ids' in request body", "Bad Request", 400)),
                status_code=400,
                media_type="application/json",
            )
        self.abort(list(body["request_ids"]))
        return Response(status_code=200)

    # dev mode (``VLLM_SERVER_DEV_MODE=1``): vLLM's RL routes, answers as 0.32 gives them

    async def pause(self, request: Request) -> Response:
        await self.record(request)
        self.paused = True
        return JSONResponse({"status": "paused"})

    async def resume(self, request: Request) -> Response:
        await self.record(request)
        self.paused = False
        return JSONResponse({"status": "resumed"})

    async def is_paused(self, request: Request) -> Response:
        return JSONResponse({"is_paused": self.paused})

    async def update_weight_version(self, request: Request) -> Response:
        """The version every token sampled from now on is reported with."""
        body = await self.record(request) or {}
        self.weight_version = str(body.get("new_version"))
        return JSONResponse({"success": True, "new_version": self.weight_version})

    async def weight_info(self, request: Request) -> Response:
        return JSONResponse({"weight_version": self.weight_version})

    async def dev_abort_requests(self, request: Request) -> Response:
        body = await self.record(request) or {}
        ids = list(body.get("request_ids") or [])
        self.abort(ids)
        return JSONResponse({"status": "aborted", "aborted": len(ids)})

    # /inference/v1/generate

    def check_sampling(self, sp: dict, prompt_len: int, route: str = "generate") -> None:
        if self.v >= (0, 32) and prompt_len > self.max_model_len:  # as a real 0.32 answers
            if route == "generate":
                msg = (
                    f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
                    f"length of {self.max_model_len}. Make sure that `max_model_len` is no "
                    "smaller than the number of text tokens."
                )
                raise Invalid(error(msg, "BadRequestError", 400))
            msg = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {prompt_len} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_len})"
            )
            raise Invalid(error(msg, "BadRequestError", 400, "input_tokens"))
        t = sp.get("temperature", 1.0)
        if not isinstance(t, (int, float)) or t < 0:
            raise sampling_error(
                f"temperature must be non-negative, got {float(t)}.", "temperature", sp, t, self.v
            )
        top_p = sp.get("top_p", 1.0)
        if not 0.0 < top_p <= 1.0:
            raise sampling_error(
                f"top_p must be in (0, 1], got {float(top_p)}.", "top_p", sp, top_p, self.v
            )
        mt = sp.get("max_tokens", 16)
        if mt is not None and mt < 1:
            raise sampling_error(
                f"max_tokens must be at least 1, got {mt}.", "max_tokens", sp, mt, self.v
            )
        lp = sp.get("logprobs")
        if lp is not None and lp < -1:
            raise sampling_error(
                f"logprobs must be non-negative or -1, got {lp}.", "logprobs", sp, lp, self.v
            )
        if lp is not None and lp > MAX_LOGPROBS:
            raise Invalid(
                error(
                    f"Requested sample logprobs of {lp}, which is greater than "
                    f"max allowed: {MAX_LOGPROBS}"
                    + (f" (parameter=logprobs, value={lp})" if self.v >= (0, 32) else ""),
                    "BadRequestError",
                    400,
                    "logprobs",
                )
            )
        if mt is not None and prompt_len + mt > self.max_model_len and self.v >= (0, 32):
            sp["max_tokens"] = self.max_model_len - prompt_len  # 0.32 stops at the context's end
        elif mt is not None and prompt_len + mt > self.max_model_len:
            raise Invalid(
                error(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {mt}. This model's "
                    f"maximum context length is {self.max_model_len} tokens and your request has "
                    f"{prompt_len} input tokens ({mt} > {self.max_model_len} - {prompt_len}).",
                    "BadRequestError",
                    400,
                    "max_tokens",
                )
            )

    def check_routing_start(self, sp: dict, prompt_len: int) -> None:
        """``InputProcessor``'s check (0.32+), made whether or not routing is captured."""
        start = sp.get("routed_experts_prompt_start", 0)
        if self.v >= (0, 32) and not 0 <= start <= prompt_len:
            raise sampling_error(
                f"routed_experts_prompt_start must be between 0 and the prompt length "
                f"({prompt_len}), inclusive.",
                "routed_experts_prompt_start",
                sp,
                start,
                self.v,
            )

    def routed(self, prompt: list[int], steps: list[Step], start: int) -> str | None:
        """The ``routed_experts`` of a finished request: rows from ``start`` (clamped as
        vLLM's connector does) to the last forwarded token; None without capture."""
        if self.router is None or self.v < (0, 32):
            return None
        ids = prompt + [s.token_id for s in steps]
        lo, hi = routing.forwarded(len(prompt), len(steps), start)
        rows = self.router.rows(ids[:hi])[lo:hi]
        return routing.vllm_b64(rows, self.router.experts)

    def sample(self, rid: str, prompt: list[int], sp: dict) -> Generation:
        k = sp.get("logprobs")
        gen = self.model.generate(
            prompt,
            max_tokens=sp.get("max_tokens") or 16,
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            seed=sp.get("seed"),
            stop=sp.get("stop") or [],
            stop_token_ids=sp.get("stop_token_ids") or [],
            logit_bias=sp.get("logit_bias") or {},
            ignore_eos=bool(sp.get("ignore_eos")),
            k=max(k or 0, 0),
            version=self.version_of,
        )
        self.rec.sent[rid] = gen
        return gen

    def _logprobs(self, steps: list[Step], k: int | None) -> dict | None:
        """``_create_tokens_logprobs`` per version: the sampled token first, then the top k."""
        if k is None:
            return None
        content: list[dict] = []
        for s in steps:
            cands = [(s.token_id, s.logprob, s.rank)]
            cands += [(t, v, r + 1) for r, (t, v) in enumerate(s.top) if t != s.token_id]
            if self.v < (0, 33):
                cands = cands[: max(k, 1)] if k != -1 else cands
            lp = max(s.logprob, -9999.0)
            if self.v >= (0, 32):
                content.append(
                    {
                        "token_id": s.token_id,
                        "logprob": lp,
                        "rank": s.rank or None,
                        "top_logprobs": [
                            {"token_id": t, "logprob": max(v, -9999.0), "rank": r or None}
                            for t, v, r in cands
                        ],
                    }
                )
            else:
                content.append(
                    {
                        "token": f"token_id:{s.token_id}",
                        "logprob": lp,
                        "bytes": None,
                        "top_logprobs": [
                            {"token": f"token_id:{t}", "logprob": max(v, -9999.0), "bytes": None}
                            for t, v, _ in cands
                        ],
                    }
                )
        return {"content": content}

    def stop_reason(self, gen: Generation) -> int | str | None:
        if gen.stop_token is not None and gen.stop_token != EOS:
            return gen.stop_token
        return gen.stop_string

    def usage_counts(self, prompt_len: int, n: int, none_fields: bool) -> dict:
        u: dict = {"prompt_tokens": prompt_len, "total_tokens": prompt_len + n}
        u["completion_tokens"] = n
        if none_fields:
            u.update(prompt_tokens_details=None, completion_tokens_details=None)
        return u

    def token_choice(
        self,
        gen: Generation,
        steps: list[Step],
        k: int | None,
        finish: str | None,
        stream: bool,
        final: bool,
        routed: str | None = None,
    ) -> dict:
        """A (stream) choice of the tokens output mode, fields in declaration order."""
        lp = self._logprobs(steps, k)
        ids = [s.token_id for s in steps]
        if self.v >= (0, 32):
            return {
                "index": 0,
                "finish_reason": finish,
                "stop_reason": self.stop_reason(gen) if finish else None,
                "token_ids": ids,
                "routed_experts": routed,
                "sampling_mask": None,
                "weight_versions": self.spans(gen) if final else None,
                "logprobs": lp,
            }
        return {
            "index": 0,
            "logprobs": lp,
            "finish_reason": finish,
            "token_ids": ids,
            "routed_experts": None,
            "sampling_mask": None,
        }

    def whole_body(
        self,
        rid: str,
        ids: list[int],
        sent: Generation,
        k: int | None,
        finish: str,
        usage: object,
        return_token_ids: bool,
        created: int | None = None,
        routed: str | None = None,
    ) -> dict:
        """The non-streamed ``/inference/v1/generate`` answer, fields in declaration order."""
        created = int(time.time()) if created is None else created
        choice = self.token_choice(sent, sent.steps, k, finish, False, True, routed)
        if self.v >= (0, 31):
            resp = {
                "request_id": rid,
                "model": self.served_model,
                "created": created,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_id_logprobs": None,
                "prompt_token_ids": ids if return_token_ids else None,
                "mm_placeholders": None,
                "metrics": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
            }
            if self.v >= (0, 32):
                resp["output_mode"] = "tokens"
            resp["choices"] = [choice]
        else:
            resp = {
                "request_id": rid,
                "model": self.served_model,
                "created": created,
                "choices": [choice],
                "usage": usage,
                "prompt_logprobs": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
            }
        return resp

    def failure(self, status: int) -> Response:
        if status == 503:
            body = error(
                "Generation is paused. Please retry after it resumes.",
                "ServiceUnavailableError",
                503,
            )
        elif status == 500:
            body = error("Internal server error", "InternalServerError", 500)
        else:
            body = error("Bad request", "BadRequestError", status)
        return Response(dumps_python(body), status_code=status, media_type="application/json")

    async def paced(self, rid: str, gen: Generation) -> Generation:
        for i in range(len(gen.steps)):
            if not await self.pace(rid):
                return Generation(gen.steps[:i], "abort")
        return gen

    def usage_chunk(self, rid: str, usage: dict) -> bytes:
        """A stream's last event before ``[DONE]`` when ``include_usage`` was asked."""
        if self.v >= (0, 32):
            final = {"request_id": rid, "usage": usage, "output_mode": "tokens", "choices": []}
        else:
            final = {"request_id": rid, "choices": [], "usage": usage}
        return sse(dumps_pydantic(final))

    def stream_chunk(self, rid: str, choice: dict) -> bytes:
        if self.v >= (0, 32):
            obj = {"request_id": rid, "usage": None, "output_mode": "tokens", "choices": [choice]}
        elif self.v >= (0, 31):
            obj = {"request_id": rid, "choices": [choice], "usage": None}
        else:
            obj = {"request_id": rid, "choices": [choice], "usage": None}
        return sse(dumps_pydantic(obj))
