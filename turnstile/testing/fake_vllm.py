"""A fake vLLM server: ``/inference/v1/generate``, ``/v1/completions``, aborts and metadata,
in the request/response shapes of vLLM 0.29, 0.31, 0.32 and 0.33 (and a pre-0.25 server
without the token-in route), byte for byte where the shape is fixed by vLLM's code.

Shapes follow the vLLM wheels (``vllm/entrypoints/scale_out/token_in_token_out/``):

- non-streamed bodies are ``JSONResponse(model.model_dump())``: Python ``json.dumps`` with
  ``separators=(",", ":")``, every field present (``null`` when unset), in declaration order;
- stream chunks are ``model_dump_json()`` (pydantic-core: compact, ``1e-5`` written
  ``0.00001`` like orjson), 0.31+ leaving out ``prompt_token_ids``/``mm_placeholders``/
  ``metrics`` when unset; the usage chunk is ``exclude_none``; ``data: [DONE]`` ends it;
- an error inside a stream is ``json.dumps(ErrorResponse)`` with default separators;
- 0.29-0.31 logprobs are chat-shaped (``"token": "token_id:N"``, ``bytes: null``), top lists
  cut to ``max(k, 1)``; 0.32 has integer ``token_id`` + ``rank``, still cut; 0.33 not cut;
  ``stop_reason`` and ``weight_versions`` exist from 0.32;
- scale-out switched off: 0.31 has no route (FastAPI's ``{"detail":"Not Found"}``), 0.32+
  answer 403 ``PermissionDeniedError``; ``/inference/v1/abort_requests`` is 0.33 only.

Validation messages are modelled on vLLM's handlers (``serve/exception_handling``) and
``SamplingParams._verify_args``; they were not captured from a running server.
"""

from __future__ import annotations

import json
import time
import uuid

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import toychat
from .fake_server import FakeServer
from .toy_model import EOS, Generation, Step, ToyModel, token_text

MODEL = "fake/tiny-model"
MAX_LOGPROBS = 20


