"""A conversation as a chain of hashes: tools and template variables first, then one message at
a time, each normalised the way harnesses echo it (``content`` null vs "", arguments
re-serialised), so a request and the recorded call it continues share a prefix hash."""

from __future__ import annotations

import hashlib

import orjson

from .content import text_parts


def content_key(content: object, content_format: str) -> object:
    """Content as the template will see it (``chat.content``): text parts joined with
    ``"\n"`` for a string template, the list of texts for one that reads parts. Two messages
    with the same key render the same."""
    if isinstance(content, list) and not all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()
    if content is not None and not isinstance(content, (str, list)):
        return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()
    if content is None or isinstance(content, str):
        return content or ""
    texts = text_parts(content)
    return "\n".join(texts) if content_format == "string" else texts


def arguments_key(args: object) -> object:
    if isinstance(args, str):
        try:
            return orjson.loads(args)
        except orjson.JSONDecodeError:
            return args
    return args


def message_key(m: dict, content_format: str = "string") -> bytes:
    """The parts of a message that must match for it to be 'the same message'."""
    role = m.get("role")
    key: list = [role, content_key(m.get("content"), content_format), m.get("name")]
    if role == "assistant":
        key.append(
            [
                [
                    (c.get("function") or {}).get("name"),
                    arguments_key((c.get("function") or {}).get("arguments")),
                ]
                for c in m.get("tool_calls") or ()
            ]
        )
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)


def chain(prev: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(prev + data, digest_size=8).digest()


def root_hash(tools: list[dict] | None, template_kwargs: dict | None) -> bytes:
    seed = orjson.dumps([tools or [], template_kwargs or {}], option=orjson.OPT_SORT_KEYS)
    return chain(b"", seed)


def prefix_hashes(root: bytes, messages: list[dict], content_format: str = "string") -> list[bytes]:
    """``out[k]`` identifies ``messages[:k]`` (``out[0]`` is the root)."""
    out = [root]
    for m in messages:
        out.append(chain(out[-1], message_key(m, content_format)))
    return out
