"""A streamed token-in call: engine events → parsed deltas → Chat Completions chunks, recorded
(whole, or as aborted when the harness, a weight update or the session's close ends it) before
the last chunk."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from ..chat.detokenize import IncrementalDetokenizer
from ..engines.base import EngineError
from . import chat_completions as cc
from .errors import APIError
from .token_record import Call

if TYPE_CHECKING:
    from .gateway import Gateway

CLIENT_GONE = "the client disconnected"


async def stream_chunks(gw: Gateway, call: Call) -> AsyncGenerator[dict, None]:
    """The chunks of a streamed token-in call: one pass per batch of engine events (the
    tokens that arrived together leave in one chunk, or a few when the parser splits content
    from a tool call); the call is recorded before the final chunk."""
    req, gen = call.req, call.gen
    parser = gw.parser_for(req, call.tail)
    detok = IncrementalDetokenizer(gw.tok)
    chunk = cc.ChunkMaker(call.started, req.model or gw.model_name, req.include_usage)

    yield chunk({"role": "assistant", "content": ""})
    eog = gw.tok.eog_token_ids
    status = "aborted"
    error: str | None = CLIENT_GONE
    visible = cc.StopStrings(call.params.stop).visible

    try:
        async for batch in gw.events(call, stream=True):
            sampled = [ev for ev in batch if ev.token_id not in eog]
            text = visible(detok.push_many([ev.token_id for ev in sampled]) if sampled else "")
            lp = (
                [cc.logprob_entry(gw.tok, ev.token_id, ev.logprob, ev.top or []) for ev in sampled]
                if req.logprobs and sampled
                else None
            )
            deltas = parser.feed(text) if text else []
            if lp and not deltas:
                deltas = [{"content": ""}]
            for i, d in enumerate(deltas):
                yield chunk(d, logprobs=lp if i == 0 else None)
        for d in parser.feed(visible(detok.flush(), last=True)) + parser.finish():
            yield chunk(d)
        status, error = "ok", None
    except EngineError as exc:
        # The harness is still there: the error record is written before it hears of
        # the failure, so a read right after the error finds the call.
        status = "recorded"
        with contextlib.suppress(APIError):
            await gw.record(call, "error", error=str(exc))
        raise APIError(exc.status, str(exc), type_="engine_error") from exc
    except asyncio.CancelledError:
        why = gw.control.aborted()  # a pause or the session's close: recorded before it is told
        if why is None:
            raise
        status = "recorded"
        with contextlib.suppress(APIError):
            await gw.record(call, "aborted", error=why.reason)
        raise why.error() from None
    finally:
        if status not in ("ok", "recorded"):
            # The harness did not get a whole response: keep the tokens, mark the call.
            # Nobody waits for this write (the stream may be being torn down).
            gw.record_later(call, status, error)
    parsed = parser.result()
    message = parsed.to_openai()
    assert gen.finish is not None  # events() raised otherwise
    finish_reason = cc.finish_reason(bool(parsed.tool_calls), gen.finish)
    rec = await gw.record(
        call,
        "ok",
        message,
        extra={"parse_status": parsed.parse_status},
        response={"choices": [{"message": message, "finish_reason": finish_reason}]},
    )
    req.record = rec
    yield chunk({}, finish_reason)
    if req.include_usage:
        yield chunk.usage(rec)
