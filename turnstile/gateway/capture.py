"""Passthrough capture: forward Chat Completions to an engine that renders them itself, and
record the token IDs it reports.

For models Turnstile cannot render (or as a cross-check of its own rendering), the request
goes to the engine's ``/v1/chat/completions`` as the harness sent it, plus only what is needed
to get the tokens back, and what the harness did not ask for is taken out of the response
again (``engines.capture``, ``engines.capture_dialects``). This module is the gateway: it links
each call into the session's token-prefix lineage (``gateway.lineage``) and records it, through
the same door (``gateway.admission``) and record fields (``gateway.record``) as token-in.

The engine renders every prompt, so nothing prevents retokenization drift: it is *detected*.
A call whose prompt IDs start with a recorded call's prompt + completion is that call's child
(the rest is its prompt delta). A call that extends no recorded call starts a new segment, and
the record says why and exactly where it left the closest recorded conversation:

- ``first_call``: the session's first call;
- ``drift``: the request's messages continue a recorded call (its request + the reply we
  returned, compared as the default mode compares them), but the engine's prompt IDs do not
  extend that call's prompt + completion: the engine re-tokenized or re-rendered history;
- ``history_diverged``: the messages continue no recorded call (edited or compacted history,
  or assistant turns that were not sampled here);
- ``new_conversation``: no assistant message at all (a new conversation, a subagent, a retry
  of a first call).

Every segment root after the first carries ``info.drift``: the token index where the prompt
leaves the closest recorded call, which call's prompt delta or completion holds that token,
and the recorded and received token IDs (and their text, from the engine's detokenizer) around
it. ``segment_detail`` says the same in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from ..chat.history_hash import prefix_hashes, root_hash
from ..dialects.chat_request import parse_capture_request
from ..engines.base import EngineError
from ..engines.capture import Capture, CaptureEngine, Choice, EngineHTTPError, loads
from ..engines.capture_dialects import strip_chunk, strip_response
from ..engines.http import sse_data
from ..engines.pool import Bound, ReplicaPool
from ..errors import APIError
from ..request import Answer, ChatRequest
from ..store.records import CallRecord
from ..store.store import Store
from .admission import CLIENT_GONE, Chunks, ClientGone, admitted, open_stream, watched
from .capture_record import Call, build_record
from .control import PolicyControl
from .lineage import LineageIndex, Link, new_node
from .lineage import link as lineage_link
from .record import STORE_ERRORS, commit, committed


def _api_error(exc: EngineError) -> APIError:
    if isinstance(exc, EngineHTTPError) and exc.status < 500:
        e = exc.error
        return APIError(
            exc.status,
            str(e.get("message") or exc),
            e.get("param"),
            e.get("code") if isinstance(e.get("code"), str) else None,
            e.get("type") if isinstance(e.get("type"), str) else None,
        )
    return APIError(
        exc.status, str(exc), type_="engine_unavailable" if exc.status == 503 else "engine_error"
    )


class PassthroughGateway:
    """The gateway ``server.app`` drives (:class:`~.contract.AppGateway`), in capture mode."""

    # The engine renders; whether its template reads ``tools`` is not Turnstile's to know.
    template_ignores_tools = False

    def __init__(
        self, engine: CaptureEngine | ReplicaPool[CaptureEngine], store: Store, model_name: str
    ):
        """``engine``: a :class:`CaptureEngine`, or a replica pool of them."""
        self.engine = engine
        self.primary = engine.replicas[0] if isinstance(engine, ReplicaPool) else engine
        self.store = store
        self.model_name = model_name
        self.control = PolicyControl()
        self._index: dict[str, LineageIndex] = {}
        self._gone: set[asyncio.Task] = set()  # calls whose harness went away

    # sessions

    def forget(self, session_id: str) -> None:
        self._index.pop(session_id, None)
        self.engine.forget(session_id)

    def closed(self, session_id: str) -> None:
        """A closed session: its token index stays (it is small, and read for every call)."""

    def index(self, session_id: str) -> LineageIndex:
        """The session's token index, rebuilt from the store the first time after a restart."""
        idx = self._index.get(session_id)
        if idx is None:
            idx = LineageIndex.from_calls(self.store.calls(session_id))
            idx.created = self.store.session_created(session_id)
            self._index[session_id] = idx
        return idx

    # the request

    def parse_request(self, body: Any) -> ChatRequest:
        return parse_capture_request(body)

    async def _target(self, session_id: str) -> tuple[CaptureEngine, Bound[CaptureEngine] | None]:
        """The engine for this session, and the pool's binding when there are replicas (a
        pool keeps a session on one replica)."""
        try:
            picked = self.engine.pick(session_id)
        except EngineError as exc:
            raise _api_error(exc) from exc
        bound = picked if isinstance(picked, Bound) else None
        engine = picked.engine if isinstance(picked, Bound) else picked
        if engine.model is None:  # unreachable when Turnstile started: learn its version now
            with contextlib.suppress(EngineError):
                await engine.refresh()
        return engine, bound

    @staticmethod
    def _failed(bound: Bound[CaptureEngine] | None, exc: EngineError) -> None:
        """A replica that could not serve a call gets no new sessions until it is healthy."""
        if bound is not None and exc.status in (502, 503) and not isinstance(exc, EngineHTTPError):
            bound.pool.healthy[bound.index] = False

    # linking

    def _hashes(self, req: ChatRequest) -> list[bytes]:
        return prefix_hashes(root_hash(req.tools, req.template_kwargs), req.messages)

    # recording

    def _commit(
        self, call: Call, idx: LineageIndex, rec: CallRecord, link: Link | None, response: object
    ) -> asyncio.Future:
        """Write the record off the event loop; an ok call joins the session's index once it
        is committed (a call the store never saved can be nobody's parent)."""

        def index() -> None:
            if rec.status == "ok" and link is not None:
                idx.add(
                    new_node(
                        rec.id,
                        link.parent,
                        rec.prompt_delta,
                        rec.completion_ids,
                        rec.seq,
                        link.prompt,
                    )
                )
                if rec.history_hash is not None:
                    idx.replies[rec.history_hash] = rec.id

        return commit(self.store, rec, call.body, response, call.session_created, then=index)

    async def _record_ok(self, call: Call, response: object) -> None:
        """A call the harness gets whole: linked into the session's tree, one record a choice.
        A store failure reaches the harness as 503/507, never as an acknowledged reply."""
        cap = call.cap
        idx = self.index(call.session_id)
        prompt = array("i", cap.prompt_ids or [])
        link = await lineage_link(
            idx, call.req.messages, self._hashes(call.req), prompt, call.engine.detokenize
        )
        for i in sorted(cap.choices):
            rec = build_record(
                self, call, idx, link, cap.choices[i], "ok", None, cap.usage_notes(len(prompt))
            )
            await committed(self._commit(call, idx, rec, link, response), call.session_id)

    def _record_failure(
        self, call: Call, status: str, error: str, response: object = None
    ) -> list[asyncio.Future]:
        """A call the harness did not get whole: recorded with whatever tokens came back. The
        writes run on their own; a caller still talking to the harness awaits them."""
        cap = call.cap
        idx = self.index(call.session_id)
        link = None
        if cap.prompt_ids is not None:
            link = Link(array("i", cap.prompt_ids), [])
            link.parent = idx.parent_of(link.prompt)
        choices: list[Choice | None] = [cap.choices[i] for i in sorted(cap.choices)]
        return [
            self._commit(
                call, idx, build_record(self, call, idx, link, c, status, error), link, response
            )
            for c in choices or [None]
        ]

    async def _recorded_failure(
        self, call: Call, status: str, error: str, response: object = None
    ) -> None:
        """The failure is recorded before the harness hears of it (a read right after the
        error finds the call); a store that fails too does not hide the engine's error."""
        for fut in self._record_failure(call, status, error, response):
            with contextlib.suppress(*STORE_ERRORS):
                await asyncio.shield(fut)

    @contextlib.asynccontextmanager
    async def _failures(self, call: Call) -> AsyncIterator[None]:
        """Before the harness has an answer: an engine failure or an abort (a pause, the
        session's close) is recorded with what came back, and raised as the harness's HTTP
        error."""
        try:
            yield
        except EngineError as exc:
            self._failed(call.bound, exc)
            await self._recorded_failure(call, "error", str(exc))
            raise _api_error(exc) from exc
        except asyncio.CancelledError:
            why = self.control.aborted()
            if why is not None:
                await self._recorded_failure(call, "aborted", why.reason)
                raise why.error() from None
            if asyncio.current_task() in self._gone:  # the harness left (admission.watched)
                await self._recorded_failure(call, "aborted", CLIENT_GONE)
                raise ClientGone(call.session_id) from None
            raise

    # the call

    def count_tokens(self, session_id: str, req: ChatRequest) -> int:
        raise APIError(
            400,
            "Capture mode (serve --passthrough) cannot count tokens: the "
            "engine renders the prompt.",
            code="unsupported_dialect",
        )

    async def _begin(self, session_id: str, req: ChatRequest) -> Call:
        if req.dialect != "chat":
            # The engine renders here, from the Chat Completions body the harness sent.
            raise APIError(
                400,
                f"Capture mode (serve --passthrough) records Chat Completions "
                f"calls only; this was a {req.dialect!r} request. Serve in "
                "token-in mode (the default) for the other dialects.",
                code="unsupported_dialect",
            )
        started = time.time()
        engine, bound = await self._target(session_id)
        body, asked, added = engine.outgoing(req.raw)
        return Call(
            session_id,
            req,
            engine,
            bound,
            body,
            asked,
            added,
            Capture(engine.dialect),
            started,
            self.index(session_id).created,
        )

    async def complete(
        self,
        session_id: str,
        req: ChatRequest,
        disconnected: Callable[[], Awaitable[object]] | None = None,
    ) -> Answer:
        """The whole response. ``disconnected`` returns when the harness goes away: the engine
        call is then dropped (the engine aborts it on the closed connection), recorded as
        aborted with what came back, and :class:`ClientGone` raised."""
        async with admitted(self.control, session_id) as ticket:
            if disconnected is None:
                return await self._complete(session_id, req)
            return await watched(
                self.control,
                ticket,
                lambda: self._complete(session_id, req),
                disconnected,
                self._gone,
            )

    async def _complete(self, session_id: str, req: ChatRequest) -> Answer:
        call = await self._begin(session_id, req)
        engine = call.engine
        async with self._failures(call):
            try:
                resp = await engine.open_chat(call.body)
                try:
                    raw = await resp.read()
                finally:
                    resp.release()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise EngineError(f"{engine.label} at {engine.url} failed: {exc}", 502) from exc
            data = loads(raw, "its response")
            call.cap.feed_response(data)
            problem = call.cap.missing()
            if problem:
                raise EngineError(problem, 502)
        await self._record_ok(call, data)
        out = orjson.loads(raw) if self.store.keep_bodies else data  # the kept body: whole
        return Answer(strip_response(out, call.asked, engine.dialect))

    async def stream(self, session_id: str, req: ChatRequest) -> Chunks:
        """Chunks of a streamed completion. The engine's answer to the request (an error
        status, or the first chunk) is awaited before the stream starts, so failures there are
        HTTP errors; the call is recorded before the last chunk reaches the harness."""
        return await open_stream(
            self.control, lambda: self._open(session_id, req), session_id=session_id
        )

    async def _open(self, session_id: str, req: ChatRequest) -> AsyncGenerator[dict, None]:
        call = await self._begin(session_id, req)
        engine = call.engine
        resp = None
        ready = False
        try:
            async with self._failures(call):
                try:
                    resp = await engine.open_chat(call.body)
                    events = sse_data(resp).__aiter__()
                    first = await anext(events, b"[DONE]")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise EngineError(f"{engine.label} at {engine.url} failed: {exc}", 502) from exc
                chunk = None
                if first.strip() != b"[DONE]":
                    chunk = engine.chunk(first)
                    call.cap.feed_chunk(chunk)
                    if engine.dialect.prompt_ids_first and call.cap.prompt_ids is None:
                        raise EngineError(call.cap.missing() or "no prompt token IDs", 502)
                ready = True
        finally:
            if not ready and resp is not None:
                resp.close()
        assert resp is not None
        return self._stream(call, resp, events, chunk)

    async def _stream(
        self,
        call: Call,
        resp: aiohttp.ClientResponse,
        events: AsyncIterator[bytes],
        first: dict | None,
    ) -> AsyncGenerator[dict, None]:
        engine, cap = call.engine, call.cap
        keep = self.store.keep_bodies
        chunks: list[dict] = []  # as the engine sent them (kept with --keep-bodies)
        held: list[dict] = []  # from the finishing chunk on: sent after the call is recorded
        status = "aborted"
        error: str | None = "the client disconnected"
        done = first is None
        try:
            pending = [first] if first is not None else []
            while True:
                if pending:
                    chunk = pending.pop()
                else:
                    payload = await anext(events, None)
                    if payload is None:
                        break
                    if payload.strip() == b"[DONE]":
                        done = True
                        break
                    chunk = engine.chunk(payload)
                    cap.feed_chunk(chunk)
                ends = not chunk.get("choices") or any(
                    ch.get("finish_reason") is not None for ch in chunk["choices"]
                )
                if keep:
                    chunks.append(chunk)
                    chunk = orjson.loads(orjson.dumps(chunk))
                out = strip_chunk(chunk, call.asked, engine.dialect)
                if out is None:
                    continue
                if held or ends:
                    held.append(out)
                else:
                    yield out
            if not done:
                raise EngineError(f"{engine.label} ended the stream before [DONE]", 502)
            problem = cap.missing()
            if problem:
                raise EngineError(problem, 502)
            status, error = "ok", None
        except EngineError as exc:
            status = "recorded"
            self._failed(call.bound, exc)
            await self._recorded_failure(
                call, "error", str(exc), {"chunks": chunks} if keep else None
            )
            raise _api_error(exc) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, error = "recorded", f"{engine.label} at {engine.url} failed: {exc}"
            await self._recorded_failure(call, "error", error, {"chunks": chunks} if keep else None)
            raise APIError(502, error, type_="engine_error") from exc
        except asyncio.CancelledError:
            why = self.control.aborted()  # a pause or the session's close
            if why is None:
                raise
            status = "recorded"
            resp.close()  # the engine stops before the record is written
            await self._recorded_failure(
                call, "aborted", why.reason, {"chunks": chunks} if keep else None
            )
            raise why.error() from None
        finally:
            resp.close()
            if status not in ("ok", "recorded"):
                self._record_failure(
                    call, status, error or "", response={"chunks": chunks} if keep else None
                )
        await self._record_ok(call, {"chunks": chunks} if keep else None)
        for out in held:
            yield out
