"""A fake SGLang 0.5.x server: ``/generate`` with ``input_ids``, ``/abort_request``, metadata.

Shapes follow the SGLang 0.5.23 wheel (``srt/entrypoints/http_server.py``,
``srt/managers/tokenizer_manager.py``, ``api/v1/api_types.py``):

- bodies and stream events are ``orjson`` dumps; a stream is ``data: {...}\\n\\n`` events then
  ``data: [DONE]\\n\\n``;
- ``{"text", "output_ids", "meta_info"}``; ``meta_info`` keys in the order the tokenizer
  manager adds them: ``id, finish_reason, prompt_tokens, weight_version, num_retractions``,
  the logprob lists (``[logprob, token_id, null]`` triples), ``reasoning_tokens,
  completion_tokens, cached_tokens, weight_versions``, then ``e2e_latency`` when finished and
  ``response_sent_to_client_ts`` on the first event sent;
- cumulative streaming by default (``output_ids``, ``text`` and the logprob lists repeat
  everything so far; with ``skip_events`` some intermediate events are dropped, as a slow
  client sees them), or incremental deltas (``incremental=True``, i.e.
  ``--incremental-streaming-output``; ``tokens_per_event`` coalesces queued deltas);
- the sampled stop token stays in ``output_ids`` and is trimmed from ``text`` only;
- errors: ``sampling_params`` with an unknown key is refused by the contract check with
  ``{"error": "unknown field ..."}``; request validation (``ValueError``) is
  ``{"error": {"message"}}`` with 400, or, once a stream has started, an in-band
  ``{"error": {"message", "type": "invalid_request_error", "code", "retryable"}}`` event;
  an ``HTTPException`` (e.g. 503) is ``{"object": "error", "message", "type": "503",
  "param": null, "code": 503}``.
"""

from __future__ import annotations

import time
import uuid

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from . import toychat
from .fake_server import FakeServer
from .toy_model import EOS, Generation, Step, ToyModel, token_text

MODEL = "fake/tiny-model"
SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)


