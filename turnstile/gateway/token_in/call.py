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
from array import array
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from ...answer import Answer, Done, Event, Started, TextDelta, TokenLogprobs, ToolCallEnd, Usage
from ...chat.detokenize import IncrementalDetokenizer
from ...chat.loaded_tokenizer import LoadedTokenizer
from ...engines.base import EngineError, Finish, TokenBatch
from ...errors import APIError
from ...media import join
from ...parsing import Parser
from ...request import ChatRequest
from ...store.records import CallRecord
from ...store.store import Store
from ...store.writes import SessionGone
from ..admission import CLIENT_GONE, SERVER_STOPPED, ClientGone, cancelled_why
from ..control import Abort, hold_abort
from ..record import STORE_ERRORS, commit, store_error
from . import answers as cc
from .recording import Call, Recording, build_record
from .resume import Chunk, Seams, finish_of, reaches_past, seam_stop


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


class _HoldNow(Exception):
    """A hold is on: the call stops before it asks its engine for more."""


class Preempted(Exception):
    """A held call that may not go on (a cap, a grammar): it ends as ``why`` says."""

    def __init__(self, why: Abort):
        super().__init__(why.reason)
        self.why = why


class TokenCall:
    """One call in flight: its facts (:class:`~.recording.Call`) and what it does."""

    def __init__(self, owner: Owner, call: Call):
        self.owner = owner
        self.call = call
        self.seams = Seams(call.params)  # its chunks (more than one once held)

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
        if self.seams.preemptions:
            extra = {**(extra or {}), **self.seams.info()}
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
        """Batches of engine events, accumulated into ``call.gen``; sets its ``finish``.

        A hold (``POST /admin/pause {"mode": "hold"}``) preempts the engine request at a
        token boundary; after the resume the call goes on, on the same replica, from prompt +
        the tokens sampled so far (``resume.Seams``): the consumer sees one run of batches."""
        owner, call = self.owner, self.call
        control = owner.control
        eog = owner.tok.eog_token_ids
        gen = call.gen
        engine = owner.engine.pick(call.session_id)  # the session's replica, every chunk
        gen.engine_url = engine.url
        began = time.perf_counter()
        seams = self.seams
        if not stream and control.can_hold and control.hold_limits.stream_whole:
            stream = True  # a hold keeps what the engine sampled of a whole call too
        while True:
            seam = len(gen.ids)
            params = call.params if not seam else seams.resumed(gen.ids)
            prompt = call.prompt.engine_prompt
            if seam:  # (with images: the same images, the sampled tokens after them)
                prompt = join(prompt, array("i", gen.ids))
            chunk = Chunk(seam, len(prompt), params.as_dict(), control.version)
            seams.chunks.append(chunk)
            straddle = bool(seam and params.stop)  # a stop string may straddle the seam
            source = engine.generate(prompt, params, stream=stream)
            it = source.__aiter__()
            try:
                while True:
                    if not control.engine_wait():
                        raise _HoldNow  # a hold began while this call was not on the engine
                    try:
                        batch = await it.__anext__()
                    except StopAsyncIteration:
                        raise EngineError(
                            f"the {owner.engine.name} engine ended the generation without "
                            "saying how it finished",
                            502,
                        ) from None
                    finally:
                        control.engine_done()
                    if isinstance(batch, Finish):
                        chunk.end = len(gen.ids)
                        finish_of(chunk, batch)
                        self._finished(batch, began, eog)
                        return
                    gen.ids.extend(batch.ids)
                    gen.logprobs.extend(batch.logprobs)
                    if params.top_logprobs:
                        gen.top.extend(batch.tops())
                    if straddle:
                        cut = seam_stop(owner.tok.decode, gen.ids, seam, params.stop)
                        if cut is not None:  # the engine saw only its side of the seam
                            batch = self._cut(batch, cut[0], cut[1])
                            chunk.end = len(gen.ids)
                            chunk.finish_reason = "stop_string_across_seam"
                            if batch:
                                yield batch
                            assert gen.finish is not None
                            self._finished(gen.finish, began, eog)
                            return
                        straddle = not reaches_past(owner.tok.decode, gen.ids, seam, params.stop)
                    yield batch
            except (asyncio.CancelledError, _HoldNow) as exc:
                if isinstance(exc, asyncio.CancelledError) and not control.preempted():
                    raise
            finally:
                close = getattr(source, "aclose", None)
                if close is not None:
                    await close()  # a dropped request: the engine stops it
            # preempted by a hold: held until the resume, then on from here
            chunk.end = len(gen.ids)
            seams.preemptions += 1
            if await self._held(chunk, began, eog):
                return

    async def _held(self, chunk: Chunk, began: float, eog: frozenset[int]) -> bool:
        """The call was preempted after ``chunk``: end it if it can end here (True), abort it
        where it may not go on (:class:`Preempted`), else wait for the resume (False)."""
        control, gen, params = self.owner.control, self.call.gen, self.call.params
        limits = control.hold_limits
        if len(gen.ids) and gen.ids[-1] in eog:  # its last token ended the turn already
            self._finished(Finish("stop", stop_token_id=gen.ids[-1]), began, eog)
            return True
        if len(gen.ids) >= params.max_tokens:
            self._finished(Finish("length"), began, eog)
            return True
        if self.seams.preemptions > limits.max_preemptions:
            raise Preempted(
                hold_abort(
                    f"preempted {self.seams.preemptions} times, past the cap "
                    f"(serve --hold-preemptions {limits.max_preemptions})"
                )
            )
        if len(gen.ids) and (params.grammar or params.json_schema):
            raise Preempted(
                hold_abort(
                    "a grammar-forced call cannot go on from its partial output (the "
                    "engine's grammar would restart at the prompt's end), so it is not resumable"
                )
            )
        held = await control.held()
        if held is None:
            raise Preempted(
                hold_abort(f"held past the limit (serve --hold-timeout {limits.max_held_s:g})")
            )
        chunk.held_s = held
        return False

    def _cut(self, batch: TokenBatch, k: int, stop: str) -> TokenBatch:
        """Keep the first ``k`` completion tokens (the stop string across the seam ends in
        the last), and the part of ``batch`` among them."""
        gen = self.call.gen
        drop = len(gen.ids) - k
        del gen.ids[k:]
        del gen.logprobs[k:]
        if self.call.params.top_logprobs:
            del gen.top[k:]
        keep = len(batch) - drop
        out = TokenBatch(
            batch.ids[:keep],
            batch.logprobs[:keep],
            batch.top[:keep] if batch.top is not None else None,
        )
        gen.finish = Finish("stop", stop_string=stop, engine_reason="stop_string_across_seam")
        return out

    def _finished(self, batch: Finish, began: float, eog: frozenset[int]) -> None:
        """The call's finish: the last chunk's, over the whole completion."""
        gen, seams = self.call.gen, self.seams
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
        if len(seams.chunks) > 1:  # versions over the whole completion, chunk by chunk
            batch.weight_versions = seams.spans()
            batch.prompt_tokens = len(self.call.prompt.ids)
            if batch.arrays:  # a cut request returns no rows: the last chunk's prefill gave them
                seams.note(
                    "per-token arrays (routed experts) of the tokens before the last seam are "
                    "the last chunk's prefill (its weights), not those that sampled them"
                )
        gen.finish = batch

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
        except Preempted as exc:
            await self.record("aborted", error=exc.why.reason)
            raise exc.why.error() from None
        except asyncio.CancelledError:
            why = owner.control.aborted()
            if why is not None:
                await self.record("aborted", error=why.reason)
                raise why.error() from None
            if asyncio.current_task() in owner.gone:
                await self.record("aborted", error=CLIENT_GONE)
                raise ClientGone(call.session_id) from None
            if owner.control.stopping:  # the server's grace is over: the record, then out
                await self.record("aborted", error=SERVER_STOPPED)
            raise
        text = cc.cut_stop(owner.tok.decode(self._text_ids()), gen.finish)
        parser = owner.parser_for(req, call.tail)
        parser.feed_events(text)
        parser.finish_events()
        parsed = parser.result()
        message = parsed.to_openai()
        assert gen.finish is not None  # events() raised otherwise
        finish_reason = cc.finish_reason(bool(parsed.tool_calls), gen.finish)
        lps = (
            cc.logprobs(owner.tok, gen.ids, gen.logprobs, gen.top or [[] for _ in gen.ids])
            if req.logprobs
            else None
        )
        # the response the record keeps (with --keep-bodies): the choice, as Chat shows it
        choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": lps}
        rec = await self.record(
            "ok",
            message,
            extra={"parse_status": parsed.parse_status},
            response={"choices": [choice]},
        )
        return self._answer(rec, message, finish_reason, lps["content"] if lps else None)

    def _answer(
        self, rec: CallRecord, message: dict, finish_reason: str, logprobs: list | None
    ) -> Answer:
        """The finished call as the dialects render it."""
        gen = self.call.gen
        assert gen.finish is not None
        return Answer(
            call_id=rec.id,
            message=message,
            finish_reason=finish_reason,
            stop_string=gen.finish.stop_string,
            usage=Usage.of(rec.info["usage"]),
            started=self.call.started,
            model=self.call.req.model or self.owner.model_name,
            logprobs=logprobs,
        )

    async def chunks(self) -> AsyncGenerator[Event, None]:
        """The events of the streamed call: one pass per batch of engine events (the tokens
        that arrived together leave as one text event, or a few when the parser splits content
        from a tool call, after the batch's logprobs); the call is recorded before its
        :class:`~turnstile.answer.Done`."""
        owner, call = self.owner, self.call
        req, gen, tok = call.req, call.gen, owner.tok
        parser = owner.parser_for(req, call.tail)
        detok = IncrementalDetokenizer(tok)

        yield Started(call.started)
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
                events = parser.feed_events(text) if text else []
                if lp:
                    yield TokenLogprobs(lp)
                    if all(isinstance(e, ToolCallEnd) for e in events):
                        yield TextDelta("")  # the batch's logprobs leave all the same
                for event in events:
                    yield event
            for event in parser.feed_events(visible(detok.flush(), last=True)):
                yield event
            for event in parser.finish_events():
                yield event
            status, error = "ok", None
        except EngineError as exc:
            # The harness is still there: the error record is written before it hears of
            # the failure, so a read right after the error finds the call.
            status = "recorded"
            with contextlib.suppress(APIError):
                await self.record("error", error=str(exc))
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except Preempted as exc:  # held, and may not go on: recorded first
            status = "recorded"
            with contextlib.suppress(APIError):
                await self.record("aborted", error=exc.why.reason)
            raise exc.why.error() from None
        except asyncio.CancelledError:
            why = owner.control.aborted()  # a pause or the session's close: recorded first
            if why is None:
                error = cancelled_why(owner.control, CLIENT_GONE)  # recorded below
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
        yield Done(self._answer(rec, message, finish_reason, None))
