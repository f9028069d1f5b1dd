"""Render chat templates exactly as ``transformers.apply_chat_template`` does.

vLLM and SGLang render with transformers, so we render with transformers' own compiled
template, Jinja environment and message preparation, with the same variables (the tokenizer's
special tokens, ``tools``, ``add_generation_prompt``, extra kwargs): a template renders here byte
for byte as it would in those engines.

One step of ``render_jinja_template`` is skipped: it rebuilds every message, tool and kwarg out
of plain JSON types on each call (to strip rich objects such as images), which costs more than
the Jinja render itself on an agent's history. Our inputs are parsed JSON already, so that copy
is the identity; ``tests/test_template_fast_path.py`` renders every template in the corpus both
ways and requires identical text. If the pinned transformers ever lacks the pieces, the public
function is used.
"""

from __future__ import annotations

import hashlib
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

try:  # the pieces of render_jinja_template, see the module docstring
    from transformers.utils.chat_template_utils import (
        _alias_reasoning_fields,
        _compile_jinja_template,
    )

    _PIECES = True
except ImportError:  # pragma: no cover - depends on the transformers version
    _PIECES = False  # render_jinja_template whole (the names above are then never used)

from .content import ContentFormat, detect_content_format, normalise, required_id_length
from .tokenizer import LoadedTokenizer


class TemplateError(ValueError):
    """The template refused the conversation (``raise_exception`` or a Jinja error)."""


class ChatTemplate:
    def __init__(
        self,
        source: str,
        special_tokens: dict[str, str] | None = None,
        extra_kwargs: dict[str, Any] | None = None,
        content_format: ContentFormat | None = None,
    ):
        self.source = source
        # whether the template reads content as a string or as parts (see chat.content)
        self.content_format = content_format or detect_content_format(source)
        self.id_length = required_id_length(source)  # Mistral: 9-character tool-call IDs
        self.variables = {**(special_tokens or {}), **(extra_kwargs or {})}
        self.fingerprint = hashlib.sha256(source.encode()).hexdigest()[:16]
        self._compiled: Any = None  # compiled on first use (a bad template fails per call)

    @classmethod
    def for_tokenizer(
        cls, tok: LoadedTokenizer, extra_kwargs: dict[str, Any] | None = None
    ) -> ChatTemplate:
        if not tok.chat_template:
            raise ValueError(f"{tok.source} has no chat template; pass --chat-template FILE")
        return cls(tok.chat_template, tok.special_tokens, extra_kwargs)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        variables = {**self.variables, **kwargs}
        try:
            if _PIECES:
                return self._render_plain(messages, tools, add_generation_prompt, variables)
            # transformers annotates -> str; it returns (rendered, generation indices)
            rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
                conversations=[self.messages(messages)],
                tools=list(tools) if tools else None,
                chat_template=self.source,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
            return rendered[0]
        except Exception as exc:  # jinja2 raises many types; all mean "cannot render this"
            raise TemplateError(f"chat template cannot render these messages: {exc}") from exc

    def messages(self, messages: list[dict]) -> list[dict]:
        """The messages as this template receives them in vLLM (``chat.content``)."""
        return normalise(messages, self.content_format, self.id_length)

    def _render_plain(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        add_generation_prompt: bool,
        variables: dict[str, Any],
    ) -> str:
        """``render_jinja_template`` for inputs that are plain JSON already."""
        if self._compiled is None:
            self._compiled = _compile_jinja_template(self.source)
        return self._compiled.render(
            messages=_alias_reasoning_fields(self.messages(messages)),
            tools=tools or None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
