"""Passthrough capture: forward Chat Completions to an engine that renders them itself, and
record the token IDs it reports.

For models Turnstile cannot render (or as a cross-check of its own rendering), the request
goes to the engine's ``/v1/chat/completions`` as the harness sent it, plus only what is needed
to get the tokens back, and what the harness did not ask for is taken out of the response
again (``engines.capture``, ``engines.capture_dialects``). This module is the gateway: it links
each call into the session's token-prefix lineage (``lineage``) and records it, through
the same door (``gateway.admission``) and record fields (``gateway.record``) as token-in.

The engine renders every prompt, so nothing prevents retokenization drift: it is *detected*.
A call whose prompt IDs start with a recorded call's prompt + completion is that call's child
(the rest is its prompt delta). A call that extends no recorded call starts a new segment, and
the record says why and exactly where it left the closest recorded conversation:

- ``first_call``: the session's first request to arrive (``chat.lineages``: the same rule
  and words as token-in mode);
- ``drift``: the request's messages continue a recorded call (its request + the reply we
  returned, compared as the default mode compares them), but the engine's prompt IDs do not
  extend that call's prompt + completion: the engine re-tokenized or re-rendered history;
- ``history_diverged``: the leading messages are a recorded conversation's, but they continue
  no recorded call (edited or compacted history, or assistant turns not sampled here);
- ``new_conversation``: a new lineage: not even the first message is a recorded
  conversation's (another system prompt, a title request, a sub-agent).

Every segment root after the first carries ``info.drift``: the token index where the prompt
leaves the closest recorded call, which call's prompt delta or completion holds that token,
and the recorded and received token IDs (and their text, from the engine's detokenizer) around
it. ``segment_detail`` says the same in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from ...answer import Event, Relayed
from ...chat.history_hash import prefix_hashes, root_hash
from ...engines.base import EngineError
from ...engines.capture import Capture, CaptureEngine
from ...engines.pool import Bound, ReplicaPool
from ...errors import APIError
from ...request import ChatRequest
from ...store.store import Store
from ..admission import Chunks, admitted, open_stream, watched
from ..control import PolicyControl
from .call import CaptureCall, api_error
from .lineage import LineageIndex
from .recording import Call


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
        self.gone: set[asyncio.Task] = set()  # calls whose harness went away (CaptureCall)

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

    # The engine renders each request: the Chat dialect checks only what Turnstile relies on
    # and leaves the rest to the engine (its 4xx reaches the harness as is).
    renders_prompt = False

    async def _target(self, session_id: str) -> tuple[CaptureEngine, Bound[CaptureEngine] | None]:
        """The engine for this session, and the pool's binding when there are replicas (a
        pool keeps a session on one replica)."""
        try:
            picked = self.engine.pick(session_id)
        except EngineError as exc:
            raise api_error(exc) from exc
        bound = picked if isinstance(picked, Bound) else None
        engine = picked.engine if isinstance(picked, Bound) else picked
        if engine.model is None:  # unreachable when Turnstile started: learn its version now
            with contextlib.suppress(EngineError):
                await engine.refresh()
        return engine, bound

    # the call

    def count_tokens(self, session_id: str, req: ChatRequest) -> int:
        raise APIError(
            400,
            "Capture mode (serve --passthrough) cannot count tokens: the "
            "engine renders the prompt.",
            code="unsupported_dialect",
        )

    async def start(self, session_id: str, req: ChatRequest) -> CaptureCall:
        """The call, bound to its engine replica, with the body it sends (what the harness
        sent, plus what gets the token IDs back)."""
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
        call = Call(
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
        idx = self.index(session_id)
        if idx.first_request is None and idx.n_calls == 0:  # the session's first arrival
            idx.first_request = prefix_hashes(
                root_hash(req.tools, req.template_kwargs), req.messages
            )[-1]
        return CaptureCall(self, call)

    async def complete(
        self,
        session_id: str,
        req: ChatRequest,
        disconnected: Callable[[], Awaitable[object]] | None = None,
    ) -> Relayed:
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
                self.gone,
            )

    async def _complete(self, session_id: str, req: ChatRequest) -> Relayed:
        return await (await self.start(session_id, req)).answer()

    async def stream(self, session_id: str, req: ChatRequest) -> Chunks:
        """Chunks of a streamed completion. The engine's answer to the request (an error
        status, or the first chunk) is awaited before the stream starts, so failures there are
        HTTP errors; the call is recorded before the last chunk reaches the harness."""

        async def prepare() -> AsyncGenerator[Event, None]:
            return await (await self.start(session_id, req)).open()

        return await open_stream(self.control, prepare, session_id=session_id)
