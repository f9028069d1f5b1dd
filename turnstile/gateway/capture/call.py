"""One captured call, from the engine's answer to its records: the whole response or the
stream of chunks, the failures recorded with what came back, the links into the session's
token-prefix lineage.

The capture gateway (``capture.PassthroughGateway``) builds a :class:`CaptureCall` once it knows
the engine and the outgoing body; the call owns everything that happens to it from there. It
sees its gateway only through :class:`Owner`.
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

import aiohttp
import orjson

from ...answer import Relayed
from ...chat.history_hash import prefix_hashes, root_hash
from ...engines.base import EngineError
from ...engines.capture import CaptureEngine, Choice, EngineHTTPError, loads
from ...engines.capture_dialects import strip_chunk, strip_response
from ...engines.http import sse_data
from ...engines.pool import Bound
from ...errors import APIError
from ...store.records import CallRecord
from ...store.store import Store
from ..admission import CLIENT_GONE, SERVER_STOPPED, ClientGone, cancelled_why
from ..record import STORE_ERRORS, commit, committed
from .lineage import LineageIndex, Link, new_node
from .lineage import link as lineage_link
from .recording import Call, Recording, build_record


class Owner(Recording, Protocol):
    """What a captured call uses of the gateway that made it."""

    @property
    def store(self) -> Store: ...

    @property
    def gone(self) -> set[asyncio.Task]:
        """Calls whose harness went away (``admission.watched``): they record ``aborted``."""
        ...

    def index(self, session_id: str) -> LineageIndex: ...


def api_error(exc: EngineError) -> APIError:
    """The harness's error for an engine failure: the engine's own 4xx as it said it."""
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


class CaptureCall:
    """One captured call in flight: its facts (:class:`~.recording.Call`) and what it
    does."""

    def __init__(self, owner: Owner, call: Call):
        self.owner = owner
        self.call = call

    @staticmethod
    def _failed(bound: Bound[CaptureEngine] | None, exc: EngineError) -> None:
        """A replica that could not serve a call gets no new sessions until it is healthy."""
        if bound is not None and exc.status in (502, 503) and not isinstance(exc, EngineHTTPError):
            bound.pool.healthy[bound.index] = False

    def _hashes(self) -> list[bytes]:
        req = self.call.req
        return prefix_hashes(root_hash(req.tools, req.template_kwargs), req.messages)

    def _commit(
        self, idx: LineageIndex, rec: CallRecord, link: Link | None, response: object
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
                for h in rec.prefix_hashes:
                    idx.known.setdefault(h, rec.id)
                if rec.history_hash is not None:
                    idx.replies[rec.history_hash] = rec.id

        call = self.call
        return commit(self.owner.store, rec, call.body, response, call.session_created, then=index)

    async def _record_ok(self, response: object) -> None:
        """A call the harness gets whole: linked into the session's tree, one record a choice.
        A store failure reaches the harness as 503/507, never as an acknowledged reply."""
        call = self.call
        cap = call.cap
        idx = self.owner.index(call.session_id)
        prompt = array("i", cap.prompt_ids or [])
        link = await lineage_link(
            idx, call.req.messages, self._hashes(), prompt, call.engine.detokenize
        )
        for i in sorted(cap.choices):
            rec = build_record(
                self.owner,
                call,
                idx,
                link,
                cap.choices[i],
                "ok",
                None,
                cap.usage_notes(len(prompt)),
            )
            await committed(self._commit(idx, rec, link, response), call.session_id)

    def record_failure(
        self, status: str, error: str, response: object = None
    ) -> list[asyncio.Future]:
        """A call the harness did not get whole: recorded with whatever tokens came back. The
        writes run on their own; a caller still talking to the harness awaits them."""
        call = self.call
        cap = call.cap
        idx = self.owner.index(call.session_id)
        link = None
        if cap.prompt_ids is not None:
            link = Link(array("i", cap.prompt_ids), [])
            link.parent = idx.parent_of(link.prompt)
        choices: list[Choice | None] = [cap.choices[i] for i in sorted(cap.choices)]
        return [
            self._commit(
                idx, build_record(self.owner, call, idx, link, c, status, error), link, response
            )
            for c in choices or [None]
        ]

    async def _recorded_failure(self, status: str, error: str, response: object = None) -> None:
        """The failure is recorded before the harness hears of it (a read right after the
        error finds the call); a store that fails too does not hide the engine's error."""
        for fut in self.record_failure(status, error, response):
            with contextlib.suppress(*STORE_ERRORS):
                await asyncio.shield(fut)

    @contextlib.asynccontextmanager
    async def _failures(self) -> AsyncIterator[None]:
        """Before the harness has an answer: an engine failure or an abort (a pause, the
        session's close) is recorded with what came back, and raised as the harness's HTTP
        error."""
        call = self.call
        try:
            yield
        except EngineError as exc:
            self._failed(call.bound, exc)
            await self._recorded_failure("error", str(exc))
            raise api_error(exc) from exc
        except asyncio.CancelledError:
            why = self.owner.control.aborted()
            if why is not None:
                await self._recorded_failure("aborted", why.reason)
                raise why.error() from None
            if asyncio.current_task() in self.owner.gone:  # the harness left (admission.watched)
                await self._recorded_failure("aborted", CLIENT_GONE)
                raise ClientGone(call.session_id) from None
            if self.owner.control.stopping:  # the server's grace is over: the record, then out
                await self._recorded_failure("aborted", SERVER_STOPPED)
            raise

    async def answer(self) -> Relayed:
        """The whole response, recorded before it is returned."""
        call = self.call
        engine = call.engine
        async with self._failures():
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
        await self._record_ok(data)
        out = orjson.loads(raw) if self.owner.store.keep_bodies else data  # the kept body: whole
        return Relayed(strip_response(out, call.asked, engine.dialect))

    async def open(self) -> AsyncGenerator[Relayed, None]:
        """The stream's chunks, once the engine answered the request (an error status, or its
        first chunk): failures before that are the harness's HTTP errors."""
        call = self.call
        engine = call.engine
        resp = None
        ready = False
        try:
            async with self._failures():
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
        return self._stream(resp, events, chunk)

    async def _stream(
        self,
        resp: aiohttp.ClientResponse,
        events: AsyncIterator[bytes],
        first: dict | None,
    ) -> AsyncGenerator[Relayed, None]:
        """The engine's chunks as the harness gets them: the finishing chunk and what follows
        are held back until the call is recorded."""
        call = self.call
        engine, cap = call.engine, call.cap
        keep = self.owner.store.keep_bodies
        chunks: list[dict] = []  # as the engine sent them (kept with --keep-bodies)
        held: list[dict] = []  # from the finishing chunk on: sent after the call is recorded
        status = "aborted"
        error: str | None = CLIENT_GONE
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
                    yield Relayed(out)
            if not done:
                raise EngineError(f"{engine.label} ended the stream before [DONE]", 502)
            problem = cap.missing()
            if problem:
                raise EngineError(problem, 502)
            status, error = "ok", None
        except EngineError as exc:
            status = "recorded"
            self._failed(call.bound, exc)
            await self._recorded_failure("error", str(exc), {"chunks": chunks} if keep else None)
            raise api_error(exc) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, error = "recorded", f"{engine.label} at {engine.url} failed: {exc}"
            await self._recorded_failure("error", error, {"chunks": chunks} if keep else None)
            raise APIError(502, error, type_="engine_error") from exc
        except asyncio.CancelledError:
            why = self.owner.control.aborted()  # a pause or the session's close
            if why is None:
                error = cancelled_why(self.owner.control, CLIENT_GONE)  # recorded below
                raise
            status = "recorded"
            resp.close()  # the engine stops before the record is written
            await self._recorded_failure(
                "aborted", why.reason, {"chunks": chunks} if keep else None
            )
            raise why.error() from None
        finally:
            resp.close()
            if status not in ("ok", "recorded"):
                self.record_failure(
                    status, error or "", response={"chunks": chunks} if keep else None
                )
        await self._record_ok({"chunks": chunks} if keep else None)
        for out in held:
            yield Relayed(out)
