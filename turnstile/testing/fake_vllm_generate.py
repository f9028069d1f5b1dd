"""The fake vLLM's token-in route, ``/inference/v1/generate`` (whole and streamed answers,
aborts by request id, routed experts on the final choice): route functions of
:class:`~turnstile.testing.fake_vllm_core.VLLMCore`. Shapes: see ``fake_vllm``'s docstring."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .fake_server import SSE_DONE, sse
from .fake_vllm_wire import Invalid, dumps_python, error, validation
from .toy_model import Generation

if TYPE_CHECKING:
    from .fake_vllm_core import VLLMCore


async def generate(fake: VLLMCore, request: Request) -> Response:
    body = await fake.record(request)
    try:
        if not isinstance(body, dict):
            raise Invalid(error("JSON decode error", "Bad Request", 400))
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not ids:
            n = len(ids) if isinstance(ids, list) else 0
            if ids is None:
                raise validation(
                    "body.token_ids",
                    "Field required",
                    "missing",
                    f"<dict of {len(body)} items>",
                    "{}",
                )
            raise validation(
                "body.token_ids",
                f"List should have at least 1 item after validation, not {n}",
                "too_short",
                f"<list of {n} items>",
                f"{{'field_type': 'List', 'min_length': 1, 'actual_length': {n}}}",
            )
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise validation(
                "body.token_ids",
                "Value error, token_ids must not contain negative values",
                "value_error",
                f"<list of {len(ids)} items>",
                "{'error': ValueError('token_ids must not contain negative values')}",
            )
        sp = body.get("sampling_params")
        if not isinstance(sp, dict):
            raise validation(
                "body.sampling_params",
                "Field required",
                "missing",
                f"<dict of {len(body)} items>",
                "{}",
            )
        fake.check_sampling(sp, len(ids))
        fake.check_routing_start(sp, len(ids))
    except Invalid as exc:
        return Response(
            dumps_python(exc.body), status_code=exc.status, media_type="application/json"
        )
    if fake.fail_next is not None:
        status, fake.fail_next = fake.fail_next, None
        return fake.failure(status)
    rid = f"generate-tokens-{request.headers.get('x-request-id') or body.get('request_id')}"
    gen = fake.sample(rid, ids, sp)
    k = sp.get("logprobs")
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _stream(fake, rid, gen, k, ids, include_usage, sp), media_type="text/event-stream"
        )
    done = await fake.until_disconnect_or(request, rid, fake.paced(rid, gen))
    if done is None:
        fake.rec.sent[rid] = Generation([], "abort")
        return Response(status_code=499)
    sent = done
    finish = "abort" if len(sent.steps) < len(gen.steps) else gen.reason
    usage = fake.usage_counts(len(ids), len(sent.steps), True)
    routed = fake.routed(ids, sent.steps, sp.get("routed_experts_prompt_start", 0))
    resp = fake.whole_body(
        rid, ids, sent, k, finish, usage, bool(body.get("return_token_ids")), routed=routed
    )
    raw = dumps_python(resp)
    fake.rec.raw[rid] = [raw]
    if finish != "abort":
        fake.rec.finished.append(rid)
    return Response(raw, media_type="application/json")


async def _stream(
    fake: VLLMCore,
    rid: str,
    gen: Generation,
    k: int | None,
    prompt: list[int],
    include_usage: bool,
    sp: dict,
):
    prompt_len = len(prompt)
    start = sp.get("routed_experts_prompt_start", 0)
    raw: list[bytes] = []
    fake.rec.raw[rid] = raw
    sent = 0
    ok = False
    try:
        i = 0
        while i < len(gen.steps):
            n = fake.tokens_per_chunk if i else 1
            chunk_steps = gen.steps[i : i + n]
            for _ in chunk_steps:
                if not await fake.pace(rid):
                    # Aborted by request id: 0.32+ send a terminal chunk without tokens.
                    fake.rec.sent[rid] = Generation(gen.steps[:i], "abort")
                    tail = [SSE_DONE]
                    if fake.v >= (0, 32):
                        cut = Generation(gen.steps[:i], "abort")
                        routed = fake.routed(prompt, cut.steps, start) if i else None
                        choice = fake.token_choice(cut, [], k, "abort", True, True, routed)
                        tail.insert(0, fake.stream_chunk(rid, choice))
                    for data in tail:
                        raw.append(data)
                        yield data
                    ok = True
                    return
            if fake.fail_mid_stream is not None and i > 0:
                status, fake.fail_mid_stream = fake.fail_mid_stream, None
                err = (
                    error("Internal server error", "InternalServerError", status)
                    if status == 500
                    else error(
                        "Generation is paused. Please retry after it resumes.",
                        "ServiceUnavailableError",
                        status,
                    )
                )
                for data in (sse(json.dumps(err).encode()), SSE_DONE):
                    raw.append(data)
                    yield data
                ok = True
                return
            i += len(chunk_steps)
            last = i == len(gen.steps)
            routed = fake.routed(prompt, gen.steps, start) if last else None
            choice = fake.token_choice(
                gen, chunk_steps, k, gen.reason if last else None, True, last, routed
            )
            data = fake.stream_chunk(rid, choice)
            sent = i
            raw.append(data)
            yield data
            if fake.keep_alive:
                yield b": keep-alive\n\n"
        if include_usage:
            data = fake.usage_chunk(rid, fake.usage_counts(prompt_len, len(gen.steps), False))
            raw.append(data)
            yield data
        raw.append(SSE_DONE)
        yield SSE_DONE
        ok = True
        fake.rec.finished.append(rid)
    finally:
        if not ok:
            fake.rec.disconnects.append(rid)
            fake.rec.sent[rid] = Generation(gen.steps[:sent], "abort")
