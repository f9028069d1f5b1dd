"""A call's prompt: reuse the tokens recorded for the conversation it continues and render only
the new messages, or render it whole as a new segment and say why."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from ...chat.divergence import describe_divergence
from ...chat.history import Node, SessionTree
from ...chat.history_hash import root_hash
from ...chat.lineages import root_reason
from ...chat.policy import Policy, append_kind
from ...chat.render import NotPrefixPreserving, Renderer
from ...chat.template import TemplateError
from ...errors import APIError
from ...media import MediaError, MediaPrompt, join
from ...request import ChatRequest


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
    # a new segment's lineage: the call whose conversation it rewrites or retries (``None``:
    # it starts a lineage of its own)
    lineage: str | None = None
    # a prompt with images: ``ids`` and ``delta`` are EXPANDED (each image's whole block, as
    # the model's processor writes it) and this carries the images (turnstile.media)
    media: MediaPrompt | None = None

    @property
    def engine_prompt(self) -> array | MediaPrompt:
        """What the engine is given: the IDs, or with images the value that carries them."""
        return self.ids if self.media is None else self.media


def _images_in(req: ChatRequest, messages: list[dict]) -> list:
    """The images of ``messages``' parts, in order (dialects/images.py made the parts)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for p in content:
                if isinstance(p, dict) and p.get("type") == "image" and "sha256" in p:
                    out.append(req.images[p["sha256"]])
    return out


def _expanded(renderer: Renderer, req: ChatRequest, messages: list[dict], ids: array):
    """``ids`` with each image placeholder expanded by the model's processor (a
    :class:`MediaPrompt`), or ``ids`` as they are when ``messages`` hold no image."""
    images = _images_in(req, messages) if req.images else []
    if not images:
        return ids
    if renderer.images is None:
        raise APIError(400, "this model takes no images (it has no image processor)", "messages")
    try:
        return renderer.images.expand(ids, images)
    except MediaError as exc:
        raise APIError(400, str(exc), "messages", code="invalid_image") from exc


def with_echoed_ids(reply: dict, echoed: dict) -> dict:
    """Our recorded reply with the tool-call IDs the harness echoed: the tool results that
    follow refer to those, and templates look names up by them (Solar-Open, Gemma 4)."""
    ours, theirs = reply.get("tool_calls") or [], echoed.get("tool_calls") or []
    if len(ours) != len(theirs) or all(
        a.get("id") == b.get("id") for a, b in zip(ours, theirs, strict=True)
    ):
        return reply
    calls = [{**a, "id": b.get("id")} for a, b in zip(ours, theirs, strict=True)]
    return {**reply, "tool_calls": calls}


def build_prompt(renderer: Renderer, policy: Policy, tree: SessionTree, req: ChatRequest) -> Prompt:
    """The call's prompt IDs: the parent's recorded IDs plus only the new messages rendered
    (a delta the policy allows), or a full render as a new segment with the reason."""
    root = root_hash(req.tools, req.template_kwargs)
    match = tree.match(req.messages, root)
    parent = match.parent
    reason = detail = lineage = None
    if parent is not None:
        lineage = parent.id  # if it cannot extend it, it still rewrites its conversation
        new = match.new_messages
        kind = append_kind(new)
        # reasoning anywhere on the path, recorded or echoed (after a segment break the
        # recorded calls may not show it)
        think = parent.has_reasoning() or match.echoed_reasoning
        variant = "think" if think else "plain"
        if any(m.get("role") == "assistant" for m in new):
            reason = "unsampled_assistant_message"
            detail = "the new messages include an assistant turn the model did not sample"
        elif not policy.allows(kind, variant):
            reason, detail = "template_policy", policy.reason(kind, variant)
        else:
            try:
                first = req.messages[0]
                system = first if first.get("role") in ("system", "developer") else None
                reply = with_echoed_ids(parent.message or {}, req.messages[match.matched - 1])
                delta, seam = renderer.extension(
                    reply, new, req.tools, parent.stop_token_id, system, **req.template_kwargs
                )
            except NotPrefixPreserving as exc:
                reason, detail = "template_not_prefix_preserving", str(exc)
            except TemplateError as exc:
                # the stand-in conversation failed; the full render decides (400 if the
                # template refuses the real conversation too)
                reason = "template_not_prefix_preserving"
                detail = f"the delta could not be rendered: {exc}"[:300]
            else:
                ids = tree.context_ids(parent)
                d = array("i", delta)
                if not req.images and not parent.media:  # text: as it always was
                    ids.extend(d)
                    return Prompt(
                        ids, d, parent, match.hashes, seam=seam.kind, segment_detail=match.note
                    )
                dm = _expanded(renderer, req, new, d)
                head = (
                    MediaPrompt(ids, parent.media, parent.images, parent.media_placeholder)
                    if parent.media
                    else ids
                )
                whole = join(head, dm)
                return Prompt(
                    whole.ids if isinstance(whole, MediaPrompt) else whole,
                    dm.ids if isinstance(dm, MediaPrompt) else dm,
                    parent,
                    match.hashes,
                    seam=seam.kind,
                    segment_detail=match.note,
                    media=whole if isinstance(whole, MediaPrompt) else None,
                )
    elif match.stale is not None:
        reason, lineage = "template_changed", match.stale
        detail = (
            f"the messages continue {match.stale}, recorded under another template/"
            f"tokenizer fingerprint; this server renders with "
            f"{renderer.fingerprint}"
        )
    elif match.matched == len(req.messages) and tree.requests.get(match.hashes[-1]):
        # a new root: the same request as an earlier root (a retry), in that one's lineage
        lineage = tree.requests[match.hashes[-1]]
        retried_first = tree.first_request in (None, match.hashes[-1])
        reason = "first_call" if retried_first else "new_conversation"
        detail = f"a retry: the same messages as {lineage}"
    else:
        reason = root_reason(
            request_hash=match.hashes[-1],
            first_request=tree.first_request,
            recorded_calls=tree.n_calls,
            matched=match.matched,
            has_assistant=any(m.get("role") == "assistant" for m in req.messages),
        )
        if reason == "history_diverged":
            detail = describe_divergence(tree, req.messages, match.hashes, match.matched)
            lineage = tree.prefix_owner.get(match.hashes[match.matched])
        elif reason == "new_conversation":
            detail = (
                "a new lineage: its first message (under its tools) is that of no recorded "
                "conversation of this session (another system prompt, a side request, a "
                "sub-agent)"
            )
    try:
        ids = array("i", renderer.render_full(req.messages, req.tools, **req.template_kwargs))
    except TemplateError as exc:
        raise APIError(400, str(exc), "messages") from exc
    full = _expanded(renderer, req, req.messages, ids)
    if isinstance(full, MediaPrompt):
        return Prompt(
            full.ids, full.ids, None, match.hashes, reason, detail, lineage=lineage, media=full
        )
    return Prompt(ids, ids, None, match.hashes, reason, detail, lineage=lineage)
