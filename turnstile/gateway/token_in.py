"""The hot path of one chat completion: request → render → engine → parse → record → response.

:class:`Gateway` owns the pieces (renderer, engine, store, per-session call trees) and runs a
validated Chat Completions request through them: the prompt (``gateway.prompting``), the
session's trees (``gateway.session_trees``), the engine, the parser, the record
(``gateway.record``), and the response shapes (``gateway.answers``). It knows nothing
about HTTP; ``server.app`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from ..chat.detokenize import IncrementalDetokenizer
from ..chat.policy import Policy
from ..chat.render import Renderer
from ..dialects.chat_request import parse_chat_request
from ..engines.base import Engine, EngineError, Finish, SamplingParams, TokenEvent
from ..errors import APIError
from ..parsing import Parser
from ..parsing.call_ids import calls_before
from ..parsing.detect import FormatChoice
from ..request import Answer, ChatRequest
from ..store.records import CallRecord
from ..store.store import Store
from ..store.writes import SessionGone
from . import answers as cc
from .admission import CLIENT_GONE, Chunks, ClientGone, admitted, open_stream, watched
from .control import PolicyControl
from .prompting import Prompt, build_prompt
from .record import STORE_ERRORS, commit, store_error
from .sampling import sampling_params
from .session_trees import Entry, SessionTrees, Tree
from .token_record import Call, Generation, build_record


class Gateway:
    """Token-in mode: Turnstile renders, the engine sees token IDs only."""

    def __init__(
        self,
        renderer: Renderer,
        engine: Engine,
        store: Store,
        model_name: str,
        parser: FormatChoice,
        policy: Policy | None = None,
        max_trees: int = 1024,
    ):
        self.renderer = renderer
        self.policy = policy or Policy.permissive()
        self.control = PolicyControl()
        self.tok = renderer.tok
        self.engine = engine
        self.store = store
        self.model_name = model_name
        self.parser = parser
        self.trees = SessionTrees(store, renderer, max_trees)
        self._gone: set[asyncio.Task] = set()  # calls whose harness went away

    def parse_request(self, body: object) -> ChatRequest:
        """The request, validated in full: Turnstile renders and samples it itself."""
        return parse_chat_request(body)

    # sessions

    def forget(self, session_id: str) -> None:
        """Drop a deleted session's cached tree (a reused id starts empty)."""
        self.trees.drop(session_id)
        self.engine.forget(session_id)

    def closed(self, session_id: str) -> None:
        """A closed session takes no more calls: its tree is freed (rebuilt if read again)."""
        self.trees.closed(session_id)

    def tree(self, session_id: str) -> Tree:
        """The session's call tree (rebuilt from the store the first time after a restart)."""
        return self.trees.get(session_id)

    # render

    def prompt(self, tree: Tree, req: ChatRequest) -> Prompt:
        return build_prompt(self.renderer, self.policy, tree, req)

    def count_tokens(self, session_id: str, req: ChatRequest) -> int:
        """The prompt tokens this request would send now (extending the session's recorded
        tokens where it can): nothing is sampled or recorded."""
        entry = self.trees.hold(session_id)
        try:
            return len(self.prompt(entry.tree, req).ids)
        finally:
            self.trees.release(session_id, entry)

    async def sampling(
        self, req: ChatRequest, prompt_len: int, prompt_tail: str = ""
    ) -> SamplingParams:
        if not self.engine.context_length:
            try:
                await self.engine.refresh()
            except EngineError as exc:
                raise APIError(exc.status, str(exc), type_="engine_unavailable") from exc
        return sampling_params(
            req,
            prompt_len,
            self.engine.context_length,
            self.tok.eog_token_ids,
            self.parser,
            prompt_tail,
        )

    @property
    def template_ignores_tools(self) -> bool:
        return self.renderer.ignores_tools

    # record

    async def _begin(self, session_id: str, req: ChatRequest, tree: Tree) -> Call:
        """The call's prompt and sampling (render errors are the harness's 400s)."""
        started = time.time()
        prompt = self.prompt(tree, req)
        tail = self.tok.decode(prompt.ids[-16:].tolist())  # enough to see an opened block
        params = await self.sampling(req, len(prompt.ids), tail)
        return Call(session_id, tree, req, prompt, params, started, tail)

    async def record(
        self,
        call: Call,
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
        rec, fut = self._commit(call, status, message, error, extra, response)
        try:
            await asyncio.shield(fut)
        except STORE_ERRORS as exc:
            if isinstance(exc, SessionGone):
                self.forget(call.session_id)
            raise store_error(exc, call.session_id) from exc
        return rec

    def record_later(self, call: Call, status: str, error: str | None) -> None:
        """Record a call nobody waits for (its harness is gone): the write runs on its own."""
        self._commit(call, status, None, error)

    def _commit(
        self,
        call: Call,
        status: str,
        message: dict | None,
        error: str | None,
        extra: dict | None = None,
        response: dict | None = None,
    ) -> tuple[CallRecord, asyncio.Future]:
        built = build_record(self, call, status, message, error, extra)
        tree, hashes = call.tree, call.prompt.hashes
        fut = commit(
            self.store,
            built.record,
            call.req.raw,
            response,
            tree.created,
            then=lambda: tree.add(built.node, hashes, built.reply_hash, built.echo_hash),
        )
        return built.record, fut

    # the call

    async def events(self, call: Call, stream: bool) -> AsyncIterator[list[TokenEvent]]:
        """Batches of engine events, accumulated into ``call.gen``; sets its ``finish``."""
        eog = self.tok.eog_token_ids
        gen, params = call.gen, call.params
        engine = self.engine.pick(call.session_id)  # the session's replica
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
            gen.ids.extend([ev.token_id for ev in batch])
            gen.logprobs.extend([ev.logprob for ev in batch])
            if params.top_logprobs:
                gen.top.extend([ev.top or [] for ev in batch])
            yield batch
        raise EngineError(
            f"the {self.engine.name} engine ended the generation without saying how it finished",
            502,
        )

    def parser_for(self, req: ChatRequest, tail: str) -> Parser:
        """The parser for this completion; the prompt's tail says whether the generation
        prompt already opened a reasoning block (``enable_thinking`` varies per request)."""
        return self.parser.parser(
            tail,
            tools=req.tools,
            tool_calls=bool(req.tools),
            calls_before=calls_before(req.messages),
        )

    def _text_ids(self, gen: Generation) -> list[int]:
        ids = gen.ids.tolist()
        if (
            gen.finish
            and gen.finish.stop_token_id is not None
            and ids
            and ids[-1] in self.tok.eog_token_ids
        ):
            ids = ids[:-1]
        return ids

    async def complete(
        self,
        session_id: str,
        req: ChatRequest,
        disconnected: Callable[[], Awaitable[object]] | None = None,
    ) -> Answer:
        """The whole response. ``disconnected`` returns when the harness goes away: the
        engine call is then abandoned (the engine stops on the dropped connection), the call
        recorded as aborted, and :class:`ClientGone` raised."""
        async with admitted(self.control, session_id) as ticket:
            entry = self.trees.hold(session_id)
            try:
                if disconnected is None:
                    return await self._complete(session_id, req, entry.tree)
                return await watched(
                    self.control,
                    ticket,
                    lambda: self._complete(session_id, req, entry.tree),
                    disconnected,
                    self._gone,
                )
            finally:
                self.trees.release(session_id, entry)

    async def _complete(self, session_id: str, req: ChatRequest, tree: Tree) -> Answer:
        call = await self._begin(session_id, req, tree)
        gen = call.gen
        try:
            async for _ in self.events(call, stream=False):
                pass
        except EngineError as exc:
            await self.record(call, "error", error=str(exc))
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except asyncio.CancelledError:
            why = self.control.aborted()
            if why is not None:
                await self.record(call, "aborted", error=why.reason)
                raise why.error() from None
            if asyncio.current_task() in self._gone:
                await self.record(call, "aborted", error=CLIENT_GONE)
                raise ClientGone(session_id) from None
            raise
        text = cc.cut_stop(self.tok.decode(self._text_ids(gen)), gen.finish)
        parser = self.parser_for(req, call.tail)
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
                self.tok, gen.ids, gen.logprobs, gen.top or [[] for _ in gen.ids]
            )
            if req.logprobs
            else None,
        }
        rec = await self.record(
            call,
            "ok",
            message,
            extra={"parse_status": parsed.parse_status},
            response={"choices": [choice]},
        )
        return Answer(cc.completion(rec, call.started, req.model or self.model_name, choice), rec)

    async def stream(self, session_id: str, req: ChatRequest) -> Chunks:
        """Chunks of a streamed completion. The prompt is rendered (and errors raised) before
        the first chunk; the call is recorded before the final chunk is sent."""
        entry: Entry | None = None
        call: Call | None = None

        async def prepare() -> AsyncGenerator[dict, None]:
            nonlocal entry, call
            entry = self.trees.hold(session_id)
            call = await self._begin(session_id, req, entry.tree)
            return self._chunks(call)

        def release() -> None:
            if entry is not None:
                self.trees.release(session_id, entry)

        return await open_stream(
            self.control, prepare, release, session_id, lambda: call.record if call else None
        )

    async def _chunks(self, call: Call) -> AsyncGenerator[dict, None]:
        """The chunks of a streamed token-in call: one pass per batch of engine events (the
        tokens that arrived together leave in one chunk, or a few when the parser splits content
        from a tool call); the call is recorded before the final chunk."""
        req, gen = call.req, call.gen
        parser = self.parser_for(req, call.tail)
        detok = IncrementalDetokenizer(self.tok)
        chunk = cc.ChunkMaker(call.started, req.model or self.model_name, req.include_usage)

        yield chunk({"role": "assistant", "content": ""})
        eog = self.tok.eog_token_ids
        status = "aborted"
        error: str | None = CLIENT_GONE
        visible = cc.StopStrings(call.params.stop).visible

        try:
            async for batch in self.events(call, stream=True):
                sampled = [ev for ev in batch if ev.token_id not in eog]
                text = visible(detok.push_many([ev.token_id for ev in sampled]) if sampled else "")
                lp = (
                    [
                        cc.logprob_entry(self.tok, ev.token_id, ev.logprob, ev.top or [])
                        for ev in sampled
                    ]
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
                await self.record(call, "error", error=str(exc))
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except asyncio.CancelledError:
            why = (
                self.control.aborted()
            )  # a pause or the session's close: recorded before it is told
            if why is None:
                raise
            status = "recorded"
            with contextlib.suppress(APIError):
                await self.record(call, "aborted", error=why.reason)
            raise why.error() from None
        finally:
            if status not in ("ok", "recorded"):
                # The harness did not get a whole response: keep the tokens, mark the call.
                # Nobody waits for this write (the stream may be being torn down).
                self.record_later(call, status, error)
        parsed = parser.result()
        message = parsed.to_openai()
        assert gen.finish is not None  # events() raised otherwise
        finish_reason = cc.finish_reason(bool(parsed.tool_calls), gen.finish)
        rec = await self.record(
            call,
            "ok",
            message,
            extra={"parse_status": parsed.parse_status},
            response={"choices": [{"message": message, "finish_reason": finish_reason}]},
        )
        call.record = rec
        yield chunk({}, finish_reason)
        if req.include_usage:
            yield chunk.usage(rec)
