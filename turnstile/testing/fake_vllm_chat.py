"""The fake vLLM's ``/v1/chat/completions`` (the engine renders: capture mode's engine):
route functions of :class:`~turnstile.testing.fake_vllm.VLLMFake`, answering from its
:class:`~turnstile.testing.toychat.ChatScript`."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import toychat
from .fake_server import SSE_DONE, sse
from .fake_vllm_wire import dumps_pydantic, dumps_python, error

if TYPE_CHECKING:
    from .fake_vllm_core import VLLMCore


# /v1/chat/completions: the engine renders (``return_token_ids``, ``logprobs``,
# ``return_weight_versions``). Shapes modelled on vLLM's chat_completion protocol/serving:
# the whole response is ``model_dump()`` (unset fields null); stream chunks are
# ``exclude_unset`` dumps, so ``prompt_token_ids`` is on the first chunk only and only when
# asked, while ``token_ids`` and ``logprobs`` are always passed (null when not asked); a
# chunk whose text is empty is sent only when ids or logprobs were asked for;
# ``weight_versions`` (0.33) is on the final chunk of a choice.


def _chat_logprobs(ids: list[int], start: int, k: int) -> list[dict]:
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


def _chat_spans(fake: VLLMCore, n: int) -> list[dict]:
    spans: list[dict] = []
    for i in range(n):
        v = fake.version_of(i)
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


async def chat_completions(fake: VLLMCore, request: Request) -> Response:
    body = await fake.record(request)
    msgs = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(msgs, list) or not msgs:
        return Response(
            dumps_python(
                error("messages must be a non-empty list", "BadRequestError", 400, "messages")
            ),
            status_code=400,
            media_type="application/json",
        )
    if body.get("model") not in (None, fake.served_model):
        return Response(
            dumps_python(
                error(
                    f"The model `{body['model']}` does not exist.",
                    "NotFoundError",
                    404,
                    "model",
                )
            ),
            status_code=404,
            media_type="application/json",
        )
    if fake.fail_next is not None:
        status, fake.fail_next = fake.fail_next, None
        return fake.failure(status)
    prompt = toychat.render(msgs)
    room = fake.max_model_len - len(prompt)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or room
    if max_tokens > room:
        return Response(
            dumps_python(
                error(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                    f"model's maximum context length is {fake.max_model_len} tokens and your "
                    f"request has {len(prompt)} input tokens ({max_tokens} > "
                    f"{fake.max_model_len} - {len(prompt)}).",
                    "BadRequestError",
                    400,
                    "max_tokens",
                )
            ),
            status_code=400,
            media_type="application/json",
        )
    replies = [fake.chat.reply(msgs, max_tokens, i) for i in range(body.get("n") or 1)]
    rid = "chatcmpl-" + (request.headers.get("x-request-id") or uuid.uuid4().hex)
    created = int(time.time())
    with_ids = bool(body.get("return_token_ids"))
    k = body.get("top_logprobs") or 0
    want_lp = bool(body.get("logprobs"))
    wv = bool(body.get("return_weight_versions")) and fake.v >= (0, 33)
    fake.chat_log.append(
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
            _chat_stream(
                fake,
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
            await fake.pace(rid)
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
            "logprobs": {"content": _chat_logprobs(r.ids, 0, k)} if want_lp else None,
            "finish_reason": r.finish_reason,
            "stop_reason": None,
            "token_ids": r.ids if with_ids else None,
        }
        if fake.v >= (0, 32):  # as a real 0.32 answers (tests/fakes/golden)
            if not c["message"]["tool_calls"]:
                del c["message"]["tool_calls"]
            c["routed_experts"] = None
        if fake.v >= (0, 33):
            c["weight_versions"] = _chat_spans(fake, len(r.ids)) if wv else None
        choices.append(c)
    resp = {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": fake.served_model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fake.fingerprint,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt if with_ids else None,
        "kv_transfer_params": None,
    }
    if fake.v >= (0, 32):
        resp.update(prompt_text=None, ec_transfer_params=None, metrics=None)
        resp["usage"] = {**usage, "completion_tokens_details": None}
    return Response(dumps_python(resp), media_type="application/json")


async def _chat_stream(
    fake,
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
            "model": fake.served_model,
            "choices": [choice],
        }
        if first and fake.v >= (0, 32):  # both, null when not asked (a real 0.32)
            obj["prompt_token_ids"] = prompt if with_ids else None
            obj["prompt_text"] = None
        elif first and with_ids:
            obj["prompt_token_ids"] = prompt
        return sse(dumps_pydantic(obj))

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
            await fake.pace(rid)
            if fake.fail_mid_stream is not None and sent:
                status, fake.fail_mid_stream = fake.fail_mid_stream, None
                err = error("Internal server error", "InternalServerError", status)
                yield sse(json.dumps(err).encode())
                yield SSE_DONE
                return
            last = pos == len(r.ids) - 1
            text = "" if tid in toychat.SPECIAL else toychat.piece(tid)
            if not (text or last or with_ids or want_lp):
                continue
            c = {
                "index": i,
                "delta": {"content": text},
                "logprobs": {"content": _chat_logprobs([tid], pos, k)} if want_lp else None,
                "finish_reason": r.finish_reason if last else None,
                "token_ids": [tid] if with_ids else None,
            }
            if last:
                c["stop_reason"] = None
                if wv:
                    c["weight_versions"] = _chat_spans(fake, len(r.ids))
            yield chunk(c)
            sent = True
    if usage is not None:
        final = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": fake.served_model,
            "choices": [],
            "usage": usage,
        }
        if fake.v >= (0, 32):  # the stream's usage leaves the null details out
            final["usage"] = {k: v for k, v in usage.items() if v is not None}
            final["system_fingerprint"] = fake.fingerprint
        yield sse(dumps_pydantic(final))
    yield SSE_DONE
