"""Grammars that force a tool call in a family's own syntax (for ``tool_choice``).

``tool_choice: "required"`` or a named function is enforced by constrained decoding: the
engine may only sample text that the family's parser reads back as a call to one of the
offered tools, with arguments that follow the tool's JSON Schema. The grammar is GBNF, which
llama.cpp takes as ``grammar`` (and xgrammar-based backends, vLLM and SGLang, accept too).

Only the JSON Schema subset tools use in practice is translated (objects with properties,
strings, numbers, integers, booleans, null, enums, arrays); anything else becomes "any JSON
value". Optional properties are left out: what the grammar admits is always valid.
"""

from __future__ import annotations

import json
from typing import TypeGuard

from ..families.record import JsonGrammar, XmlGrammar
from .registry import family

_JSON_RULES = r"""
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( string ": " value ( ", " string ": " value )* )? "}"
array ::= "[" ( value ( ", " value )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex )
hex ::= [0-9a-fA-F]
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
integer ::= "-"? ( "0" | [1-9] [0-9]* )
"""


def shape(tool_format: str | None) -> JsonGrammar | XmlGrammar | None:
    """How the family writes a forced call (its record's ``grammar``), or None."""
    try:
        return family(tool_format).grammar if tool_format is not None else None
    except ValueError:  # not a declared family
        return None


def supports(tool_format: str | None) -> TypeGuard[str]:
    """Whether a call in ``tool_format`` can be forced (never for None)."""
    return shape(tool_format) is not None


def _literal(text: str) -> str:
    """A GBNF string literal for ``text``."""
    return json.dumps(text, ensure_ascii=False)


class _Builder:
    def __init__(self) -> None:
        self.rules: list[str] = []
        self._n = 0

    def rule(self, body: str) -> str:
        self._n += 1
        name = f"r{self._n}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def schema(self, s: object) -> str:
        """A rule (name or inline expression) for JSON text valid under schema ``s``."""
        if not isinstance(s, dict):
            return "value"
        # A keyword with a value JSON Schema does not allow ("enum": 5, "required": 5,
        # "properties": []) constrains nothing here, as in validators that ignore it.
        if isinstance(s.get("enum"), list) and s["enum"]:
            return (
                "( "
                + " | ".join(_literal(json.dumps(v, ensure_ascii=False)) for v in s["enum"])
                + " )"
            )
        if "const" in s:
            return _literal(json.dumps(s["const"], ensure_ascii=False))
        kind = s.get("type")
        if kind == "object":
            props = _properties(s)
            required = _required(s, props)
            if not props:
                return "object"
            parts = [
                f"{_literal(json.dumps(k, ensure_ascii=False) + ': ')} {self.schema(props[k])}"
                for k in required
            ]
            body = ' ", " '.join(parts)
            return self.rule(f'"{{" {body} "}}"' if parts else '"{}"')
        if kind == "array":
            item = self.schema(s.get("items"))
            return self.rule(f'"[" ( {item} ( ", " {item} )* )? "]"')
        return {
            "string": "string",
            "number": "number",
            "integer": "integer",
            "boolean": '( "true" | "false" )',
            "null": '"null"',
        }.get(str(kind), "value")


def _properties(s: dict) -> dict:
    props = s.get("properties")
    return props if isinstance(props, dict) else {}


def _required(s: dict, props: dict) -> list[str]:
    req = s.get("required")
    return [k for k in req if isinstance(k, str) and k in props] if isinstance(req, list) else []


def tool_call_grammar(
    tool_format: str,
    tools: list[dict],
    name: str | None = None,
    reasoning_close: str | None = None,
    parallel: bool = False,
) -> str:
    """GBNF for one call, in ``tool_format``'s syntax, to ``name`` or any tool; with
    ``parallel`` (``tool_choice: "required"`` with ``parallel_tool_calls``), one or more calls
    where the format allows several.

    ``reasoning_close``: the generation prompt left a reasoning block open (``<think>\\n``);
    the model may finish its reasoning (text, then this tag) before the call.
    """
    form = shape(tool_format)
    if form is None:
        raise ValueError(f"no grammar for tool format {tool_format!r}")
    b = _Builder()
    alternatives = []
    for t in tools:
        fn = t.get("function") or {}
        if name is not None and fn.get("name") != name:
            continue
        schema = fn.get("parameters") or {"type": "object"}
        if not isinstance(schema, dict):
            schema = {"type": "object"}
        fname = str(fn.get("name"))
        if isinstance(form, XmlGrammar):
            alternatives.append(_xml_call(b, form, fname, schema))
        else:
            head = _literal(
                '{"name": ' + json.dumps(fname, ensure_ascii=False) + f', "{form.args_key}": '
            )
            alternatives.append(f'{head} {b.schema(schema)} "}}"')
    if not alternatives:
        raise ValueError(f"no tool named {name!r}")
    before = _literal(form.before) if form.before else ""
    after = _literal(form.after) if form.after else ""
    think = ""
    if reasoning_close:
        # reasoning text may hold "<" but not a closing tag before the real close
        think = f'( [^<] | "<" [^/] )* {_literal(reasoning_close)} "\\n\\n" '
    call = f"call ::= {before} ( {' | '.join(alternatives)} ) {after}"
    more = ""
    if parallel and form.separator is not None:
        more = f" ( {_literal(form.separator)} call )*"
    root = f"root ::= {think}call{more}"
    return "\n".join([root, call, *b.rules]) + _JSON_RULES


def _xml_call(b: _Builder, form: XmlGrammar, name: str, schema: dict) -> str:
    """The call's open tag, then one parameter block per required parameter, values as the
    template writes them: strings raw, everything else as JSON."""
    props = _properties(schema)
    parts = [_literal(form.call_open.replace("{name}", name))]
    for key in _required(schema, props):
        spec = props[key]
        if isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
            value = (
                "( "
                + " | ".join(
                    _literal(v if isinstance(v, str) else json.dumps(v)) for v in spec["enum"]
                )
                + " )"
            )
        elif isinstance(spec, dict) and spec.get("type") == "string":
            value = "[^<]*"
        else:
            value = b.schema(spec)
        parts += [
            _literal(form.param_open.replace("{key}", key)),
            value,
            _literal(form.param_close),
        ]
    parts.append(_literal(form.call_close))
    return b.rule(" ".join(parts))
