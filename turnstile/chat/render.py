"""Prompt token IDs from messages: a full render, or a *delta* that extends recorded tokens.

The delta for new messages (tool results, a user turn) is cut from the model's own template:
render a short stand-in conversation that ends with the assistant message we returned, render
it again with the new messages and the generation prompt, and keep what the second render
adds. Where the recorded tokens end (the *seam*) is also read from the template, not
hard-coded per family:

- the assistant turn's close is the last end-of-generation marker (``<|im_end|>``,
  ``<|eot_id|>``, ...) in the stand-in render of that turn;
- if the model sampled that marker as its stop token, the delta starts right after it
  (ChatML's ``\\n`` then lands in the delta); a stop token that *opens* the next part of the
  render (GLM's ``<|observation|>``) is not repeated;
- if the completion had no stop token (``length``, a stop string), the template's close is
  appended as unsampled prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .encoding import PromptEncoder
from .template import ChatTemplate, TemplateError
from .tokenizer import LoadedTokenizer
from .vision import ImageExpander

STAND_IN_USER = {"role": "user", "content": "dummy"}
HEADS_KEPT = 16  # distinct stand-in heads kept (system prompt x tools x kwargs)


class NotPrefixPreserving(ValueError):
    """Appending these messages re-renders earlier turns, so no exact delta exists."""


@dataclass(frozen=True)
class Seam:
    kind: str  # "stop": after the sampled stop token; "synthesized_close"; "substituted_close"
    text: str  # the text whose tokens form the delta


class Renderer:
    def __init__(self, tokenizer: LoadedTokenizer, template: ChatTemplate):
        self.tok = tokenizer
        self.template = template
        # the model's image processor (chat/vision.py) where the model takes images
        self.images: ImageExpander | None = None
        self.eog_text = {
            i: t for i in tokenizer.eog_token_ids if (t := tokenizer.token_text(i)) is not None
        }
        # Encoding a fragment after a special token reproduces how the full render tokenizes
        # text that follows a special token (no sentencepiece prefix space, no merge).
        anchor = tokenizer.eos_token or next(iter(self.eog_text.values()), None)
        self._anchor = anchor if anchor and len(tokenizer.encode(anchor)) == 1 else None
        self.encoder = PromptEncoder(tokenizer, self._anchor)  # whole prompts, pieces kept
        self.fingerprint = f"{tokenizer.fingerprint}:{template.fingerprint}"
        # stand-in head renders (system, tools, kwargs, text), most recent first: see _head
        self._heads: list[tuple[dict | None, list[dict] | None, dict, str]] = []
        self._ignores_tools: bool | None = None
        self._drops_developer: bool | None = None

    @property
    def drops_developer(self) -> bool:
        """True when the template renders a developer message as nothing (Qwen2.5's, silently)
        or refuses it. A Responses harness sends its whole instructions as one (Codex), so
        such a template is given them as the system message they stand for."""
        if self._drops_developer is None:
            probe = [{"role": "developer", "content": "turnstile-probe"}, STAND_IN_USER]
            try:
                text = self.template.render(probe, None, add_generation_prompt=True)
                self._drops_developer = "turnstile-probe" not in text
            except TemplateError:
                self._drops_developer = True
        return self._drops_developer

    def as_rendered(self, messages: list[dict]) -> list[dict]:
        """``messages`` as the template is given them: developer messages as system ones where
        the template would drop them (:attr:`drops_developer`), otherwise as they are."""
        if not any(m.get("role") == "developer" for m in messages) or not self.drops_developer:
            return messages
        return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]

    def render(self, messages: list[dict], tools: list[dict] | None, **kwargs: Any) -> str:
        """The template's text for :meth:`as_rendered` ``messages``."""
        return self.template.render(self.as_rendered(messages), tools, **kwargs)

    def prepare(self, messages: list[dict]) -> list[dict]:
        """:meth:`as_rendered` ``messages`` as the template receives them, for
        :meth:`ChatTemplate.render_prepared` (message by message: a slice stays prepared)."""
        return self.template.prepare(self.as_rendered(messages))

    @property
    def ignores_tools(self) -> bool:
        """True when the template renders the same prompt with and without ``tools``
        (SmolLM2's, for one): a request's tools then never reach the model."""
        if self._ignores_tools is None:
            msgs = [{"role": "user", "content": "hi"}]
            probe = [
                {
                    "type": "function",
                    "function": {
                        "name": "turnstile_probe",
                        "description": "probe",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ]
            try:
                self._ignores_tools = self.render_full(msgs, probe) == self.render_full(msgs, None)
            except TemplateError:
                self._ignores_tools = False  # it reads tools (and refuses this probe)
        return self._ignores_tools

    def render_full(
        self, messages: list[dict], tools: list[dict] | None, **kwargs: object
    ) -> list[int]:
        text = self.render(messages, tools, add_generation_prompt=True, **kwargs)
        return self.encoder.encode(text)

    def encode_fragment(self, text: str) -> list[int]:
        if self._anchor is None:
            return self.tok.encode(text)
        return self.tok.encode(self._anchor + text)[1:]

    def extension(
        self,
        assistant: dict,
        new_messages: list[dict],
        tools: list[dict] | None,
        stop_token_id: int | None,
        system: dict | None = None,
        **kwargs: object,
    ) -> tuple[list[int], Seam]:
        """Token IDs that follow the recorded completion of ``assistant`` when ``new_messages``
        are appended, ending with the generation prompt.

        ``system`` is the conversation's leading system message, if any: templates index
        messages by position and branch on it (Bielik), so the stand-in keeps it.
        """
        head = [system, STAND_IN_USER] if system else [STAND_IN_USER]
        render = self.template.render_prepared
        # The close is searched in a copy of the reply without end-of-turn marker text in it
        # (a coding agent may write "<|endoftext|>" into a file): the search must not land
        # inside the content.
        probe = _without(assistant, list(self.eog_text.values()))
        prepared = self.prepare([*head, probe, *new_messages])  # once for both renders
        before = render(prepared[: len(head) + 1], tools, add_generation_prompt=False, **kwargs)
        before_turn = self._head(head, tools, kwargs, before)
        after = render(prepared, tools, add_generation_prompt=True, **kwargs)
        if not after.startswith(before):
            at = _first_difference(before, after)
            raise NotPrefixPreserving(
                f"appending {_roles(new_messages)} changes the rendered history at character "
                f"{at}: {before[at : at + 40]!r} became {after[at : at + 40]!r}"
            )
        turn_start = len(before_turn) if before.startswith(before_turn) else None
        close_at, close_text = self._turn_close(before, turn_start)
        tail = after[close_at:]
        if probe is not assistant:
            real = self.render(
                [*head, assistant, *new_messages], tools, add_generation_prompt=True, **kwargs
            )
            if not real.endswith(tail):
                raise NotPrefixPreserving(
                    "the reply contains end-of-turn marker text and the template renders the "
                    "appended messages differently because of it"
                )
        sampled = self.eog_text.get(stop_token_id) if stop_token_id is not None else None
        if sampled is None:
            seam = Seam("synthesized_close", tail)
        elif tail.startswith(sampled):
            seam = Seam("stop", tail[len(sampled) :])
        else:
            # The model ended with a different end marker than the template writes; its token
            # stands in for the template's close.
            seam = Seam("substituted_close", tail[len(close_text) :])
        return self.encode_fragment(seam.text), seam

    def _head(self, head: list[dict], tools: list[dict] | None, kwargs: dict, before: str) -> str:
        """The stand-in head rendered alone. It is the same for every call of a rollout batch
        (same system message, tools, kwargs), so it is kept, found by ``==`` (in C: a coding
        agent's system prompt and tools are ~150 KB, serialising them as a key cost more than
        the comparison); a kept render that no longer prefixes ``before`` (a template that
        writes today's date, or values ``==`` but not alike, ``1`` and ``1.0``) is rendered
        again."""
        system = head[0] if len(head) > 1 else None
        heads = self._heads
        for i, (s, t, k, text) in enumerate(heads):
            if s == system and t == tools and k == kwargs:
                if before.startswith(text):
                    if i:
                        heads.insert(0, heads.pop(i))
                    return text
                del heads[i]
                break
        text = self.render(head, tools, add_generation_prompt=False, **kwargs)
        heads.insert(0, (system, tools, dict(kwargs), text))
        del heads[HEADS_KEPT:]
        return text

    def _turn_close(self, rendered: str, start: int | None) -> tuple[int, str]:
        """Position and text of the assistant turn's close: the first end-of-generation marker
        after the turn begins (the engine stops at the first one the model samples; Apriel
        writes ``<|end|>\n</s>`` and the model stops at ``<|end|>``), or the end of the
        render when the template closes turns without one. When the turn's start is unknown
        (the head renders differently before a reply), the last marker."""
        best, text = len(rendered), ""
        for marker in self.eog_text.values():
            at = rendered.find(marker, start) if start is not None else rendered.rfind(marker)
            if at == -1:
                continue
            if text == "" or (at < best if start is not None else at > best):
                best, text = at, marker
        return best, text


def _without(message: dict, markers: list[str]) -> dict:
    """``message`` with every marker text in its strings replaced (the same object when none
    occurs, which is the common case)."""

    def clean(value: object) -> object:
        if isinstance(value, str):
            out = value
            for mk in markers:
                if mk in out:
                    out = out.replace(mk, "\u2063")
            return out
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    cleaned = clean(message)
    return message if cleaned == message else cleaned  # type: ignore[return-value]


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _roles(messages: list[dict]) -> str:
    return "+".join(str(m.get("role")) for m in messages)
