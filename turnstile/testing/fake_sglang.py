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
  "param": null, "code": 503}``;
- routed experts (``routed_experts=`` a :class:`~turnstile.testing.routing.Router`, as
  ``--enable-return-routed-experts``) when a request says ``return_routed_experts``:
  ``meta_info.routed_experts`` (after ``cached_tokens_details``) is base64 of raw int32 rows
  ``[routed_experts_start_len, prompt + completion - 1)``, on the finished event only (the
  scheduler collects them when the request finishes); a start outside ``[0, prompt]`` is
  refused with the scheduler's message (400, as a real 0.5.23 answered: tests/fakes/golden).
- a re-feed's input logprobs (``logprob_start_len`` >= 0 with ``return_logprob``, as
  ``turnstile.verify`` asks): ``input_token_logprobs`` ``[[logprob, id, null], ...]`` from that
  start, the first ``null`` (SGLang's ``[None] + logprobs[:-1]``), the toy model's raw logprobs;
  ``input_top_logprobs`` likewise with ``top_logprobs_num`` (first ``null``). ``weights``: a
  nonzero value scores these with other pseudo-weights (a stale weight sync, for verify's tests;
  the generation itself is unchanged). A prompt id outside the toy vocabulary (a real
  tokenizer's template tokens) gets a logprob of -100.
- images (``image_tokens=`` the processor's expanded count per image, as
  ``resolve_image_token_counts``; ``image_token_id=`` its placeholder): ``image_data`` beside
  ``input_ids`` is expanded as ``base_processor._expand_input_ids`` does, each placeholder into
  its image's count of placeholders, only when the IDs hold exactly one placeholder per image;
  otherwise SGLang warns and falls back to decode + re-tokenize with the processor, which
  expands every placeholder of the decoded text again: the fake gives the i-th placeholder the
  i-th image's count while there are images left (an already expanded block grows; what the
  processor does past the last image is left as sent). ``return_prompt_token_ids`` puts the
  resulting IDs in every
  answer and event (``prompt_token_ids``), as the tokenizer manager does.
"""

from __future__ import annotations

from functools import partial

from starlette.routing import Route

from . import fake_sglang_chat, fake_sglang_generate
from .fake_sglang_core import MODEL, SAMPLING_FIELDS, SGLangCore

__all__ = ["MODEL", "SAMPLING_FIELDS", "SGLangFake"]


class SGLangFake(SGLangCore):
    """SGLang 0.5.23 as the test bed runs it (its golden answers: ``tests/fakes/golden/``)."""

    def routes(self) -> list:
        return [
            Route(
                "/generate", partial(fake_sglang_generate.generate, self), methods=["POST", "PUT"]
            ),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/pause_generation", self.pause_generation, methods=["POST"]),
            Route("/continue_generation", self.continue_generation, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route(
                "/v1/chat/completions",
                partial(fake_sglang_chat.chat_completions, self),
                methods=["POST"],
            ),
            Route("/v1/detokenize", partial(fake_sglang_chat.detokenize, self), methods=["POST"]),
        ]
