"""A token-in call as its record: what was rendered, sampled and asked, as one
:class:`~turnstile.store.records.CallRecord`, and the node the call becomes in the session's tree
once the record is committed (``gateway.record.commit``)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Protocol

from ...chat.history import Node
from ...chat.history_hash import prefix_hashes
from ...chat.render import Renderer
from ...engines.base import Engine, Finish, SamplingParams, logprob_unfitness
from ...media import new_images
from ...request import ChatRequest
from ...store.records import CallRecord, new_id
from ..control import PolicyControl
from ..record import call_arrays, call_info, weight_version
from .prompting import Prompt
from .sampling import applied_sampling, behaviour_logprobs
from .session_trees import Tree


class Recording(Protocol):
    """What a token-in record says of the gateway that made it (``token_in.Gateway``)."""

    @property
    def renderer(self) -> Renderer: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def control(self) -> PolicyControl: ...

    @property
    def model_name(self) -> str: ...

    @property
    def default_max_tokens(self) -> int | None: ...


@dataclass
class Generation:
    """What the engine returned, accumulated."""

    ids: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("f"))
    top: list = field(default_factory=list)
    finish: Finish | None = None
    engine_url: str | None = None  # the replica that served the call


@dataclass
class Call:
    """One token-in call in the making: the session and tree it extends, its request, the
    prompt built for it, its sampling, when it began, and what the engine returned so far."""

    session_id: str
    tree: Tree
    req: ChatRequest
    prompt: Prompt
    params: SamplingParams
    started: float
    tail: str  # the prompt's end as text: does the generation prompt open a reasoning block?
    gen: Generation = field(default_factory=Generation)
    record: CallRecord | None = None  # once committed ok: what the dialects answer from


@dataclass
class Built:
    record: CallRecord
    node: Node  # added to the tree once the record is committed
    reply_hash: bytes | None  # the history hash a harness echoing the reply will send
    echo_hash: bytes | None  # the same with the stop string put back


def request_notes(gw: Recording, req: ChatRequest | None, params: SamplingParams) -> dict:
    """What the call record's info says about the request beyond the sampling: warnings
    (what was asked for but cannot act as asked), the dialect's state, the inert options."""
    warnings = []
    if req is not None and req.tools and gw.renderer.ignores_tools:
        warnings.append(
            "the chat template does not render 'tools': the model was not "
            "shown the tools (serve with --chat-template FILE that does)"
        )
    if (
        req is not None
        and "reasoning_effort" in req.template_kwargs
        and "reasoning_effort" not in gw.renderer.template.source
    ):
        warnings.append("the chat template does not read 'reasoning_effort'")
    if req is not None:
        warnings.extend(req.notes)
        if gw.renderer.drops_developer and any(m.get("role") == "developer" for m in req.messages):
            warnings.append(
                "the chat template drops 'developer' messages: they were rendered as 'system'"
            )
    warnings.extend(gw.engine.sampling_notes(params))
    out: dict = {}
    if warnings:
        out["warnings"] = warnings
    if req is not None and req.dialect_state:
        out["dialect_state"] = req.dialect_state
    if req is not None and req.inert:
        out["request_options"] = req.inert
    if req is not None and req.tool_choice == "required":
        out["parallel_tool_calls"] = req.parallel_tool_calls
    if req is not None and req.max_tokens is None and gw.default_max_tokens:
        out["max_tokens_default"] = gw.default_max_tokens  # the request named none
    return out


def build_record(
    gw: Recording,
    call: Call,
    status: str,
    message: dict | None,
    error: str | None,
    extra: dict | None = None,
) -> Built:
    session_id, tree, prompt, params = call.session_id, call.tree, call.prompt, call.params
    gen, started, req = call.gen, call.started, call.req
    finish = gen.finish
    stop_token = finish.stop_token_id if finish else None
    call_id = req.call_id or new_id("call_")
    node = Node(call_id, prompt.parent, prompt.delta, gen.ids, message, stop_token)
    mp = prompt.media
    if mp is not None:  # the images go on with the calls that extend this one
        node.media, node.images, node.media_placeholder = mp.media, mp.images, mp.placeholder
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
    version = gw.control.version
    # the call's own logprob kind judges it where the engine says it (an SGLang call answered
    # with its sampler's logprobs is processed; one asked that was not, scaled)
    kind = finish.logprob_kind if finish else None
    why = logprob_unfitness(kind, params) if kind else gw.engine.logprob_warning(params)
    info = {
        **call_info(
            model=gw.model_name,
            engine=gw.engine.name,
            fingerprint=gw.renderer.fingerprint,
            segment_detail=prompt.segment_detail,
            sampling=params.as_dict(),
            logprob_kind=finish.logprob_kind if finish else None,
            logprob_warning=why,
            engine_request_id=finish.engine_request_id if finish else None,
            weight_versions=finish.weight_versions if finish else None,
            version=weight_version(
                finish.weight_versions if finish else None,
                n,
                finish.weight_version if finish else None,
                version,
            ),
            policy_version=version,
            stop_string=finish.stop_string if finish else None,
            usage={
                "prompt_tokens": len(prompt.ids),
                "completion_tokens": n,
                "cached_tokens": finish.cached_tokens if finish else 0,
            },
            started=started,
            timings=finish.timings if finish else None,
            dialect=req.dialect,
        ),
        "engine_url": gen.engine_url,
        "sampling_applied": applied_sampling(
            gw.engine.sent_sampling(params),
            req,
            params,
            gw.default_max_tokens,
            finish.engine_sampling if finish else None,
        ),
        "behaviour_logprobs": behaviour_logprobs(kind, why),
        "engine_finish_reason": finish.engine_reason if finish else None,
        "stop_echo_hash": echo_hash.hex() if echo_hash else None,
        **({"lineage": prompt.lineage} if prompt.lineage else {}),
        **request_notes(gw, req, params),
        **({"arrays_asked": finish.asked} if finish and finish.asked else {}),
        **(extra or {}),
    }
    rec = CallRecord(
        id=call_id,
        session_id=session_id,
        seq=tree.take_seq(),
        parent_id=prompt.parent.id if prompt.parent else None,
        segment_reason=prompt.segment_reason,
        reused_prefix_len=len(prompt.ids) - len(prompt.delta),
        prompt_delta=prompt.delta,
        completion_ids=gen.ids,
        completion_logprobs=gen.logprobs,
        finish_reason=finish.reason if finish else None,
        stop_token_id=stop_token,
        seam=prompt.seam,
        status=status,
        error=error,
        message=message,
        history_hash=reply_hash,
        prefix_hashes=new_hashes,
        info=info,
        arrays=call_arrays(
            finish.weight_versions if finish else None,
            len(prompt.ids),
            n,
            finish.arrays if finish else None,
            gen.top,
            params.top_logprobs,
        ),
        media=mp.media if mp is not None else (),
        # the bytes of the images this call brings (a reused prefix's are stored already)
        images=new_images(mp, len(prompt.ids) - len(prompt.delta)) if mp is not None else {},
    )
    return Built(rec, node, reply_hash, echo_hash)
