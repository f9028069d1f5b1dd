"""The fake SGLang's core: its state (the toy model, the chat script, what it was asked),
metadata, aborts and the pause routes. The wire shapes are described in
:mod:`turnstile.testing.fake_sglang`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from . import routing, toychat
from .fake_server import FakeServer
from .toy_model import ToyModel

MODEL = "fake/tiny-model"
MASK_MAX_TOKENS = 4096  # --sampling-mask-max-tokens' default
PAUSE_MODES = ("abort", "retract", "in_place")  # PauseGenerationReqInput.mode
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


def json_response(obj: object, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


class Invalid(ValueError):
    pass


class SGLangCore(FakeServer):
    """The fake SGLang's state, admin and pause routes; ``fake_sglang.SGLangFake`` adds the
    route table (``/generate`` and the chat route live in their own modules)."""

    def __init__(
        self,
        *,
        incremental: bool = False,
        context_len: int = 4096,
        original_logprobs: bool = False,
        skip_events: int = 0,
        tokens_per_event: int = 1,
        routed_experts: routing.Router | None = None,
        image_tokens: Callable[[bytes], int] | None = None,
        image_token_id: int | None = None,
    ):
        super().__init__()
        self.image_tokens, self.image_token_id = image_tokens, image_token_id
        self.prompt_echo: dict[str, list[int]] = {}  # rid → prompt_token_ids, when asked
        self.fell_back: list[str] = []  # rids whose images fell back to re-tokenizing
        self.router = routed_experts  # None: the server runs without routing capture
        self.routed_from: dict[str, tuple[list[int], int]] = {}  # rid → (prompt, start)
        self.masked: dict[str, str] = {}  # rid → sampling_logprobs_mode (return_sampling_mask)
        self.incremental = incremental
        self.context_len = context_len
        self.skip_events = skip_events  # cumulative: drop this many events after each one sent
        self.tokens_per_event = tokens_per_event  # incremental: coalesced deltas
        self.model = ToyModel("raw_logprobs" if original_logprobs else "scaled_logprobs")
        self.chat = toychat.ChatScript()  # what /v1/chat/completions answers
        self.chat_log: list[dict] = []
        self.no_logprobs: set[str] = set()  # rids asked without return_logprob
        self.input_from: dict[str, tuple[list[int], int]] = {}  # rid → (prompt, logprob start)
        self.paused: str | None = None  # the /pause_generation mode until the continue
        self.weights = 0  # nonzero: input logprobs from other pseudo-weights (verify's tests)

    def failed_next(self) -> Response | None:
        """``fail_next``'s answer, once: SGLang's ``HTTPException`` body (e.g. a 503)."""
        if self.fail_next is None:
            return None
        status, self.fail_next = self.fail_next, None
        body = {
            "object": "error",
            "message": "The server is overloaded, retry later.",
            "type": str(status),
            "param": None,
            "code": status,
        }
        return json_response(body, status)

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
        return json_response({"object": "list", "data": [card]})

    async def model_info(self, request: Request) -> Response:
        return json_response(
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
        return json_response(
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

    # /pause_generation, /continue_generation (SGLang 0.5.23's http_server and
    # tokenizer_manager): every mode stops new requests at the door until the continue;
    # ``abort`` aborts the running ones (their answers end with finish type abort),
    # ``retract`` and ``in_place`` stop them between tokens (retract recomputes their KV
    # after the continue, in_place keeps it: to a client both go on where they stopped)

    async def pause_generation(self, request: Request) -> Response:
        body = await self.record(request) or {}
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return json_response({"detail": f"Input should be {PAUSE_MODES}, got {mode!r}"}, 422)
        self.paused = mode
        if mode == "abort":
            self.abort(list(self.rec.sent))
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        await self.record(request)
        self.paused = None
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def while_paused(self, rid: str | None = None) -> None:
        while self.paused is not None and not (rid and self.is_aborted(rid)):
            await asyncio.sleep(0.01)

    async def pace(self, rid: str) -> bool:
        """One token's time; a paused scheduler (retract, in_place) samples none meanwhile."""
        if self.paused in ("retract", "in_place"):
            await self.while_paused(rid)
        return await super().pace(rid)
