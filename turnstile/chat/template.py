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

The compiled template's ``tojson`` filter (``json.dumps``, called for every tool and every
tool call's arguments on each render) is memoised: see :func:`memo_tojson`; and its sandbox
looks up ``message.role`` without raising an exception first: see :func:`dict_first_getattr`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import orjson
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
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
        return self.render_prepared(self.prepare(messages), tools, add_generation_prompt, **kwargs)

    def prepare(self, messages: list[dict]) -> list[dict]:
        """The messages as the template receives them (:meth:`messages`, then transformers'
        aliases of reasoning fields). Each message is prepared on its own, so a slice of the
        prepared list is the prepared slice: a delta's two renders share one preparation."""
        try:
            prepared = self.messages(messages)
            return _alias_reasoning_fields(prepared) if _PIECES else prepared
        except Exception as exc:  # as a render that refuses them
            raise TemplateError(f"chat template cannot render these messages: {exc}") from exc

    def render_prepared(
        self,
        prepared: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The template's text for messages from :meth:`prepare`."""
        variables = {**self.variables, **kwargs}
        try:
            if _PIECES:
                return self._render_plain(prepared, tools, add_generation_prompt, variables)
            # transformers annotates -> str; it returns (rendered, generation indices)
            rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
                conversations=[prepared],
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
        """``render_jinja_template`` for inputs that are plain JSON already (prepared)."""
        if self._compiled is None:
            self._compiled = _fast_overlay(_compile_jinja_template(self.source), self.source)
        return self._compiled.render(
            messages=messages,
            tools=tools or None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )


MEMO_SIZE = 4096  # tojson results kept per template (cleared when full)


def memo_tojson(tojson: Callable[..., str]) -> Callable[..., str]:
    """``tojson`` answering from a cache keyed by the value's orjson text and the arguments.

    The same tools and tool calls are written on every render of a rollout (a delta renders
    the stand-in twice), and ``json.dumps`` costs ~10 us each. Equal orjson text means an
    equal JSON value of the same types (``1``, ``1.0`` and ``true`` differ), so the first
    answer is the answer: except that orjson writes NaN and infinities as ``null``, so a value
    whose text holds ``null`` is never kept. Anything orjson cannot write (non-string keys,
    big integers, lone surrogates, other objects) goes to ``tojson`` uncached, and whatever
    ``tojson`` refuses it still refuses (nothing is kept from a call that raised)."""
    cache: dict[tuple, str] = {}

    def memo(x: Any, *args: Any, **kwargs: Any) -> str:
        try:
            key = (orjson.dumps(x), args, tuple(sorted(kwargs.items())))
            hit = cache.get(key)
        except (orjson.JSONEncodeError, TypeError):
            return tojson(x, *args, **kwargs)
        if hit is None:
            hit = tojson(x, *args, **kwargs)
            if b"null" not in key[0]:
                if len(cache) >= MEMO_SIZE:
                    cache.clear()
                cache[key] = hit
        return hit

    return memo


_DICT_NAMES = frozenset(dir(dict))  # what getattr() finds on a plain dict


def dict_first_getattr(env: SandboxedEnvironment) -> Callable[[Any, Any], Any]:
    """``env.getattr`` (what ``message.role`` compiles to) answering two common cases first,
    with what the sandbox itself would answer.

    - A plain dict and a name that is not one of dict's attributes: the sandbox tries
      ``getattr`` first, which raises AttributeError (~0.4 us, ~30 times per render of an
      agent's turn), then the item. Here the item is looked up directly; a missing key is the
      same undefined value.
    - A ``loop`` variable's attribute (``loop.first``): the sandbox's verdict on a name is
      kept per name. Its ``is_safe_attribute`` reads only the object's type and the name (not
      the value), so this holds for the two sandbox classes, and only for them.

    Everything else goes to the sandbox's own ``getattr``."""
    base = env.getattr
    undefined = env.undefined
    loop_safe: dict[str, bool] | None = (
        {} if type(env) in (SandboxedEnvironment, ImmutableSandboxedEnvironment) else None
    )

    def getattr_(obj: Any, attribute: Any) -> Any:
        cls = type(obj)
        if cls is dict and type(attribute) is str and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except KeyError:
                return undefined(obj=obj, name=attribute)
        if cls is LoopContext and loop_safe is not None and type(attribute) is str:
            safe = loop_safe.get(attribute)
            if safe is not False:
                try:
                    value = getattr(obj, attribute)
                except AttributeError:
                    return base(obj, attribute)
                if safe is None:
                    safe = loop_safe[attribute] = env.is_safe_attribute(obj, attribute, value)
                if safe:
                    return value
        return base(obj, attribute)

    return getattr_


def _fast_overlay(compiled: Any, source: str) -> Any:
    """The template compiled again in an overlay of its (shared, cached) environment whose
    ``tojson`` is memoised and whose ``getattr`` answers plain dicts first (filters are bound
    when a template is compiled; ``getattr`` is looked up on the environment at run time),
    with its globals flattened into a dict."""
    env = compiled.environment
    tojson = env.filters.get("tojson")
    if tojson is None or not isinstance(env, SandboxedEnvironment):  # pragma: no cover
        return compiled  # depends on the transformers version
    overlay = env.overlay()
    overlay.filters = {**env.filters, "tojson": memo_tojson(tojson)}
    overlay.getattr = dict_first_getattr(overlay)  # type: ignore[method-assign, assignment]
    template = overlay.from_string(source)
    # Its globals as one dict: Jinja keeps a ChainMap (the template's over the environment's)
    # and copies it into every render's context key by key, in Python (~6 us a render). The
    # environment's globals are set when transformers builds it and never change after.
    template.globals = dict(template.globals)
    return template
