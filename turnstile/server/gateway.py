"""The hot path of one chat completion: request → render → engine → parse → record → response.

:class:`Gateway` owns the pieces (renderer, engine, store, per-session call trees) and turns a
validated Chat Completions request into either one response dict or a stream of chunk dicts.
It knows nothing about HTTP; ``server.app`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from ..chat.detokenize import IncrementalDetokenizer
from ..chat.history import Node, SessionTree, describe_divergence, prefix_hashes, root_hash
from ..chat.policy import Policy, append_kind, has_reasoning
from ..chat.render import NotPrefixPreserving, Renderer
from ..chat.template import TemplateError
from ..engines.base import Engine, EngineError, Finish, SamplingParams, TokenEvent
from ..parsing import Parser, grammar
from ..parsing.call_ids import calls_before
from ..parsing.detect import FormatChoice
from ..store.records import CallRecord, new_id
from ..store.sqlite import SessionGone, Store
from .admission import POLICY_ABORT, Chunks, admitted, open_stream, policy_abort
from .control import PolicyControl, Ticket
from .errors import APIError
from .record import STORE_ERRORS, call_info, commit, store_error, weight_version
from .requests import ChatRequest, parse_chat_request

CLIENT_GONE = "the client disconnected"


class ClientGone(Exception):
    """The harness went away before its (non-streamed) answer was ready."""


@dataclass
class _Tree(SessionTree):
    """A session's tree with the creation time of the session it was built for: a call that
    began in it is recorded only into that incarnation of the id."""

    created: float | None = None


@dataclass
class _Session:
    """A cached call tree: the session incarnation it belongs to, and its running calls."""

    tree: _Tree
    created: float | None
    busy: int = 0
    evict: bool = False  # closed while a call ran: dropped when the last one ends


@dataclass
class Prompt:
    """The prompt of one call and how it was obtained."""

    ids: array
    delta: array  # the tokens after the reused prefix (the whole prompt for a new segment)
    parent: Node | None
    hashes: list[bytes]
    segment_reason: str | None = None  # why the call starts a new segment, if it does
    segment_detail: str | None = None
    seam: str | None = None


@dataclass
class Generation:
    """What the engine returned, accumulated."""

    ids: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("f"))
    top: list = field(default_factory=list)
    finish: Finish | None = None
    engine_url: str | None = None  # the replica that served the call


def _cut_stop(text: str, finish: Finish | None) -> str:
    """The text a harness gets: OpenAI leaves a matched stop string (and anything the last
    token carried after it) out. The record keeps every sampled ID."""
    stop = finish.stop_string if finish else None
    if stop:
        i = text.find(stop)
        if i >= 0:
            return text[:i]
    return text


def _held(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could begin a stop string: a stream holds
    them back until the next tokens show whether the stop string follows."""
    n = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), n, -1):
            if text.endswith(s[:k]):
                n = k
                break
    return n


def _finish_reason(tool_calls: bool, finish: Finish) -> str:
    """As OpenAI and vLLM: a reply cut by the token limit is "length" even when it holds a
    (then truncated) tool call; "tool_calls" only for calls the model finished."""
    if finish.reason == "length":
        return "length"
    return "tool_calls" if tool_calls else finish.reason


def with_echoed_ids(reply: dict, echoed: dict) -> dict:
    """Our recorded reply with the tool-call IDs the harness echoed: the tool results that
    follow refer to those, and templates look names up by them (Solar-Open, Gemma 4)."""
    ours, theirs = reply.get("tool_calls") or [], echoed.get("tool_calls") or []
    if len(ours) != len(theirs) or all(a.get("id") == b.get("id") for a, b in
                                       zip(ours, theirs, strict=True)):
        return reply
    calls = [{**a, "id": b.get("id")} for a, b in zip(ours, theirs, strict=True)]
    return {**reply, "tool_calls": calls}


