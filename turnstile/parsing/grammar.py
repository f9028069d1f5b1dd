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

# How each family writes one call: text before the JSON object, and after it.
CALL_SYNTAX = {
    "hermes": ('"<tool_call>\\n"', '"\\n</tool_call>"'),
}

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


def supports(tool_format: str | None) -> bool:
    return tool_format in CALL_SYNTAX


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
        if "enum" in s:
            return "( " + " | ".join(_literal(json.dumps(v, ensure_ascii=False))
                                     for v in s["enum"]) + " )"
        if "const" in s:
            return _literal(json.dumps(s["const"], ensure_ascii=False))
        kind = s.get("type")
        if kind == "object":
            props = s.get("properties") or {}
            required = [k for k in (s.get("required") or []) if k in props]
            if not props:
                return "object"
            parts = [f'{_literal(json.dumps(k, ensure_ascii=False) + ": ")} {self.schema(props[k])}'
                     for k in required]
            body = ' ", " '.join(parts)
            return self.rule(f'"{{" {body} "}}"' if parts else '"{}"')
        if kind == "array":
            item = self.schema(s.get("items"))
            return self.rule(f'"[" ( {item} ( ", " {item} )* )? "]"')
        return {"string": "string", "number": "number", "integer": "integer",
                "boolean": '( "true" | "false" )', "null": '"null"'}.get(str(kind), "value")


def tool_call_grammar(tool_format: str, tools: list[dict], name: str | None = None) -> str:
    """GBNF for exactly one call, in ``tool_format``'s syntax, to ``name`` or any tool."""
    before, after = CALL_SYNTAX[tool_format]
    b = _Builder()
    alternatives = []
    for t in tools:
        fn = t.get("function") or {}
        if name is not None and fn.get("name") != name:
            continue
        args = b.schema(fn.get("parameters") or {"type": "object"})
        head = _literal('{"name": ' + json.dumps(fn.get("name"), ensure_ascii=False)
                        + ', "arguments": ')
        alternatives.append(f'{head} {args} "}}"')
    if not alternatives:
        raise ValueError(f"no tool named {name!r}")
    root = f"root ::= {before} ( {' | '.join(alternatives)} ) {after}"
    return "\n".join([root, *b.rules]) + _JSON_RULES
