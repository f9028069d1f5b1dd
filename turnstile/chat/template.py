"""Render chat templates exactly as ``transformers.apply_chat_template`` does.

vLLM and SGLang render with transformers, so we call the same function with the same
variables (the tokenizer's special tokens, ``tools``, ``add_generation_prompt``, extra kwargs):
a template renders here byte for byte as it would in those engines.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from .tokenizer import LoadedTokenizer


class TemplateError(ValueError):
    """The template refused the conversation (``raise_exception`` or a Jinja error)."""


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str] | None = None,
                 extra_kwargs: dict[str, Any] | None = None):
        self.source = source
        self.variables = {**(special_tokens or {}), **(extra_kwargs or {})}
        self.fingerprint = hashlib.sha256(source.encode()).hexdigest()[:16]

    @classmethod
    def for_tokenizer(cls, tok: LoadedTokenizer, extra_kwargs: dict[str, Any] | None = None
                      ) -> ChatTemplate:
        if not tok.chat_template:
            raise ValueError(f"{tok.source} has no chat template; pass --chat-template FILE")
        return cls(tok.chat_template, tok.special_tokens, extra_kwargs)

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        variables = {**self.variables, **kwargs}
        try:
            rendered, _ = render_jinja_template(
                conversations=[template_messages(messages)],
                tools=tools or None,
                chat_template=self.source,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
            return rendered[0]
        except Exception as exc:  # jinja2 raises many types; all mean "cannot render this"
            raise TemplateError(f"chat template cannot render these messages: {exc}") from exc


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as vLLM hands them to templates: ``content`` ``null`` as ``""`` and tool-call
    ``arguments`` as objects, not JSON text (templates ``tojson`` or iterate them, and many
    test ``'x' in content``, which fails on ``None``).
    """
    out = []
    for m in messages:
        if m.get("content", "") is None:
            m = {**m, "content": ""}
        calls = m.get("tool_calls")
        if calls:
            m = dict(m)
            fixed = []
            for c in calls:
                fn = dict(c.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args)
                    except ValueError:
                        pass
                fixed.append({**c, "function": fn})
            m["tool_calls"] = fixed
        out.append(m)
    return out
