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
  answer 403 ``PermissionDeniedError``; ``/inference/v1/abort_requests`` is 0.33 only;
- routed experts (``routed_experts=`` a :class:`~turnstile.testing.routing.Router`, as
  ``--enable-return-routed-experts``): the choice's ``routed_experts`` is base64 of a ``.npy``
  (``numpy2base64``) with rows ``[routed_experts_prompt_start, prompt + completion - 1)``, on
  a finished whole answer and on the final stream chunk only (the output processor joins the
  rows once the request finishes); ``/v1/completions`` carries it on whole answers (its
  stream choice has no such field); a start outside ``[0, prompt]`` is refused (0.32+);
- ``prompt_logprobs`` N on a whole ``/v1/completions`` answer (a re-feed, as
  ``turnstile.verify`` asks): ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]``,
  each position the prompt's own token and the top N, the toy model's raw distribution
  (``testing.refeed``; ``weights`` nonzero: other pseudo-weights, the generation unchanged).

Validation messages are modelled on vLLM's handlers (``serve/exception_handling``) and
``SamplingParams._verify_args``; they were not captured from a running server.
"""

from __future__ import annotations

from functools import partial

from starlette.routing import Route

from . import fake_vllm_chat, fake_vllm_completions, fake_vllm_generate
from .fake_vllm_core import MAX_LOGPROBS, MODEL, VLLMCore

__all__ = ["MAX_LOGPROBS", "MODEL", "VLLMFake"]


class VLLMFake(VLLMCore):
    """``version`` defaults to 0.32.0: the test bed's real vLLM, whose recorded answers
    (``tests/fakes/golden/vllm-0.32.0.json``) the fake is held to. The other versions' shapes
    are read from their wheels, not recorded: ask for one by name."""

    def routes(self) -> list:
        routes = [
            Route("/version", self.get_version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route(
                "/v1/chat/completions",
                partial(fake_vllm_chat.chat_completions, self),
                methods=["POST"],
            ),
            Route("/detokenize", partial(fake_vllm_completions.detokenize, self), methods=["POST"]),
        ]
        if self.has_completions:
            routes.append(
                Route(
                    "/v1/completions",
                    partial(fake_vllm_completions.completions, self),
                    methods=["POST"],
                )
            )
        has_generate = self.v >= (0, 25) and (self.scale_out or self.v < (0, 31))
        if has_generate:
            routes.append(
                Route(
                    "/inference/v1/generate",
                    partial(fake_vllm_generate.generate, self),
                    methods=["POST"],
                )
            )
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
