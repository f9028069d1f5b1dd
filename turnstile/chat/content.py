"""Messages as the engine hands them to the chat template.

Harnesses send ``content`` as a string, ``null``, or a list of text parts. A template either
iterates the parts (``{% for part in message.content %}``) or prints ``content`` as a string;
given the wrong shape it renders the Python repr ``[{'type': 'text', ...}]`` into the prompt
or fails. vLLM (and SGLang, which follows it) decides per template from its Jinja syntax tree
and normalises every message before rendering:

- ``"string"`` templates get the text parts joined with ``"\\n"`` (``null`` → ``""``);
- ``"openai"`` templates get parts as a list of ``{"type": "text", "text": ...}``; a string
  stays a string and ``null`` becomes ``""`` (vLLM also wraps strings into one part, and
  templates that print ``content`` directly in some branch, such as moonshotai-Kimi-K2's tool
  results, then put the Python repr of a list into the prompt; every corpus template renders
  a string as its text);
- a message keeps only what the template may read: ``role``, ``content``, ``name``, an
  assistant's ``tool_calls`` (arguments as objects) and reasoning, a tool's ``tool_call_id``;
- for templates that accept only 9-character tool-call IDs (Mistral), a longer ID from another
  system keeps its last 9 characters, as vLLM's Mistral mode does.

Turnstile renders exactly the same messages, so its prompt is the one the engine would build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Literal

import jinja2
from jinja2 import nodes
from transformers.utils.chat_template_utils import _compile_jinja_template

ContentFormat = Literal["string", "openai"]


def detect_content_format(source: str) -> ContentFormat:
    """``"openai"`` when the template loops over a message's ``content``, else ``"string"``.

    Names bound to ``messages`` (directly, by ``set``, through filters or slices) are followed
    to the loops that iterate them; a loop over ``<message>.content`` in any of those means the
    template reads parts. A template that does not parse is treated as ``"string"``.
    """
    try:  # transformers' environment: its extensions (``{% generation %}``) must parse
        tree = _compile_jinja_template(source).environment.parse(source)
    except jinja2.TemplateError:
        return "string"
    lists = _aliases(tree, "messages")
    items = {
        name
        for loop in tree.find_all(nodes.For)
        if _refers_to(loop.iter, lists)
        for name in _targets(loop.target)
    }
    for loop in tree.find_all(nodes.For):
        if _refers_to(loop.iter, items, key="content"):
            return "openai"
    return "string"


def _targets(target: nodes.Node) -> Iterator[str]:
    if isinstance(target, nodes.Name):
        yield target.name
    elif isinstance(target, nodes.Tuple):
        for item in target.items:
            yield from _targets(item)


def _refers_to(node: nodes.Node, names: set[str], key: str | None = None) -> bool:
    """Whether ``node`` is one of ``names`` (or its ``key`` attribute), seen through filters,
    tests and slices."""
    while True:
        if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        else:
            break
    if key is not None:
        if isinstance(node, nodes.Getattr) and node.attr == key:
            node = node.node
        elif (
            isinstance(node, nodes.Getitem)
            and isinstance(node.arg, nodes.Const)
            and node.arg.value == key
        ):
            node = node.node
        else:
            return False
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in names


def _aliases(tree: nodes.Template, name: str) -> set[str]:
    """``name`` and every variable assigned from it (or from one of those), transitively."""
    found = {name}
    changed = True
    while changed:
        changed = False
        for assign in tree.find_all(nodes.Assign):
            if _refers_to(assign.node, found):
                for target in _targets(assign.target):
                    if target not in found:
                        found.add(target)
                        changed = True
    return found


_ID_LENGTH = re.compile(r"id\s*\|\s*length\s*!=\s*(\d+)")


def required_id_length(source: str) -> int | None:
    """The tool-call ID length a template insists on (``tool_call.id|length != 9``), if any."""
    m = _ID_LENGTH.search(source)
    return int(m.group(1)) if m else None


def text_parts(content: str | list | None) -> list[str]:
    """The texts of ``content`` (validated at the door: a string, ``None`` or text parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content if isinstance(p, dict) and p.get("text") is not None]


def normalise(
    messages: list[dict], content_format: ContentFormat, id_length: int | None = None
) -> list[dict]:
    """The messages the template sees, as vLLM builds them (see the module docstring)."""

    def cut(i: object) -> object:
        return i[-id_length:] if id_length and isinstance(i, str) and len(i) > id_length else i

    out = []
    for m in messages:
        raw = m.get("content")
        content: str | list[dict]
        if raw is None or isinstance(raw, str):
            content = raw or ""
        elif content_format == "string":
            content = "\n".join(text_parts(raw))
        else:
            content = [_part(p) for p in raw if _kept(p)]
        msg: dict = {"role": m.get("role"), "content": content}
        role = m.get("role")
        if role == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = [_call(c) for c in m["tool_calls"]]
                if id_length:
                    msg["tool_calls"] = [{**c, "id": cut(c.get("id"))} for c in msg["tool_calls"]]
            reasoning = m.get("reasoning") or m.get("reasoning_content")
            if reasoning is not None:
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = cut(m["tool_call_id"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _kept(p: object) -> bool:
    return isinstance(p, dict) and (p.get("text") is not None or p.get("type") == "image")


def _part(p: dict) -> dict:
    """A text part, or an image as templates take it (``{"type": "image"}``: the template
    prints the family's placeholder; dialects/images.py made the part)."""
    return {"type": "image"} if p.get("type") == "image" else {"type": "text", "text": p["text"]}


def _call(call: dict) -> dict:
    """A tool call with its arguments as an object (templates ``tojson`` or iterate them);
    empty arguments become ``{}``, text that is not JSON is left as it is."""
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if not args:
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            pass
    return {**call, "function": fn}
