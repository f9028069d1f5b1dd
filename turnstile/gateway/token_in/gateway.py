"""Token-in mode: Turnstile renders the prompt, the engine sees token IDs only.

:class:`Gateway` owns the pieces (renderer, engine, store, per-session call trees). For each
validated request it admits the call, holds the session's tree (``session_trees``),
builds the prompt (``prompting``) and sampling (``sampling``), and hands the
rest to a :class:`~.call.TokenCall`, which owns the call from there: the engine's
events, the parse, the record, the answer or the stream. It knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from ...answer import Answer, Event
from ...chat.policy import Policy
from ...chat.render import Renderer
from ...engines.base import Engine, EngineError, SamplingParams
from ...errors import APIError
from ...media import MediaError, images_refused, limits
from ...parsing import Parser
from ...parsing.call_ids import id_offset
from ...parsing.detect import FormatChoice
from ...request import ChatRequest
from ...store.store import Store
from ..admission import Chunks, admitted, open_stream, watched
from ..control import PolicyControl
from .call import TokenCall
from .prompting import Prompt, build_prompt
from .recording import Call
from .sampling import sampling_params
from .session_trees import Entry, SessionTrees, Tree


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
        shared: bool = False,
        default_max_tokens: int | None = None,
    ):
        """``shared``: other gateways record into this store too (``SessionTrees``);
        ``default_max_tokens``: the completion budget of a request that names none."""
        self.default_max_tokens = default_max_tokens
        self.renderer = renderer
        self.policy = policy or Policy.permissive()
        self.control = PolicyControl()
        self.control.can_hold = True  # a held call goes on from its partial output (token_in.call)
        self.tok = renderer.tok
        self.engine = engine
        self.store = store
        self.model_name = model_name
        self.parser = parser
        self.trees = SessionTrees(store, renderer, max_trees, shared)
        self.gone: set[asyncio.Task] = set()  # calls whose harness went away (TokenCall)

    # The Chat dialect validates requests in full: Turnstile renders and samples them itself.
    renders_prompt = True

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
            self.default_max_tokens,
        )

    @property
    def template_ignores_tools(self) -> bool:
        return self.renderer.ignores_tools

    def parser_for(self, req: ChatRequest, tail: str) -> Parser:
        """The parser for this completion; the prompt's tail says whether the generation
        prompt already opened a reasoning block (``enable_thinking`` varies per request)."""
        return self.parser.parser(
            tail,
            tools=req.tools,
            tool_calls=bool(req.tools),
            calls_before=id_offset(self.parser.id_style, req.messages),
        )

    # the call

    async def start(self, session_id: str, req: ChatRequest, tree: Tree) -> TokenCall:
        """The call's prompt and sampling (render errors are the harness's 400s)."""
        started = time.time()
        prompt = self.prompt(tree, req)
        if prompt.media is not None:
            why = images_refused(self.engine.name)
            if why:
                raise APIError(400, why, "messages", code="images_not_supported")
            # the session's distinct images over all its branches, this call's new ones
            # counted at admission (before any await: a concurrent call sees them)
            seen = tree.image_hashes
            new = {m.sha256 for m in prompt.media.media} - seen
            try:
                limits().check_session(len(seen), len(new))
            except MediaError as exc:
                raise APIError(400, str(exc), "messages", code="invalid_image") from None
            seen |= new
        # the session's first arrival (before any await: a concurrent call sees it)
        first = tree.first_request is None
        if first:
            tree.first_request = prompt.hashes[-1]
        tail = self.tok.decode(prompt.ids[-16:].tolist())  # enough to see an opened block
        try:
            params = await self.sampling(req, len(prompt.ids), tail)
        except BaseException:
            if first and tree.first_request == prompt.hashes[-1]:
                tree.first_request = None  # refused: it never became a call
            raise
        if prompt.parent is not None:  # per-token arrays (routed experts): the parent's
            # record holds rows up to its last token, which it never forwarded (token_arrays)
            params.rows_from = max(0, len(prompt.ids) - len(prompt.delta) - 1)
        return TokenCall(self, Call(session_id, tree, req, prompt, params, started, tail))

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
                    self.gone,
                )
            finally:
                self.trees.release(session_id, entry)

    async def _complete(self, session_id: str, req: ChatRequest, tree: Tree) -> Answer:
        call = await self.start(session_id, req, tree)
        return await call.answer()

    async def stream(self, session_id: str, req: ChatRequest) -> Chunks:
        """The events of a streamed completion. The prompt is rendered (and errors raised)
        before the first; the call is recorded before its ``Done`` is sent."""
        entry: Entry | None = None

        async def prepare() -> AsyncGenerator[Event, None]:
            nonlocal entry
            entry = self.trees.hold(session_id)
            call = await self.start(session_id, req, entry.tree)
            return call.chunks()

        def release() -> None:
            if entry is not None:
                self.trees.release(session_id, entry)

        return await open_stream(
            self.control,
            prepare,
            release,
            session_id,
        )
