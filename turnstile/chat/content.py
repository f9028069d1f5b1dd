"""Messages as the engine hands them to the chat template.

Harnesses send ``content`` as a string, ``null``, or a list of text parts. A template either
iterates the parts (``{% for part in message.content %}``) or prints ``content`` as a string;
given the wrong shape it renders the Python repr ``[{'type': 'text', ...}]`` into the prompt
or fails. vLLM (and SGLang, which follows it) decides per template from its Jinja syntax tree
and normalises every message before rendering:

- ``"string"`` templates get the text parts joined with ``"\\n"`` (``null`` → ``""``);
- ``"openai"`` templates get a list of ``{"type": "text", "text": ...}`` parts, a string
  becoming one part (``null`` → ``[]``);
- a message keeps only what the template may read: ``role``, ``content``, ``name``, an
  assistant's ``tool_calls`` (arguments as objects) and reasoning, a tool's ``tool_call_id``.

Turnstile renders exactly the same messages, so its prompt is the one the engine would build.
"""

from __future__ import annotations

import json
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
    items = {name for loop in tree.find_all(nodes.For) if _refers_to(loop.iter, lists)
             for name in _targets(loop.target)}
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
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) \
                and node.arg.value == key:
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


def text_parts(content: object) -> list[str]:
    """The texts of ``content`` (validated at the door: a string, ``None`` or text parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content if isinstance(p, dict) and p.get("text") is not None]


def normalise(messages: list[dict], content_format: ContentFormat) -> list[dict]:
    """The messages the template sees, as vLLM builds them (see the module docstring)."""
    out = []
    for m in messages:
        texts = text_parts(m.get("content"))
        content: str | list[dict] = (
            "\n".join(texts) if content_format == "string"
            else [{"type": "text", "text": t} for t in texts])
        msg: dict = {"role": m.get("role"), "content": content}
        role = m.get("role")
        if role == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = [_call(c) for c in m["tool_calls"]]
            reasoning = m.get("reasoning") or m.get("reasoning_content")
            if reasoning is not None:
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


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