def _dumps_python(obj: object) -> bytes:
    """Starlette ``JSONResponse.render``."""
    return json.dumps(
        obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


def _dumps_pydantic(obj: object) -> bytes:
    """``model_dump_json``: compact; floats as pydantic-core (= orjson) writes them."""
    return orjson.dumps(obj)


def _error(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class _Invalid(Exception):
    def __init__(self, body: dict, status: int = 400):
        super().__init__(body["error"]["message"] if "error" in body else str(body))
        self.body, self.status = body, status


def _validation(loc: str, msg: str, err_type: str, input_repr: str, ctx: str) -> _Invalid:
    """``validation_exception_handler``: ``"N validation error:\\n  {...}"``, 400."""
    text = (
        f"1 validation error:\n  {{'type': '{err_type}', 'loc': '{loc}', 'msg': '{msg}', "
        f"'input': '{input_repr}', 'ctx': {ctx}}}"
    )
    param = loc
    return _Invalid(_error(text, "Bad Request", 400, param))


def _sampling_error(
    message: str, parameter: str | None, sp: dict, value: object = None, v: tuple = (0, 33)
) -> _Invalid:
    if v >= (0, 32):  # as a real 0.32 answers (tests/fakes/golden)
        text = f"{message} (parameter={parameter}, value={value})"
        return _Invalid(_error(text, "BadRequestError", 400, parameter))
    text = (
        f"1 validation error:\n  {{'type': 'value_error', 'loc': 'body.sampling_params', "
        f"'msg': 'Value error, {message}', 'input': '<dict of {len(sp)} items>', "
        f"'ctx': {{'error': VLLMValidationError('{message}')}}}}"
    )
    return _Invalid(_error(text, "Bad Request", 400, parameter or "body.sampling_params"))


class VLLMFake(FakeServer):
    """``version`` defaults to 0.32.0: the test bed's real vLLM, whose recorded answers
    (``tests/fakes/golden/vllm-0.32.0.json``) the fake is held to. The other versions' shapes
    are read from their wheels, not recorded: ask for one by name."""

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
    ):
        super().__init__()
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

    # routes

    def routes(self) -> list:
        routes = [
            Route("/version", self.get_version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
        ]
        if self.has_completions:
            routes.append(Route("/v1/completions", self.completions, methods=["POST"]))
        has_generate = self.v >= (0, 25) and (self.scale_out or self.v < (0, 31))
        if has_generate:
            routes.append(Route("/inference/v1/generate", self.generate, methods=["POST"]))
            if self.v >= (0, 32):  # the real 0.32 CPU build serves it with scale-out too
                routes.append(
                    Route("/inference/v1/abort_requests", self.abort_requests, methods=["POST"])
                )
        elif self.v >= (0, 32):
            paths = ["/inference/v1/generate"] + (
                ["/inference/v1/abort_requests"] if self.v >= (0, 32) else []
            )
            routes += [Route(p, self.disabled, methods=["POST"]) for p in paths]
        if self.dev_mode:
            routes.append(Route("/abort_requests", self.dev_abort_requests, methods=["POST"]))
            routes.append(Route("/server_info", self.server_info, methods=["GET"]))
            routes += [
                Route("/pause", self.pause, methods=["POST"]),
                Route("/resume", self.resume, methods=["POST"]),
                Route("/is_paused", self.is_paused, methods=["GET"]),
                Route("/update_weight_version", self.update_weight_version, methods=["POST"]),
                Route("/weight_info", self.weight_info, methods=["GET"]),
            ]
        return routes

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
            _dumps_python({"object": "list", "data": [card]}), media_type="application/json"
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
            _dumps_python(_error(msg, "PermissionDeniedError", 403)),
            status_code=403,
            media_type="application/json",
        )

    async def abort_requests(self, request: Request) -> Response:
        body = await self.record(request)
        if not isinstance(body, dict) or body.get("request_ids") is None:
            return Response(
                _dumps_python(_error("Missing 'request_ids' in request body", "Bad Request", 400)),
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

    def _check_sampling(self, sp: dict, prompt_len: int, route: str = "generate") -> None:
        if self.v >= (0, 32) and prompt_len > self.max_model_len:  # as a real 0.32 answers
            if route == "generate":
                msg = (
                    f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
                    f"length of {self.max_model_len}. Make sure that `max_model_len` is no "
                    "smaller than the number of text tokens."
                )
                raise _Invalid(_error(msg, "BadRequestError", 400))
            msg = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {prompt_len} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_len})"
            )
            raise _Invalid(_error(msg, "BadRequestError", 400, "input_tokens"))
        t = sp.get("temperature", 1.0)
        if not isinstance(t, (int, float)) or t < 0:
            raise _sampling_error(
                f"temperature must be non-negative, got {float(t)}.", "temperature", sp, t, self.v
            )
        top_p = sp.get("top_p", 1.0)
        if not 0.0 < top_p <= 1.0:
            raise _sampling_error(
                f"top_p must be in (0, 1], got {float(top_p)}.", "top_p", sp, top_p, self.v
            )
        mt = sp.get("max_tokens", 16)
        if mt is not None and mt < 1:
            raise _sampling_error(
                f"max_tokens must be at least 1, got {mt}.", "max_tokens", sp, mt, self.v
            )
        lp = sp.get("logprobs")
        if lp is not None and lp < -1:
            raise _sampling_error(
                f"logprobs must be non-negative or -1, got {lp}.", "logprobs", sp, lp, self.v
            )
        if lp is not None and lp > MAX_LOGPROBS:
            raise _Invalid(
                _error(
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
            raise _Invalid(
                _error(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {mt}. This model's "
                    f"maximum context length is {self.max_model_len} tokens and your request has "
                    f"{prompt_len} input tokens ({mt} > {self.max_model_len} - {prompt_len}).",
                    "BadRequestError",
                    400,
                    "max_tokens",
                )
            )

    def _run(self, rid: str, prompt: list[int], sp: dict) -> Generation:
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

    def _stop_reason(self, gen: Generation) -> int | str | None:
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
    ) -> dict:
        """A (stream) choice of the tokens output mode, fields in declaration order."""
        lp = self._logprobs(steps, k)
        ids = [s.token_id for s in steps]
        if self.v >= (0, 32):
            return {
                "index": 0,
                "finish_reason": finish,
                "stop_reason": self._stop_reason(gen) if finish else None,
                "token_ids": ids,
                "routed_experts": None,
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

    async def generate(self, request: Request) -> Response:
        body = await self.record(request)
        try:
            if not isinstance(body, dict):
                raise _Invalid(_error("JSON decode error", "Bad Request", 400))
            ids = body.get("token_ids")
            if not isinstance(ids, list) or not ids:
                n = len(ids) if isinstance(ids, list) else 0
                if ids is None:
                    raise _validation(
                        "body.token_ids",
                        "Field required",
                        "missing",
                        f"<dict of {len(body)} items>",
                        "{}",
                    )
                raise _validation(
                    "body.token_ids",
                    f"List should have at least 1 item after validation, not {n}",
                    "too_short",
                    f"<list of {n} items>",
                    f"{{'field_type': 'List', 'min_length': 1, 'actual_length': {n}}}",
                )
            if any(not isinstance(t, int) or t < 0 for t in ids):
                raise _validation(
                    "body.token_ids",
                    "Value error, token_ids must not contain negative values",
                    "value_error",
                    f"<list of {len(ids)} items>",
                    "{'error': ValueError('token_ids must not contain negative values')}",
                )
            sp = body.get("sampling_params")
            if not isinstance(sp, dict):
                raise _validation(
                    "body.sampling_params",
                    "Field required",
                    "missing",
                    f"<dict of {len(body)} items>",
                    "{}",
                )
            self._check_sampling(sp, len(ids))
        except _Invalid as exc:
            return Response(
                _dumps_python(exc.body), status_code=exc.status, media_type="application/json"
            )
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return self._failure(status)
        rid = f"generate-tokens-{request.headers.get('x-request-id') or body.get('request_id')}"
        gen = self._run(rid, ids, sp)
        k = sp.get("logprobs")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._stream(rid, gen, k, len(ids), include_usage), media_type="text/event-stream"
            )
        done = await self.until_disconnect_or(request, rid, self._wait(rid, gen))
        if done is None:
            self.rec.sent[rid] = Generation([], "abort")
            return Response(status_code=499)
        sent = done
        finish = "abort" if len(sent.steps) < len(gen.steps) else gen.reason
        usage = self.usage_counts(len(ids), len(sent.steps), True)
        resp = self.whole_body(rid, ids, sent, k, finish, usage, bool(body.get("return_token_ids")))
        raw = _dumps_python(resp)
        self.rec.raw[rid] = [raw]
        if finish != "abort":
            self.rec.finished.append(rid)
        return Response(raw, media_type="application/json")

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
    ) -> dict:
        """The non-streamed ``/inference/v1/generate`` answer, fields in declaration order."""
        created = int(time.time()) if created is None else created
        choice = self.token_choice(sent, sent.steps, k, finish, False, True)
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

    def _failure(self, status: int) -> Response:
        if status == 503:
            body = _error(
                "Generation is paused. Please retry after it resumes.",
                "ServiceUnavailableError",
                503,
            )
        elif status == 500:
            body = _error("Internal server error", "InternalServerError", 500)
        else:
            body = _error("Bad request", "BadRequestError", status)
        return Response(_dumps_python(body), status_code=status, media_type="application/json")

    async def _wait(self, rid: str, gen: Generation) -> Generation:
        for i in range(len(gen.steps)):
            if not await self.pace(rid):
                return Generation(gen.steps[:i], "abort")
        return gen

    async def _stream(
        self, rid: str, gen: Generation, k: int | None, prompt_len: int, include_usage: bool
    ):
        raw: list[bytes] = []
        self.rec.raw[rid] = raw
        sent = 0
        ok = False
        try:
            i = 0
            while i < len(gen.steps):
                n = self.tokens_per_chunk if i else 1
                chunk_steps = gen.steps[i : i + n]
                for _ in chunk_steps:
                    if not await self.pace(rid):
                        # Aborted by request id: 0.32+ send a terminal chunk without tokens.
                        self.rec.sent[rid] = Generation(gen.steps[:i], "abort")
                        tail = [b"data: [DONE]\n\n"]
                        if self.v >= (0, 32):
                            cut = Generation(gen.steps[:i], "abort")
                            tail.insert(
                                0,
                                self.stream_chunk(
                                    rid, self.token_choice(cut, [], k, "abort", True, True)
                                ),
                            )
                        for data in tail:
                            raw.append(data)
                            yield data
                        ok = True
                        return
                if self.fail_mid_stream is not None and i > 0:
                    status, self.fail_mid_stream = self.fail_mid_stream, None
                    err = (
                        _error("Internal server error", "InternalServerError", status)
                        if status == 500
                        else _error(
                            "Generation is paused. Please retry after it resumes.",
                            "ServiceUnavailableError",
                            status,
                        )
                    )
                    for line in (f"data: {json.dumps(err)}\n\n", "data: [DONE]\n\n"):
                        raw.append(line.encode())
                        yield line.encode()
                    ok = True
                    return
                i += len(chunk_steps)
                last = i == len(gen.steps)
                choice = self.token_choice(
                    gen, chunk_steps, k, gen.reason if last else None, True, last
                )
                data = self.stream_chunk(rid, choice)
                sent = i
                raw.append(data)
                yield data
                if self.keep_alive:
                    yield b": keep-alive\n\n"
            if include_usage:
                data = self.usage_chunk(rid, self.usage_counts(prompt_len, len(gen.steps), False))
                raw.append(data)
                yield data
            raw.append(b"data: [DONE]\n\n")
            yield b"data: [DONE]\n\n"
            ok = True
            self.rec.finished.append(rid)
        finally:
            if not ok:
                self.rec.disconnects.append(rid)
                self.rec.sent[rid] = Generation(gen.steps[:sent], "abort")

    def usage_chunk(self, rid: str, usage: dict) -> bytes:
        """A stream's last event before ``[DONE]`` when ``include_usage`` was asked."""
        if self.v >= (0, 32):
            final = {"request_id": rid, "usage": usage, "output_mode": "tokens", "choices": []}
        else:
            final = {"request_id": rid, "choices": [], "usage": usage}
        return b"data: " + _dumps_pydantic(final) + b"\n\n"

    def stream_chunk(self, rid: str, choice: dict) -> bytes:
        if self.v >= (0, 32):
            obj = {"request_id": rid, "usage": None, "output_mode": "tokens", "choices": [choice]}
        elif self.v >= (0, 31):
            obj = {"request_id": rid, "choices": [choice], "usage": None}
        else:
            obj = {"request_id": rid, "choices": [choice], "usage": None}
        return b"data: " + _dumps_pydantic(obj) + b"\n\n"

    # /v1/completions (token-ID prompt, return_token_ids, return_tokens_as_token_ids)

    def _completion_logprobs(self, steps: list[Step], k: int | None, as_ids: bool) -> dict | None:
        if k is None:
            return None
        name = (lambda t: f"token_id:{t}") if as_ids else (lambda t: f"<{t}>")
        out: dict = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        offset = 0
        for s in steps:
            cands = [(s.token_id, s.logprob)] + [(t, v) for t, v in s.top if t != s.token_id]
            out["text_offset"].append(offset)
            out["token_logprobs"].append(max(s.logprob, -9999.0))
            out["tokens"].append(name(s.token_id))
            out["top_logprobs"].append({name(t): max(v, -9999.0) for t, v in cands[: k + 1]})
            offset += len(name(s.token_id))
        return out

    async def completions(self, request: Request) -> Response:
        body = await self.record(request)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), list):
            return Response(
                _dumps_python(
                    _error("prompt must be a list of token ids", "BadRequestError", 400, "prompt")
                ),
                status_code=400,
                media_type="application/json",
            )
        ids = body["prompt"]
        sp = {
            key: body.get(key)
            for key in (
                "temperature",
                "top_p",
                "seed",
                "stop",
                "stop_token_ids",
                "logit_bias",
                "ignore_eos",
                "logprobs",
                "max_tokens",
            )
            if key in body
        }
        sp.setdefault("max_tokens", 16)
        try:
            self._check_sampling(sp, len(ids), "completions")
        except _Invalid as exc:
            return Response(
                _dumps_python(exc.body), status_code=exc.status, media_type="application/json"
            )
        rid = f"cmpl-{body.get('request_id') or 'x'}"
        gen = self._run(rid, ids, sp)
        k = body.get("logprobs")
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        with_ids = bool(body.get("return_token_ids"))
        wv = bool(body.get("return_weight_versions")) and self.v >= (0, 33)
        created = int(time.time())
        text = "".join(f"<{s.token_id}>" for s in gen.steps if s.token_id != EOS)

        def choice(steps: list[Step], finish: str | None, first: bool, last: bool) -> dict:
            c = {
                "index": 0,
                "text": "".join(f"<{s.token_id}>" for s in steps),
                "logprobs": self._completion_logprobs(steps, k, as_ids),
                "finish_reason": finish,
                "stop_reason": self._stop_reason(gen) if finish else None,
            }
            if body.get("stream"):
                c["prompt_token_ids"] = ids if (first and with_ids) else None
                c["token_ids"] = [s.token_id for s in steps] if with_ids else None
                if self.v >= (0, 33):
                    c["weight_versions"] = self.spans(gen) if (wv and last) else None
            return c

        if body.get("stream"):

            async def events():
                ok = False
                try:
                    for i, s in enumerate(gen.steps):
                        await self.pace(rid)
                        last = i == len(gen.steps) - 1
                        c = choice([s], gen.reason if last else None, i == 0, last)
                        obj = {
                            "id": rid,
                            "object": "text_completion",
                            "created": created,
                            "model": self.served_model,
                            "choices": [c],
                        }
                        if self.v < (0, 32):
                            obj["kv_transfer_params"] = None
                        yield b"data: " + _dumps_pydantic(obj) + b"\n\n"
                    usage = self.usage_counts(len(ids), len(gen.steps), False)
                    final = {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": self.served_model,
                        "choices": [],
                        "usage": usage,
                    }
                    if self.v >= (0, 32):
                        final["system_fingerprint"] = self.fingerprint
                    yield b"data: " + _dumps_pydantic(final) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    ok = True
                    self.rec.finished.append(rid)
                finally:
                    if not ok:
                        self.rec.disconnects.append(rid)

            return StreamingResponse(events(), media_type="text/event-stream")
        if await self.until_disconnect_or(request, rid, self._wait(rid, gen)) is None:
            return Response(status_code=499)
        c = choice(gen.steps, gen.reason, True, True)
        c["text"] = text
        c.update(
            token_ids=gen.ids if with_ids else None,
            prompt_logprobs=None,
            prompt_token_ids=ids if with_ids else None,
            routed_experts=None,
        )
        if self.v >= (0, 33):
            c["weight_versions"] = self.spans(gen) if wv else None
        resp = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": self.served_model,
            "choices": [c],
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": self.usage_counts(len(ids), len(gen.steps), True),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
        self.rec.finished.append(rid)
        return Response(_dumps_python(resp), media_type="application/json")

    # /v1/chat/completions: the engine renders (``return_token_ids``, ``logprobs``,
    # ``return_weight_versions``). Shapes modelled on vLLM's chat_completion protocol/serving:
    # the whole response is ``model_dump()`` (unset fields null); stream chunks are
    # ``exclude_unset`` dumps, so ``prompt_token_ids`` is on the first chunk only and only when
    # asked, while ``token_ids`` and ``logprobs`` are always passed (null when not asked); a
    # chunk whose text is empty is sent only when ids or logprobs were asked for;
    # ``weight_versions`` (0.33) is on the final chunk of a choice.

    async def detokenize(self, request: Request) -> Response:
        body = await self.record(request) or {}
        ids = [int(t) for t in body.get("tokens") or []]
        text = "".join(
            toychat.piece(t)
            if t in toychat.SPECIAL or t in toychat.TEXT or t >= 1000
            # the generation vocabulary's ids (the chat script's are its specials and 300+)
            else token_text(t)
            for t in ids
        )
        return Response(_dumps_python({"prompt": text}), media_type="application/json")

    def _chat_logprobs(self, ids: list[int], start: int, k: int) -> list[dict]:
        out = []
        for i, tid in enumerate(ids, start):
            lp = toychat.logprob(tid, i)
            tok = toychat.piece(tid)
            top = [(tok, lp)] + [(f"alt{j}", lp - 1 - j) for j in range(max(k - 1, 0))]
            out.append(
                {
                    "token": tok,
                    "logprob": lp,
                    "bytes": list(tok.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top[:k]
                    ],
                }
            )
        return out

    def _chat_spans(self, n: int) -> list[dict]:
        spans: list[dict] = []
        for i in range(n):
            v = self.version_of(i)
            if spans and spans[-1]["version"] == v:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": v, "start": i, "end": i + 1})
        return spans

    async def chat_completions(self, request: Request) -> Response:
        body = await self.record(request)
        msgs = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(msgs, list) or not msgs:
            return Response(
                _dumps_python(
                    _error("messages must be a non-empty list", "BadRequestError", 400, "messages")
                ),
                status_code=400,
                media_type="application/json",
            )
        if body.get("model") not in (None, self.served_model):
            return Response(
                _dumps_python(
                    _error(
                        f"The model `{body['model']}` does not exist.",
                        "NotFoundError",
                        404,
                        "model",
                    )
                ),
                status_code=404,
                media_type="application/json",
            )
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return self._failure(status)
        prompt = toychat.render(msgs)
        room = self.max_model_len - len(prompt)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or room
        if max_tokens > room:
            return Response(
                _dumps_python(
                    _error(
                        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                        f"model's maximum context length is {self.max_model_len} tokens and your "
                        f"request has {len(prompt)} input tokens ({max_tokens} > "
                        f"{self.max_model_len} - {len(prompt)}).",
                        "BadRequestError",
                        400,
                        "max_tokens",
                    )
                ),
                status_code=400,
                media_type="application/json",
            )
        replies = [self.chat.reply(msgs, max_tokens, i) for i in range(body.get("n") or 1)]
        rid = "chatcmpl-" + (request.headers.get("x-request-id") or uuid.uuid4().hex)
        created = int(time.time())
        with_ids = bool(body.get("return_token_ids"))
        k = body.get("top_logprobs") or 0
        want_lp = bool(body.get("logprobs"))
        wv = bool(body.get("return_weight_versions")) and self.v >= (0, 33)
        self.chat_log.append(
            {
                "id": rid,
                "stream": bool(body.get("stream")),
                "body": body,
                "prompt_token_ids": prompt,
                "choices": [
                    {
                        "token_ids": r.ids,
                        "finish_reason": r.finish_reason,
                        "logprobs": [toychat.logprob(t, i) for i, t in enumerate(r.ids)],
                    }
                    for r in replies
                ],
            }
        )
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + sum(len(r.ids) for r in replies),
            "completion_tokens": sum(len(r.ids) for r in replies),
            "prompt_tokens_details": None,
        }
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            return StreamingResponse(
                self._chat_stream(
                    rid,
                    created,
                    prompt,
                    replies,
                    with_ids,
                    want_lp,
                    k,
                    wv,
                    usage if opts.get("include_usage") else None,
                ),
                media_type="text/event-stream",
            )
        for r in replies:  # generation takes token_delay per token
            for _ in r.ids:
                await self.pace(rid)
        choices = []
        for i, r in enumerate(replies):
            c: dict = {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": r.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning": None,
                },
                "logprobs": {"content": self._chat_logprobs(r.ids, 0, k)} if want_lp else None,
                "finish_reason": r.finish_reason,
                "stop_reason": None,
                "token_ids": r.ids if with_ids else None,
            }
            if self.v >= (0, 32):  # as a real 0.32 answers (tests/fakes/golden)
                if not c["message"]["tool_calls"]:
                    del c["message"]["tool_calls"]
                c["routed_experts"] = None
            if self.v >= (0, 33):
                c["weight_versions"] = self._chat_spans(len(r.ids)) if wv else None
            choices.append(c)
        resp = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": self.served_model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if with_ids else None,
            "kv_transfer_params": None,
        }
        if self.v >= (0, 32):
            resp.update(prompt_text=None, ec_transfer_params=None, metrics=None)
            resp["usage"] = {**usage, "completion_tokens_details": None}
        return Response(_dumps_python(resp), media_type="application/json")

    async def _chat_stream(
        self,
        rid: str,
        created: int,
        prompt: list[int],
        replies: list[toychat.Reply],
        with_ids: bool,
        want_lp: bool,
        k: int,
        wv: bool,
        usage: dict | None,
    ):
        def chunk(choice: dict, first: bool = False) -> bytes:
            obj: dict = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.served_model,
                "choices": [choice],
            }
            if first and self.v >= (0, 32):  # both, null when not asked (a real 0.32)
                obj["prompt_token_ids"] = prompt if with_ids else None
                obj["prompt_text"] = None
            elif first and with_ids:
                obj["prompt_token_ids"] = prompt
            return b"data: " + _dumps_pydantic(obj) + b"\n\n"

        for i in range(len(replies)):
            yield chunk(
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                },
                first=i == 0,
            )
        sent = False
        for i, r in enumerate(replies):
            for pos, tid in enumerate(r.ids):
                await self.pace(rid)
                if self.fail_mid_stream is not None and sent:
                    status, self.fail_mid_stream = self.fail_mid_stream, None
                    err = _error("Internal server error", "InternalServerError", status)
                    yield f"data: {json.dumps(err)}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                    return
                last = pos == len(r.ids) - 1
                text = "" if tid in toychat.SPECIAL else toychat.piece(tid)
                if not (text or last or with_ids or want_lp):
                    continue
                c = {
                    "index": i,
                    "delta": {"content": text},
                    "logprobs": {"content": self._chat_logprobs([tid], pos, k)}
                    if want_lp
                    else None,
                    "finish_reason": r.finish_reason if last else None,
                    "token_ids": [tid] if with_ids else None,
                }
                if last:
                    c["stop_reason"] = None
                    if wv:
                        c["weight_versions"] = self._chat_spans(len(r.ids))
                yield chunk(c)
                sent = True
        if usage is not None:
            final = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.served_model,
                "choices": [],
                "usage": usage,
            }
            if self.v >= (0, 32):  # the stream's usage leaves the null details out
                final["usage"] = {k: v for k, v in usage.items() if v is not None}
                final["system_fingerprint"] = self.fingerprint
            yield b"data: " + _dumps_pydantic(final) + b"\n\n"
        yield b"data: [DONE]\n\n"
