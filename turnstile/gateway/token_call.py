"""One token-in call, from its prompt to its record: the engine's events, the whole answer or
the stream of chunks, and the commit that adds the call to its session's tree.

The gateway (``token_in.Gateway``) builds a :class:`TokenCall` once the prompt and sampling are
known; the call then owns everything that happens to it. It sees its gateway only through
:class:`Owner`, the few parts a call uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from ..chat.detokenize import IncrementalDetokenizer
from ..chat.loaded_tokenizer import LoadedTokenizer
from ..engines.base import EngineError, Finish, TokenBatch
from ..errors import APIError
from ..parsing import Parser
from ..request import Answer, ChatRequest
from ..store.records import CallRecord
from ..store.store import Store
from ..store.writes import SessionGone
from . import answers as cc
from .admission import CLIENT_GONE, ClientGone
from .record import STORE_ERRORS, commit, store_error
from .token_record import Call, Recording, build_record


class Owner(Recording, Protocol):
    """What a call uses of the gateway that made it."""

    @property
    def tok(self) -> LoadedTokenizer: ...

    @property
    def store(self) -> Store: ...

    @property
    def gone(self) -> set[asyncio.Task]:
        """Calls whose harness went away (``admission.watched``): they record ``aborted``."""
        ...

    def parser_for(self, req: ChatRequest, tail: str) -> Parser: ...

    def forget(self, session_id: str) -> None: ...


class TokenCall:
    """One call in flight: its facts (:class:`~.token_record.Call`) and what it does."""

    def __init__(self, owner: Owner, call: Call):
        self.owner = owner
        self.call = call

    @property
    def record_committed(self) -> CallRecord | None:
        """The record, once the call was committed ``ok`` (a stream's last chunk)."""
        return self.call.record

    # record

    async def record(
        self,
        status: str,
        message: dict | None = None,
        error: str | None = None,
        extra: dict | None = None,
        response: dict | None = None,
    ) -> CallRecord:
        """Commit the call, then (and only then) add it to the session's tree. The write runs
        off the event loop; if the store fails, the harness gets a clean 503/507/404 and
        nothing can extend the call. A cancellation while the write runs lets it finish (and
        the tree follow it) before the cancellation goes on."""
        rec, fut = self._commit(status, message, error, extra, response)
        try:
            await asyncio.shield(fut)
        except STORE_ERRORS as exc:
            if isinstance(exc, SessionGone):
                self.owner.forget(self.call.session_id)
            raise store_error(exc, self.call.session_id) from exc
        return rec

    def record_later(self, status: str, error: str | None) -> None:
        """Record a call nobody waits for (its harness is gone): the write runs on its own."""
        self._commit(status, None, error)

    def _commit(
        self,
        status: str,
        message: dict | None,
        error: str | None,
        extra: dict | None = None,
        response: dict | None = None,
    ) -> tuple[CallRecord, asyncio.Future]:
        call = self.call
        built = build_record(self.owner, call, status, message, error, extra)
        tree, hashes = call.tree, call.prompt.hashes
        fut = commit(
            self.owner.store,
            built.record,
            call.req.raw,
            response,
            tree.created,
            then=lambda: tree.add(built.node, hashes, built.reply_hash, built.echo_hash),
        )
        return built.record, fut

    # the engine

    async def events(self, stream: bool) -> AsyncIterator[TokenBatch]:
        """Batches of engine events, accumulated into ``call.gen``; sets its ``finish``."""
        owner, call = self.owner, self.call
        eog = owner.tok.eog_token_ids
        gen, params = call.gen, call.params
        engine = owner.engine.pick(call.session_id)  # the session's replica
        gen.engine_url = engine.url
        began = time.perf_counter()
        async for batch in engine.generate(call.prompt.ids, params, stream=stream):
            if isinstance(batch, Finish):
                batch.timings["engine_s"] = time.perf_counter() - began  # server.metrics
                if batch.stop_string is None and len(gen.ids) and gen.ids[-1] in eog:
                    # The model sampled an end-of-turn token. An engine that checks the length
                    # cap before stop tokens (vLLM) calls it "length" when it is the last
                    # allowed token; it is a stop all the same: the turn is closed, and a
                    # synthesized close after it would repeat the marker.
                    if batch.reason == "length":
                        batch.engine_reason = "length"
                    batch.reason = "stop"
                    batch.stop_token_id = gen.ids[-1]
                gen.finish = batch
                return
            gen.ids.extend(batch.ids)
            gen.logprobs.extend(batch.logprobs)
            if params.top_logprobs:
                gen.top.extend(batch.tops())
            yield batch
        raise EngineError(
            f"the {owner.engine.name} engine ended the generation without saying how it finished",
            502,
        )

    def _text_ids(self) -> list[int]:
        """The sampled IDs the text is decoded from (a closing end-of-turn token left out)."""
        gen = self.call.gen
        ids = gen.ids.tolist()
        if gen.finish and gen.finish.stop_token_id is not None and ids:
            if ids[-1] in self.owner.tok.eog_token_ids:
                ids = ids[:-1]
        return ids

    # the answer

    async def answer(self) -> Answer:
        """The whole response, recorded before it is returned."""
        owner, call = self.owner, self.call
        req, gen = call.req, call.gen
        try:
            async for _ in self.events(stream=False):
                pass
        except EngineError as exc:
            await self.record("error", error=str(exc))
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except asyncio.CancelledError:
            why = owner.control.aborted()
            if why is not None:
                await self.record("aborted", error=why.reason)
                raise why.error() from None
            if asyncio.current_task() in owner.gone:
                await self.record("aborted", error=CLIENT_GONE)
                raise ClientGone(call.session_id) from None
            raise
        text = cc.cut_stop(owner.tok.decode(self._text_ids()), gen.finish)
        parser = owner.parser_for(req, call.tail)
        parser.feed(text)
        parser.finish()
        parsed = parser.result()
        message = parsed.to_openai()
        assert gen.finish is not None  # events() raised otherwise
        finish_reason = cc.finish_reason(bool(parsed.tool_calls), gen.finish)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": cc.logprobs(
                owner.tok, gen.ids, gen.logprobs, gen.top or [[] for _ in gen.ids]
            )
            if req.logprobs
            else None,
        }
        rec = await self.record(
            "ok",
            message,
            extra={"parse_status": parsed.parse_status},
            response={"choices": [choice]},
        )
        model = req.model or owner.model_name
        return Answer(cc.completion(rec, call.started, model, choice), rec)

    async def chunks(self) -> AsyncGenerator[dict, None]:
        """The chunks of the streamed call: one pass per batch of engine events (the tokens
        that arrived together leave in one chunk, or a few when the parser splits content
        from a tool call); the call is recorded before the final chunk."""
        owner, call = self.owner, self.call
        req, gen, tok = call.req, call.gen, owner.tok
        parser = owner.parser_for(req, call.tail)
        detok = IncrementalDetokenizer(tok)
        chunk = cc.ChunkMaker(call.started, req.model or owner.model_name, req.include_usage)

        yield chunk({"role": "assistant", "content": ""})
        eog = tok.eog_token_ids
        status = "aborted"
        error: str | None = CLIENT_GONE
        visible = cc.StopStrings(call.params.stop).visible

        try:
            async for batch in self.events(stream=True):
                kept = [i for i, t in enumerate(batch.ids) if t not in eog]
                sampled = [batch.ids[i] for i in kept]
                text = visible(detok.push_many(sampled) if sampled else "")
                lp = None
                if req.logprobs and sampled:
                    lps, tops = batch.logprobs, batch.tops()
                    lp = [cc.logprob_entry(tok, batch.ids[i], lps[i], tops[i]) for i in kept]
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
                await self.record("error", error=str(exc))
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except asyncio.CancelledError:
            why = owner.control.aborted()  # a pause or the session's close: recorded first
            if why is None:
                raise
            status = "recorded"
            with contextlib.suppress(APIError):
                await self.record("aborted", error=why.reason)
            raise why.error() from None
        finally:
            if status not in ("ok", "recorded"):
                # The harness did not get a whole response: keep the tokens, mark the call.
                # Nobody waits for this write (the stream may be being torn down).
                self.record_later(status, error)
        parsed = parser.result()
        message = parsed.to_openai()
        assert gen.finish is not None  # events() raised otherwise
        finish_reason = cc.finish_reason(bool(parsed.tool_calls), gen.finish)
        rec = await self.record(
            "ok",
            message,
            extra={"parse_status": parsed.parse_status},
            response={"choices": [{"message": message, "finish_reason": finish_reason}]},
        )
        call.record = rec
        yield chunk({}, finish_reason)
        if req.include_usage:
            yield chunk.usage(rec)
