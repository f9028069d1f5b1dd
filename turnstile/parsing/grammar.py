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

# How each family writes one call, as (before, the call given its name and an arguments rule
# builder, after). JSON families wrap a JSON object; Qwen3-Coder/Qwen3.5 write XML parameters.
JSON_CALL = {
    "hermes": ('"<tool_call>\\n"', "arguments", '"\\n</tool_call>"'),
    "llama3_json": ("", "parameters", ""),
}
XML_CALL = {"qwen3_coder"}

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
    return tool_format in JSON_CALL or tool_format in XML_CALL


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
            return "( " + " | ".join(_literal(json.dumps(v, ensure_ascii=False))
                                     for v in s["enum"]) + " )"
        if "const" in s:
            return _literal(json.dumps(s["const"], ensure_ascii=False))
        kind = s.get("type")
        if kind == "object":
            props = _properties(s)
            required = _required(s, props)
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


# Formats whose templates render several calls in one assistant turn, and what they put between
# two calls (Qwen2.5/Hermes and Qwen3-Coder: "\n" before each "<tool_call>"). Llama 3's JSON
# calls are one per turn (its templates refuse more).
PARALLEL_SEPARATOR = {"hermes": '"\\n"', "qwen3_coder": '"\\n"'}


def _properties(s: dict) -> dict:
    props = s.get("properties")
    return props if isinstance(props, dict) else {}


def _required(s: dict, props: dict) -> list[str]:
    req = s.get("required")
    return [k for k in req if isinstance(k, str) and k in props] if isinstance(req, list) else []


def tool_call_grammar(tool_format: str, tools: list[dict], name: str | None = None,
                      reasoning_close: str | None = None, parallel: bool = False) -> str:
    """GBNF for one call, in ``tool_format``'s syntax, to ``name`` or any tool; with
    ``parallel`` (``tool_choice: "required"`` with ``parallel_tool_calls``), one or more calls
    where the format allows several.

    ``reasoning_close``: the generation prompt left a reasoning block open (``<think>\\n``);
    the model may finish its reasoning (text, then this tag) before the call.
    """
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
        if tool_format in XML_CALL:
            alternatives.append(_xml_call(b, fname, schema))
        else:
            _, key, _ = JSON_CALL[tool_format]
            head = _literal('{"name": ' + json.dumps(fname, ensure_ascii=False)
                            + f', "{key}": ')
            alternatives.append(f'{head} {b.schema(schema)} "}}"')
    if not alternatives:
        raise ValueError(f"no tool named {name!r}")
    if tool_format in XML_CALL:
        before, after = '"<tool_call>\\n"', '"</tool_call>"'
    else:
        before, after = JSON_CALL[tool_format][0], JSON_CALL[tool_format][2]
    think = ""
    if reasoning_close:
        # reasoning text may hold "<" but not a closing tag before the real close
        think = f'( [^<] | "<" [^/] )* {_literal(reasoning_close)} "\\n\\n" '
    call = f"call ::= {before} ( {' | '.join(alternatives)} ) {after}"
    more = ""
    if parallel and tool_format in PARALLEL_SEPARATOR:
        more = f" ( {PARALLEL_SEPARATOR[tool_format]} call )*"
    root = f"root ::= {think}call{more}"
    return "\n".join([root, call, *b.rules]) + _JSON_RULES


def _xml_call(b: _Builder, name: str, schema: dict) -> str:
    """``<function=name>`` then one ``<parameter=key>`` block per required parameter, values
    as the template writes them: strings raw, everything else as JSON."""
    props = _properties(schema)
    parts = [_literal(f"<function={name}>\n")]
    for key in _required(schema, props):
        spec = props[key]
        if isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
            value = "( " + " | ".join(
                _literal(v if isinstance(v, str) else json.dumps(v)) for v in spec["enum"]) + " )"
        elif isinstance(spec, dict) and spec.get("type") == "string":
            value = "[^<]*"
        else:
            value = b.schema(spec)
        parts += [_literal(f"<parameter={key}>\n"), value, _literal("\n</parameter>\n")]
    parts.append(_literal("</function>\n"))
    return b.rule(" ".join(parts))
