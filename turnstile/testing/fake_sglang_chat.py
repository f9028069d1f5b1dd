"""The fake SGLang's ``/v1/chat/completions`` (the engine renders: capture mode's engine) and
``/v1/detokenize``: route functions of :class:`~turnstile.testing.fake_sglang_core.SGLangCore`."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import toychat
from .fake_server import SSE_DONE, sse
from .fake_sglang_core import MODEL, json_response
from .toy_model import token_text

if TYPE_CHECKING:
    from .fake_sglang_core import SGLangCore


# /v1/chat/completions (the engine renders), modelled on SGLang's serving_chat.py: token
# ids through the response-level ``sglext`` extension (``return_input_ids_in_sglext``,
# ``return_output_ids_in_sglext``), on the response or on a ``choices: []`` chunk after
# the finish chunks; ``return_token_ids`` is refused with ``stream``; a streamed token's
# logprob rides on that step's content chunk, so the stop token's (empty text) is not sent;
# ``metadata.weight_version`` on a whole response; ``matched_stop`` on the finishing choice.


async def detokenize(fake: SGLangCore, request: Request) -> Response:
    body = await fake.record(request) or {}
    ids = [int(t) for t in body.get("tokens") or []]
    text = "".join(
        toychat.piece(t)
        if t in toychat.SPECIAL or t in toychat.TEXT or t >= 1000
        # the generation vocabulary's ids (the chat script's are its specials and 300+)
        else token_text(t)
        for t in ids
    )
    return json_response({"text": text})


def _chat_lp(tid: int, pos: int, k: int) -> dict:
    tok = toychat.piece(tid)
    lp = toychat.logprob(tid, pos)
    top = [(tok, lp)] + [(f"alt{j}", lp - 1 - j) for j in range(max(k - 1, 0))]
    return {
        "token": tok,
        "bytes": list(tok.encode()),
        "logprob": lp,
        "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": v} for t, v in top[:k]],
    }


async def chat_completions(fake: SGLangCore, request: Request) -> Response:
    body = await fake.record(request)
    msgs = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(msgs, list) or not msgs:
        return json_response(
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
        return json_response(
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
    failed = fake.failed_next()
    if failed is not None:
        return failed
    prompt = toychat.render(msgs)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 128
    replies = [fake.chat.reply(msgs, max_tokens, i) for i in range(body.get("n") or 1)]
    rid = uuid.uuid4().hex
    created = int(time.time())
    want_lp = bool(body.get("logprobs"))
    k = body.get("top_logprobs") or 0
    in_ids = bool(body.get("return_input_ids_in_sglext"))
    out_ids = bool(body.get("return_output_ids_in_sglext"))
    fake.chat_log.append(
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
            _chat_stream(
                fake,
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
            "logprobs": {"content": [_chat_lp(t, p, k) for p, t in enumerate(r.ids)]}
            if want_lp
            else None,
            "finish_reason": r.finish_reason,
            "matched_stop": matched.get(r.finish_reason),
            "hidden_states": None,
        }
        for i, r in enumerate(replies)
    ]
    return json_response(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": MODEL,
            "choices": choices,
            "usage": usage,
            "metadata": {"weight_version": fake.weight_version},
            "sglext": ext,
        }
    )


async def _chat_stream(
    fake: SGLangCore,
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
        return sse(orjson.dumps(obj))

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
            await fake.pace(rid)
            text = "" if tid in toychat.SPECIAL else toychat.piece(tid)
            if not text:
                continue  # no content chunk: this step's logprob goes nowhere
            if fake.fail_mid_stream is not None and pos > 0:
                status, fake.fail_mid_stream = fake.fail_mid_stream, None
                err = {
                    "error": {
                        "message": "Internal server error",
                        "type": "InternalServerError",
                        "code": status,
                    }
                }
                yield sse(orjson.dumps(err))
                yield SSE_DONE
                return
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"content": text},
                        "logprobs": {"content": [_chat_lp(tid, pos, k)]} if want_lp else None,
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
    yield SSE_DONE