class Gateway:
    def __init__(self, renderer: Renderer, engine: Engine, store: Store, model_name: str,
                 parser: FormatChoice, policy: Policy | None = None, max_trees: int = 1024):
        self.renderer = renderer
        self.policy = policy or Policy.permissive()
        self.control = PolicyControl()
        self.tok = renderer.tok
        self.engine = engine
        self.store = store
        self.model_name = model_name
        self.parser = parser
        # Call trees of recent sessions, least recently used first; a tree is rebuilt from the
        # store when it is needed again (after a restart, an eviction or a close).
        self.max_trees = max_trees
        self._trees: OrderedDict[str, _Session] = OrderedDict()
        self._gone: set[asyncio.Task] = set()  # calls whose harness went away
        self._ignores_tools: bool | None = None

    def parse_request(self, body: object) -> ChatRequest:
        """The request, validated in full: Turnstile renders and samples it itself."""
        return parse_chat_request(body)

    # sessions

    def forget(self, session_id: str) -> None:
        """Drop a deleted session's cached tree (a reused id starts empty)."""
        self._trees.pop(session_id, None)
        self.engine.forget(session_id)

    def closed(self, session_id: str) -> None:
        """A closed session takes no more calls: free its tree (now, or when its last running
        call ends). It is rebuilt from the store if it is ever read again."""
        entry = self._trees.get(session_id)
        if entry is not None:
            if entry.busy:
                entry.evict = True
            else:
                del self._trees[session_id]

    def _hold(self, session_id: str) -> _Session:
        self.tree(session_id)
        entry = self._trees[session_id]
        entry.busy += 1
        return entry

    def _unhold(self, session_id: str, entry: _Session) -> None:
        entry.busy -= 1
        if entry.busy <= 0 and entry.evict and self._trees.get(session_id) is entry:
            del self._trees[session_id]
        self._trim()

    def _trim(self) -> None:
        """Keep at most ``max_trees`` cached trees, dropping the least recently used idle
        ones (a tree with a running call stays: its call adds to it when it commits)."""
        if len(self._trees) <= self.max_trees:
            return
        for sid in [sid for sid, e in list(self._trees.items())[:-1] if not e.busy]:
            if len(self._trees) <= self.max_trees:
                break
            del self._trees[sid]

    def tree(self, session_id: str) -> _Tree:
        """The session's call tree, rebuilt from the store the first time after a restart.
        Calls rendered under another template/tokenizer fingerprint stay in the tree but are
        never extended: their tokens are not what this renderer would produce."""
        entry = self._trees.get(session_id)
        if entry is not None:
            self._trees.move_to_end(session_id)
            return entry.tree
        created = self.store.session_created(session_id)
        tree = _Tree(content_format=self.renderer.template.content_format, created=created)
        for c in self.store.calls(session_id):
            parent = tree.nodes.get(c.parent_id) if c.parent_id else None
            node = Node(c.id, parent, c.prompt_delta, c.completion_ids, c.message,
                        c.stop_token_id)
            tree.nodes[c.id] = node
            tree.n_calls += 1
            tree.known.update(c.prefix_hashes)
            if c.status == "ok" and c.history_hash is not None:
                if c.info.get("fingerprint") == self.renderer.fingerprint:
                    tree.replies.setdefault(c.history_hash, []).append(c.id)
                    if c.info.get("stop_echo_hash"):
                        echo = bytes.fromhex(c.info["stop_echo_hash"])
                        tree.replies.setdefault(echo, []).append(c.id)
                        tree.known.add(echo)
                else:
                    tree.stale[c.history_hash] = c.id
        self._trees[session_id] = _Session(tree, created)
        self._trim()
        return tree

    # render

    def prompt(self, tree: SessionTree, req: ChatRequest) -> Prompt:
        root = root_hash(req.tools, req.template_kwargs)
        match = tree.match(req.messages, root)
        parent = match.parent
        reason = detail = None
        if parent is not None:
            new = match.new_messages
            kind = append_kind(new)
            # reasoning anywhere on the path, recorded or echoed (after a segment break the
            # recorded calls may not show it)
            think = parent.has_reasoning() or has_reasoning(req.messages)
            variant = "think" if think else "plain"
            if any(m.get("role") == "assistant" for m in new):
                reason = "unsampled_assistant_message"
                detail = "the new messages include an assistant turn the model did not sample"
            elif not self.policy.allows(kind, variant):
                reason, detail = "template_policy", self.policy.reason(kind, variant)
            else:
                try:
                    first = req.messages[0]
                    system = first if first.get("role") in ("system", "developer") else None
                    reply = with_echoed_ids(parent.message or {}, req.messages[match.matched - 1])
                    delta, seam = self.renderer.extension(
                        reply, new, req.tools, parent.stop_token_id, system,
                        **req.template_kwargs)
                except NotPrefixPreserving as exc:
                    reason, detail = "template_not_prefix_preserving", str(exc)
                except TemplateError as exc:
                    # the stand-in conversation failed; the full render decides (400 if the
                    # template refuses the real conversation too)
                    reason = "template_not_prefix_preserving"
                    detail = f"the delta could not be rendered: {exc}"[:300]
                else:
                    ids = parent.context_ids()
                    d = array("i", delta)
                    ids.extend(d)
                    return Prompt(ids, d, parent, match.hashes, seam=seam.kind,
                                  segment_detail=match.note)
        elif match.stale is not None:
            reason = "template_changed"
            detail = (f"the messages continue {match.stale}, recorded under another template/"
                      f"tokenizer fingerprint; this server renders with "
                      f"{self.renderer.fingerprint}")
        elif match.matched == len(req.messages) and tree.requests.get(match.hashes[-1]):
            reason = "first_call"  # a new root: the same request as an earlier one (a retry)
            detail = f"a retry: the same messages as {tree.requests[match.hashes[-1]]}"
        elif tree.n_calls == 0:
            reason = "first_call"
        else:
            reason = "history_diverged"
            detail = describe_divergence(tree, req.messages, match.hashes, match.matched)
        try:
            ids = array("i", self.renderer.render_full(req.messages, req.tools,
                                                       **req.template_kwargs))
        except TemplateError as exc:
            raise APIError(400, str(exc), "messages") from exc
        return Prompt(ids, ids, None, match.hashes, reason, detail)

    async def sampling(self, req: ChatRequest, prompt_len: int, prompt_tail: str = ""
                       ) -> SamplingParams:
        if not self.engine.context_length:
            try:
                await self.engine.refresh()
            except EngineError as exc:
                raise APIError(exc.status, str(exc), type_="engine_unavailable") from exc
        room = self.engine.context_length - prompt_len
        if room <= 0:
            raise APIError(400, f"The prompt is {prompt_len} tokens; the model's context is "
                                f"{self.engine.context_length}. Shorten the messages.",
                           "messages", code="context_length_exceeded")
        return SamplingParams(
            max_tokens=min(req.max_tokens or room, room),
            temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=req.stop,
            top_logprobs=req.top_logprobs, logit_bias=req.logit_bias,
            # vLLM/SGLang stop on the template's end-of-turn even if the model config omits it
            stop_token_ids=sorted(self.tok.eog_token_ids),
            grammar=self.tool_grammar(req, prompt_tail), json_schema=req.json_schema,
            frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty, top_k=req.top_k, min_p=req.min_p)

    def tool_grammar(self, req: ChatRequest, prompt_tail: str = "") -> str | None:
        """For ``tool_choice`` "required" or a named function: a grammar that admits only a
        call in the template's own syntax. The call record keeps it (``sampling.grammar``):
        the sample came from a masked distribution."""
        if req.tool_choice not in ("required", "function"):
            return None
        fmt = self.parser.tool_format
        if not grammar.supports(fmt):
            raise APIError(400, f"tool_choice={req.tool_choice!r} needs constrained decoding in "
                                f"this template's tool-call syntax ({fmt or 'none detected'}), "
                                "which Turnstile cannot build yet; use 'auto'.", "tool_choice")
        close = None
        if self.parser.reasoning_tags and self.parser.reasoning_started(prompt_tail):
            close = self.parser.reasoning_tags[1]
        return grammar.tool_call_grammar(fmt, req.tools or [], req.forced_function, close,
                                         parallel=req.tool_choice == "required" and
                                         req.parallel_tool_calls)

    @property
    def template_ignores_tools(self) -> bool:
        """True when the chat template renders the same prompt with and without ``tools``
        (SmolLM2's, for one): a request's tools then never reach the model."""
        if self._ignores_tools is None:
            msgs = [{"role": "user", "content": "hi"}]
            probe = [{"type": "function", "function": {
                "name": "turnstile_probe", "description": "probe",
                "parameters": {"type": "object", "properties": {}}}}]
            try:
                self._ignores_tools = (self.renderer.render_full(msgs, probe) ==
                                       self.renderer.render_full(msgs, None))
            except TemplateError:
                self._ignores_tools = False  # it reads tools (and refuses this probe)
        return self._ignores_tools

    def call_notes(self, req: ChatRequest | None, params: SamplingParams) -> dict:
        """What the call record's info says about the request beyond the sampling: warnings
        (what was asked for but cannot act as asked) and the inert OpenAI options."""
        warnings = []
        if req is not None and req.tools and self.template_ignores_tools:
            warnings.append("the chat template does not render 'tools': the model was not "
                            "shown the tools (serve with --chat-template FILE that does)")
        if req is not None and "reasoning_effort" in req.template_kwargs and \
                "reasoning_effort" not in self.renderer.template.source:
            warnings.append("the chat template does not read 'reasoning_effort'")
        warnings.extend(self.engine.sampling_notes(params))
        out: dict = {}
        if warnings:
            out["warnings"] = warnings
        if req is not None and req.inert:
            out["request_options"] = req.inert
        if req is not None and req.tool_choice == "required":
            out["parallel_tool_calls"] = req.parallel_tool_calls
        return out

    # record

    async def record(self, session_id: str, tree: _Tree, prompt: Prompt,
                     params: SamplingParams, gen: Generation, status: str,
                     message: dict | None, error: str | None, started: float,
                     extra: dict | None = None, req: ChatRequest | None = None,
                     response: dict | None = None) -> CallRecord:
        """Commit the call, then (and only then) add it to the session's tree. The write runs
        off the event loop; if the store fails, the harness gets a clean 503/507/404 and
        nothing can extend the call. A cancellation while the write runs lets it finish (and
        the tree follow it) before the cancellation goes on."""
        rec, fut = self._commit(session_id, tree, prompt, params, gen, status, message, error,
                                started, extra, req, response)
        try:
            await asyncio.shield(fut)
        except STORE_ERRORS as exc:
            if isinstance(exc, SessionGone):
                self.forget(session_id)
            raise store_error(exc, session_id) from exc
        return rec

    def record_later(self, session_id: str, tree: _Tree, prompt: Prompt,
                     params: SamplingParams, gen: Generation, status: str,
                     message: dict | None, error: str | None, started: float,
                     extra: dict | None = None, req: ChatRequest | None = None) -> None:
        """Record a call nobody waits for (its harness is gone): the write runs on its own."""
        self._commit(session_id, tree, prompt, params, gen, status, message, error, started,
                     extra, req)

    def _commit(self, session_id: str, tree: _Tree, prompt: Prompt,
                params: SamplingParams, gen: Generation, status: str, message: dict | None,
                error: str | None, started: float, extra: dict | None = None,
                req: ChatRequest | None = None, response: dict | None = None
                ) -> tuple[CallRecord, asyncio.Future]:
        finish = gen.finish
        stop_token = finish.stop_token_id if finish else None
        call_id = new_id("call_")
        node = Node(call_id, prompt.parent, prompt.delta, gen.ids, message, stop_token)
        reply_hash = echo_hash = None
        if status == "ok" and message is not None:
            reply_hash = prefix_hashes(prompt.hashes[-1], [message], tree.content_format)[1]
            if finish and finish.stop_string and isinstance(message.get("content"), str):
                # Harnesses that stop on a string put it back (smolagents' "</code>"): the
                # sampled tokens hold it, so that echo continues this call too.
                again = {**message, "content": message["content"] + finish.stop_string}
                echo_hash = prefix_hashes(prompt.hashes[-1], [again], tree.content_format)[1]
        # what tree.add will find new (persisted with the call, for the rebuild)
        new_hashes = [h for h in prompt.hashes if h not in tree.known]
        if reply_hash is not None and reply_hash not in tree.known:
            new_hashes.append(reply_hash)
        n = len(gen.ids)
        info = {
            **call_info(
                model=self.model_name, engine=self.engine.name,
                fingerprint=self.renderer.fingerprint, segment_detail=prompt.segment_detail,
                sampling=params.as_dict(), logprob_kind=finish.logprob_kind if finish else None,
                logprob_warning=self.engine.logprob_warning(params),
                engine_request_id=finish.engine_request_id if finish else None,
                weight_versions=finish.weight_versions if finish else None,
                version=weight_version(finish.weight_versions if finish else None, n,
                                       finish.weight_version if finish else None,
                                       self.control.version),
                policy_version=self.control.version,
                stop_string=finish.stop_string if finish else None,
                usage={"prompt_tokens": len(prompt.ids), "completion_tokens": n,
                       "cached_tokens": finish.cached_tokens if finish else 0},
                started=started, timings=finish.timings if finish else None),
            "engine_url": gen.engine_url,
            "engine_finish_reason": finish.engine_reason if finish else None,
            "stop_echo_hash": echo_hash.hex() if echo_hash else None,
            **self.call_notes(req, params),
            **(extra or {}),
        }
        rec = CallRecord(
            id=call_id, session_id=session_id, seq=tree.n_calls,
            parent_id=prompt.parent.id if prompt.parent else None,
            segment_reason=prompt.segment_reason,
            reused_prefix_len=len(prompt.ids) - len(prompt.delta),
            prompt_delta=prompt.delta, completion_ids=gen.ids, completion_logprobs=gen.logprobs,
            finish_reason=finish.reason if finish else None, stop_token_id=stop_token,
            seam=prompt.seam, status=status, error=error, message=message,
            history_hash=reply_hash, prefix_hashes=new_hashes, info=info)
        fut = commit(self.store, rec, req.raw if req else None, response, tree.created,
                     then=lambda: tree.add(node, prompt.hashes, reply_hash, echo_hash))
        return rec, fut

    # the call

    async def _events(self, session_id: str, prompt: Prompt, params: SamplingParams,
                      gen: Generation, stream: bool) -> AsyncIterator[list[TokenEvent]]:
        """Batches of engine events, accumulated into ``gen``; sets ``gen.finish``."""
        eog = self.tok.eog_token_ids
        engine = self.engine.pick(session_id)  # the session's replica
        gen.engine_url = engine.url
        async for batch in engine.generate(prompt.ids, params, stream=stream):
            if isinstance(batch, Finish):
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
        raise EngineError(f"the {self.engine.name} engine ended the generation without saying "
                          "how it finished", 502)

    def _parser(self, req: ChatRequest, tail: str) -> Parser:
        """The parser for this completion; the prompt's tail says whether the generation
        prompt already opened a reasoning block (``enable_thinking`` varies per request)."""
        return self.parser.parser(tail, tools=req.tools, tool_calls=bool(req.tools),
                                  calls_before=calls_before(req.messages))

    def _tail(self, prompt: Prompt) -> str:
        """The end of the prompt as text: enough to see an opened reasoning block."""
        return self.tok.decode(prompt.ids[-16:].tolist())

    def _text_ids(self, gen: Generation) -> list[int]:
        ids = gen.ids.tolist()
        if gen.finish and gen.finish.stop_token_id is not None and ids and ids[-1] in \
                self.tok.eog_token_ids:
            ids = ids[:-1]
        return ids

    async def complete(self, session_id: str, req: ChatRequest,
                       disconnected: Callable[[], Awaitable[object]] | None = None) -> dict:
        """The whole response. ``disconnected`` returns when the harness goes away: the
        engine call is then abandoned (the engine stops on the dropped connection), the call
        recorded as aborted, and :class:`ClientGone` raised."""
        async with admitted(self.control) as ticket:
            entry = self._hold(session_id)
            try:
                if disconnected is None:
                    return await self._complete(session_id, req, entry.tree)
                return await self._watched(session_id, req, entry.tree, ticket, disconnected)
            finally:
                self._unhold(session_id, entry)

    async def _watched(self, session_id: str, req: ChatRequest, tree: _Tree,
                       ticket: Ticket, disconnected: Callable[[], Awaitable[object]]) -> dict:
        call = asyncio.ensure_future(self._complete(session_id, req, tree, ticket))
        watch = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            watch.cancel()
            if self.control.aborted():  # paused with abort before the call had begun
                raise policy_abort() from None
            raise
        if call.done():
            watch.cancel()
            return call.result()
        self._gone.add(call)
        call.cancel()
        try:
            await call
        except (asyncio.CancelledError, ClientGone, APIError):
            pass
        finally:
            self._gone.discard(call)
        raise ClientGone(session_id)

    async def _complete(self, session_id: str, req: ChatRequest, tree: _Tree,
                        ticket: Ticket | None = None) -> dict:
        if ticket is not None:
            self.control.bind(ticket)  # pause(abort) cancels this task
            if ticket.abort:
                raise policy_abort()
        started = time.time()
        prompt = self.prompt(tree, req)
        tail = self._tail(prompt)
        params = await self.sampling(req, len(prompt.ids), tail)
        gen = Generation()
        try:
            async for _ in self._events(session_id, prompt, params, gen, stream=False):
                pass
        except EngineError as exc:
            await self.record(session_id, tree, prompt, params, gen, "error", None, str(exc),
                              started, req=req)
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except asyncio.CancelledError:
            if self.control.aborted():
                await self.record(session_id, tree, prompt, params, gen, "aborted", None,
                                  POLICY_ABORT, started, req=req)
                raise policy_abort() from None
            if asyncio.current_task() in self._gone:
                await self.record(session_id, tree, prompt, params, gen, "aborted", None,
                                  CLIENT_GONE, started, req=req)
                raise ClientGone(session_id) from None
            raise
        text = _cut_stop(self.tok.decode(self._text_ids(gen)), gen.finish)
        parser = self._parser(req, tail)
        parser.feed(text)
        parser.finish()
        parsed = parser.result()
        message = parsed.to_openai()
        assert gen.finish is not None  # _events raised otherwise
        finish_reason = _finish_reason(bool(parsed.tool_calls), gen.finish)
        choice = {"index": 0, "message": message, "finish_reason": finish_reason,
                  "logprobs": self._logprobs(gen) if req.logprobs else None}
        rec = await self.record(session_id, tree, prompt, params, gen, "ok", message, None,
                                started, {"parse_status": parsed.parse_status}, req,
                                {"choices": [choice]})
        return {
            "id": "chatcmpl-" + rec.id.removeprefix("call_"),
            "object": "chat.completion",
            "created": int(started),
            "model": req.model or self.model_name,
            "choices": [choice],
            "usage": self._usage(rec),
        }

    async def stream(self, session_id: str, req: ChatRequest) -> Chunks:
        """Chunks of a streamed completion. The prompt is rendered (and errors raised) before
        the first chunk; the call is recorded before the final chunk is sent."""
        entry: _Session | None = None

        async def prepare() -> AsyncGenerator[dict, None]:
            nonlocal entry
            entry = self._hold(session_id)
            started = time.time()
            prompt = self.prompt(entry.tree, req)
            tail = self._tail(prompt)
            params = await self.sampling(req, len(prompt.ids), tail)
            return self._stream_chunks(session_id, req, entry.tree, prompt, params, started,
                                       tail)

        def release() -> None:
            if entry is not None:
                self._unhold(session_id, entry)

        return await open_stream(self.control, prepare, release)

    async def _stream_chunks(self, session_id: str, req: ChatRequest, tree: _Tree,
                             prompt: Prompt, params: SamplingParams, started: float, tail: str
                             ) -> AsyncGenerator[dict, None]:
        gen = Generation()
        parser = self._parser(req, tail)
        detok = IncrementalDetokenizer(self.tok)
        chunk_id = "chatcmpl-" + new_id("")
        model = req.model or self.model_name

        def chunk(delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if logprobs is not None:
                choice["logprobs"] = {"content": logprobs}
            out = {"id": chunk_id, "object": "chat.completion.chunk", "created": int(started),
                   "model": model, "choices": [choice]}
            if req.include_usage:
                out["usage"] = None
            return out

        yield chunk({"role": "assistant", "content": ""})
        eog = self.tok.eog_token_ids
        status = "aborted"
        error: str | None = CLIENT_GONE
        stops = params.stop
        held = ""  # with stop strings: text that may be the start of one, not sent yet
        stopped = False  # a stop string was seen: nothing after it is sent

        def visible(text: str, last: bool = False) -> str:
            nonlocal held, stopped
            if not stops or stopped:
                return "" if stopped else text
            held += text
            cut = min([i for x in stops if (i := held.find(x)) >= 0], default=-1)
            if cut >= 0:
                out, held, stopped = held[:cut], "", True
                return out
            keep = 0 if last else _held(held, stops)
            out, held = held[:len(held) - keep], held[len(held) - keep:]
            return out

        try:
            async for batch in self._events(session_id, prompt, params, gen, stream=True):
                # One pass per batch: the tokens that arrived together leave in one chunk
                # (or a few, when the parser splits content from a tool call).
                sampled = [ev for ev in batch if ev.token_id not in eog]
                text = visible("".join([detok.push(ev.token_id) for ev in sampled]))
                lp = [self._logprob_entry(ev.token_id, ev.logprob, ev.top or [])
                      for ev in sampled] if req.logprobs and sampled else None
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
                await self.record(session_id, tree, prompt, params, gen, "error", None,
                                  str(exc), started, req=req)
            raise APIError(exc.status, str(exc), type_="engine_error") from exc
        except asyncio.CancelledError:
            if not self.control.aborted():
                raise
            error = POLICY_ABORT
            raise policy_abort() from None
        finally:
            if status not in ("ok", "recorded"):
                # The harness did not get a whole response: keep the tokens, mark the call.
                # Nobody waits for this write (the stream may be being torn down).
                self.record_later(session_id, tree, prompt, params, gen, status, None, error,
                                  started, req=req)
        parsed = parser.result()
        message = parsed.to_openai()
        assert gen.finish is not None  # _events raised otherwise
        finish_reason = _finish_reason(bool(parsed.tool_calls), gen.finish)
        rec = await self.record(session_id, tree, prompt, params, gen, "ok", message, None,
                                started, {"parse_status": parsed.parse_status}, req,
                                {"choices": [{"message": message,
                                              "finish_reason": finish_reason}]})
        yield chunk({}, finish_reason)
        if req.include_usage:
            last = chunk({})
            last["choices"] = []
            last["usage"] = self._usage(rec)
            yield last

    # response pieces

    def _usage(self, rec: CallRecord) -> dict:
        u = rec.info["usage"]
        return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
                "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]}}

    def _logprob_entry(self, tid: int, logprob: float, top: list) -> dict:
        text = self.tok.decode([tid])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": (t := self.tok.decode([i])), "logprob": lp,
                     "bytes": list(t.encode())} for i, lp in top]}

    def _logprobs(self, gen: Generation) -> dict:
        tops = gen.top or [[] for _ in gen.ids]
        return {"content": [self._logprob_entry(t, lp, top)
                            for t, lp, top in zip(gen.ids, gen.logprobs, tops, strict=False)
                            if t not in self.tok.eog_token_ids], "refusal": None}