def _json(obj: object, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


class _Invalid(ValueError):
    pass


class SGLangFake(FakeServer):
    def __init__(
        self,
        *,
        incremental: bool = False,
        context_len: int = 4096,
        original_logprobs: bool = False,
        skip_events: int = 0,
        tokens_per_event: int = 1,
    ):
        super().__init__()
        self.incremental = incremental
        self.context_len = context_len
        self.skip_events = skip_events  # cumulative: drop this many events after each one sent
        self.tokens_per_event = tokens_per_event  # incremental: coalesced deltas
        self.model = ToyModel("raw_logprobs" if original_logprobs else "scaled_logprobs")
        self.chat = toychat.ChatScript()  # what /v1/chat/completions answers
        self.chat_log: list[dict] = []
        self.no_logprobs: set[str] = set()  # rids asked without return_logprob

    def routes(self) -> list:
        return [
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/detokenize", self.detokenize, methods=["POST"]),
        ]

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        card = {
            "id": MODEL,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": MODEL,
            "parent": None,
            "max_model_len": self.context_len,
        }
        return _json({"object": "list", "data": [card]})

    async def model_info(self, request: Request) -> Response:
        return _json(
            {
                "model_path": MODEL,
                "served_model_name": MODEL,
                "tokenizer_path": MODEL,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
            }
        )

    async def server_info(self, request: Request) -> Response:
        return _json(
            {
                "model_path": MODEL,
                "context_length": self.context_len,  # as with --context-length
                "incremental_streaming_output": self.incremental,
                "skip_tokenizer_init": False,
                "version": "0.5.23",
                "frontend": "python",
            }
        )

    async def abort_request(self, request: Request) -> Response:
        body = await self.record(request) or {}
        if body.get("abort_all"):
            self.abort(list(self.rec.sent))
        elif body.get("rid"):
            self.abort([body["rid"]])
        return Response(status_code=200)

    # /generate

    def _validate(self, body: dict) -> tuple[list[int], dict]:
        sp = body.get("sampling_params") or {}
        ids = body.get("input_ids")
        if isinstance(ids, list) and not ids:  # as a real 0.5.23 answers (tests/fakes/golden)
            raise _Invalid("input_ids cannot be empty.")
        if not isinstance(ids, list):
            raise _Invalid("Either text, input_ids or input_embeds should be provided.")
        t = sp.get("temperature", 1.0)
        if t < 0:
            raise _Invalid(f"temperature must be a non-negative finite number, got {t}.")
        top_p = sp.get("top_p", 1.0)
        if not 0.0 < top_p <= 1.0:
            raise _Invalid(f"top_p must be in (0, 1], got {top_p}.")
        top_k = sp.get("top_k", -1)
        if top_k is not None and top_k < 1 and top_k != -1:
            raise _Invalid(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        mnt = sp.get("max_new_tokens", 128)
        if mnt is not None and mnt < 0:
            raise _Invalid(f"max_new_tokens must be at least 0, got {mnt}.")
        if len(ids) >= self.context_len:
            raise _Invalid(
                f"The input ({len(ids)} tokens) is longer than the model's context "
                f"length ({self.context_len} tokens)."
            )
        if mnt is not None and mnt + len(ids) > self.context_len:
            raise _Invalid(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens. You requested a total of {mnt + len(ids)} tokens: "
                f"{len(ids)} tokens from the input messages and {mnt} tokens for the "
                f"completion. Please reduce the number of tokens in the input messages or the "
                f"completion to fit within the limit."
            )
        return ids, sp

    def _contract_error(self, body: object) -> str | None:
        if not isinstance(body, dict):
            return "invalid type: sequence, expected struct GenerateRequest"
        sp = body.get("sampling_params")
        if isinstance(sp, dict):
            for key in sp:
                if key not in SAMPLING_FIELDS:
                    listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
                    return f"unknown field `{key}`, expected one of {listed}"
        return None

    async def generate(self, request: Request) -> Response:
        body = await self.record(request)
        if (err := self._contract_error(body)) is not None:
            return _json({"error": err}, 400)
        stream = bool(body.get("stream"))
        try:
            ids, sp = self._validate(body)
        except _Invalid as exc:
            if stream:
                return StreamingResponse(
                    self._error_stream(str(exc)), media_type="text/event-stream"
                )
            return _json({"error": {"message": str(exc)}}, 400)
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return _json(
                {
                    "object": "error",
                    "message": "The server is overloaded, retry later.",
                    "type": str(status),
                    "param": None,
                    "code": status,
                },
                status,
            )
        rid = body.get("rid") or "sglang-rid"
        k = int(body.get("top_logprobs_num") or 0)
        gen = self.model.generate(
            ids,
            max_tokens=sp.get("max_new_tokens", 128),
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            seed=sp.get("sampling_seed"),
            stop=sp.get("stop") or [],
            stop_token_ids=sp.get("stop_token_ids") or [],
            logit_bias=sp.get("logit_bias"),
            ignore_eos=bool(sp.get("ignore_eos")),
            k=k,
            version=self.version_of,
        )
        self.rec.sent[rid] = gen
        if not body.get("return_logprob"):
            self.no_logprobs.add(rid)
        started = time.time()
        if stream:
            return StreamingResponse(
                self._stream(rid, gen, len(ids), k, started), media_type="text/event-stream"
            )
        done = await self.until_disconnect_or(request, rid, self._wait(rid, gen))
        if done is None:
            self.rec.sent[rid] = Generation([], "abort")
            return Response(status_code=499)
        out = self._out(
            rid, done, done.steps, len(ids), k, finished=True, first=True, started=started
        )
        raw = orjson.dumps(out)
        self.rec.raw[rid] = [raw]
        if done.reason != "abort":
            self.rec.finished.append(rid)
        return Response(raw, media_type="application/json")

    async def _wait(self, rid: str, gen: Generation) -> Generation:
        for i in range(len(gen.steps)):
            if not await self.pace(rid):
                return Generation(gen.steps[:i], "abort")
        return gen

    async def _error_stream(self, message: str):
        err = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
        }
        yield b"data: " + orjson.dumps(err) + b"\n\n"
        yield b"data: [DONE]\n\n"

    def _finish_reason(self, gen: Generation, finished: bool) -> dict | None:
        if not finished:
            return None
        if gen.reason == "abort":
            return {
                "type": "abort",
                "message": "Abort before decode.",
                "status_code": None,
                "err_type": None,
            }
        if gen.reason == "length":
            return {"type": "length", "length": len(gen.steps)}
        return {
            "type": "stop",
            "matched": gen.stop_token if gen.stop_token is not None else gen.stop_string,
        }

    def _out(
        self,
        rid: str,
        gen: Generation,
        steps: list[Step],
        prompt_len: int,
        k: int,
        finished: bool,
        first: bool,
        started: float,
        total: int | None = None,
        text: str | None = None,
    ) -> dict:
        """One response dict; ``steps`` are what this event carries (all so far when
        cumulative, the delta when incremental); ``total`` counts every output token so far."""
        total = len(steps) if total is None else total
        meta: dict = {
            "id": rid,
            "finish_reason": self._finish_reason(gen, finished),
            "prompt_tokens": prompt_len,
            "weight_version": self.weight_version,
            "num_retractions": 0,
        }
        if rid not in self.no_logprobs:  # a real 0.5.23 writes them only when asked
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [(s.logprob, s.token_id, None) for s in steps]
            meta["output_token_logprobs_length"] = total
        if k > 0 and rid not in self.no_logprobs:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [[(v, t, None) for t, v in s.top] for s in steps]
        meta.update(reasoning_tokens=0, completion_tokens=total, cached_tokens=0)
        upto = Generation(gen.steps[:total], gen.reason)
        spans = self.spans(upto)
        if spans and finished:  # a real 0.5.23 writes the spans on the final event only
            meta["weight_versions"] = spans
        if spans:
            meta["weight_version"] = spans[-1]["version"]
        meta["cached_tokens_details"] = {"device": 0, "host": 0}  # as 0.5.23 (null uncached)
        meta["dp_rank"] = None
        if finished:
            meta["e2e_latency"] = round(time.time() - started, 6)
        if first:
            meta["response_sent_to_client_ts"] = time.time()
        if text is None:
            stop = gen.stop_token is not None and finished
            shown = steps[:-1] if stop and steps and steps[-1].token_id == gen.stop_token else steps
            text = "".join(token_text(s.token_id) for s in shown if s.token_id != EOS)
        return {"text": text, "output_ids": [s.token_id for s in steps], "meta_info": meta}

    async def _stream(self, rid: str, gen: Generation, prompt_len: int, k: int, started: float):
        raw: list[bytes] = []
        self.rec.raw[rid] = raw
        sent, first, ok = 0, True, False
        n = len(gen.steps)
        try:
            i = 0
            skipped = 0
            while i < n:
                step = self.tokens_per_event if self.incremental else 1
                for _ in range(min(step, n - i)):
                    if not await self.pace(rid):
                        cut = Generation(gen.steps[:i], "abort")
                        self.rec.sent[rid] = cut
                        delta = cut.steps[sent:] if self.incremental else cut.steps
                        out = self._out(
                            rid, cut, delta, prompt_len, k, True, first, started, total=i
                        )
                        for data in (b"data: " + orjson.dumps(out) + b"\n\n", b"data: [DONE]\n\n"):
                            raw.append(data)
                            yield data
                        ok = True
                        return
                    i += 1
                if self.fail_mid_stream is not None:
                    status, self.fail_mid_stream = self.fail_mid_stream, None
                    err = {
                        "error": {
                            "message": "Internal server error",
                            "type": "invalid_request_error",
                            "code": status,
                            "retryable": False,
                        }
                    }
                    for data in (b"data: " + orjson.dumps(err) + b"\n\n", b"data: [DONE]\n\n"):
                        raw.append(data)
                        yield data
                    ok = True
                    return
                last = i == n
                if not self.incremental and not last and skipped < self.skip_events:
                    skipped += 1  # a slow client only sees the latest cumulative state
                    continue
                skipped = 0
                steps = gen.steps[sent:i] if self.incremental else gen.steps[:i]
                text = None
                if not last:
                    shown = steps
                    text = "".join(token_text(s.token_id) for s in shown)
                out = self._out(
                    rid, gen, steps, prompt_len, k, last, first, started, total=i, text=text
                )
                first = False
                sent = i
                data = b"data: " + orjson.dumps(out) + b"\n\n"
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

    # /v1/chat/completions (the engine renders), modelled on SGLang's serving_chat.py: token
    # ids through the response-level ``sglext`` extension (``return_input_ids_in_sglext``,
    # ``return_output_ids_in_sglext``), on the response or on a ``choices: []`` chunk after
    # the finish chunks; ``return_token_ids`` is refused with ``stream``; a streamed token's
    # logprob rides on that step's content chunk, so the stop token's (empty text) is not sent;
    # ``metadata.weight_version`` on a whole response; ``matched_stop`` on the finishing choice.

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
        return _json({"text": text})

    @staticmethod
    def _chat_lp(tid: int, pos: int, k: int) -> dict:
        tok = toychat.piece(tid)
        lp = toychat.logprob(tid, pos)
        top = [(tok, lp)] + [(f"alt{j}", lp - 1 - j) for j in range(max(k - 1, 0))]
        return {
            "token": tok,
            "bytes": list(tok.encode()),
            "logprob": lp,
            "top_logprobs": [
                {"token": t, "bytes": list(t.encode()), "logprob": v} for t, v in top[:k]
            ],
        }

    async def chat_completions(self, request: Request) -> Response:
        body = await self.record(request)
        msgs = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(msgs, list) or not msgs:
            return _json(
                {
                    "object": "error",
                    "message": "messages must be a non-empty list",
                    "type": "BadRequest",
                    "param": None,
                    "code": 400,
                },
                400,
            )
        stream = bool(body.get("stream"))
        if stream and body.get("return_token_ids"):
            return _json(
                {
                    "object": "error",
                    "message": (
                        "return_token_ids is not supported with streaming on /v1/chat/completions. "
                        "Please set stream=false when using return_token_ids=true."
                    ),
                    "type": "BadRequest",
                    "param": None,
                    "code": 400,
                },
                400,
            )
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return _json(
                {
                    "object": "error",
                    "message": "The server is overloaded, retry later.",
                    "type": str(status),
                    "param": None,
                    "code": status,
                },
                status,
            )
        prompt = toychat.render(msgs)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 128
        replies = [self.chat.reply(msgs, max_tokens, i) for i in range(body.get("n") or 1)]
        rid = uuid.uuid4().hex
        created = int(time.time())
        want_lp = bool(body.get("logprobs"))
        k = body.get("top_logprobs") or 0
        in_ids = bool(body.get("return_input_ids_in_sglext"))
        out_ids = bool(body.get("return_output_ids_in_sglext"))
        self.chat_log.append(
            {
                "id": rid,
                "stream": stream,
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
        ext = None
        if in_ids or out_ids:
            ext = {
                "routed_experts": None,
                "cached_tokens_details": None,
                "spec_tokens_details": None,
                "input_ids": prompt if in_ids else None,
                "output_ids": [r.ids for r in replies] if out_ids else None,
            }
        n_out = sum(len(r.ids) for r in replies)
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + n_out,
            "completion_tokens": n_out,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }
        matched = {"stop": toychat.IM_END}
        if stream:
            return StreamingResponse(
                self._chat_stream(
                    rid,
                    created,
                    replies,
                    want_lp,
                    k,
                    ext,
                    usage if (body.get("stream_options") or {}).get("include_usage") else None,
                ),
                media_type="text/event-stream",
            )
        choices = [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": r.text,
                    "tool_calls": None,
                    "reasoning_content": None,
                },
                "logprobs": {"content": [self._chat_lp(t, p, k) for p, t in enumerate(r.ids)]}
                if want_lp
                else None,
                "finish_reason": r.finish_reason,
                "matched_stop": matched.get(r.finish_reason),
                "hidden_states": None,
            }
            for i, r in enumerate(replies)
        ]
        return _json(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": MODEL,
                "choices": choices,
                "usage": usage,
                "metadata": {"weight_version": self.weight_version},
                "sglext": ext,
            }
        )

    async def _chat_stream(
        self,
        rid: str,
        created: int,
        replies: list[toychat.Reply],
        want_lp: bool,
        k: int,
        ext: dict | None,
        usage: dict | None,
    ):
        def chunk(choices: list[dict], **extra: object) -> bytes:
            obj = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL,
                "choices": choices,
                **extra,
            }
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        for i, r in enumerate(replies):
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            for pos, tid in enumerate(r.ids):
                await self.pace(rid)
                text = "" if tid in toychat.SPECIAL else toychat.piece(tid)
                if not text:
                    continue  # no content chunk: this step's logprob goes nowhere
                if self.fail_mid_stream is not None and pos > 0:
                    status, self.fail_mid_stream = self.fail_mid_stream, None
                    err = {
                        "error": {
                            "message": "Internal server error",
                            "type": "InternalServerError",
                            "code": status,
                        }
                    }
                    yield b"data: " + orjson.dumps(err) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    return
                yield chunk(
                    [
                        {
                            "index": i,
                            "delta": {"content": text},
                            "logprobs": {"content": [self._chat_lp(tid, pos, k)]}
                            if want_lp
                            else None,
                            "finish_reason": None,
                        }
                    ]
                )
        for i, r in enumerate(replies):
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": r.finish_reason,
                        "matched_stop": toychat.IM_END if r.finish_reason == "stop" else None,
                    }
                ]
            )
        if ext is not None:
            yield chunk([], sglext=ext)
        if usage is not None:
            yield chunk([], usage=usage)
        yield b"data: [DONE]\n\n"
