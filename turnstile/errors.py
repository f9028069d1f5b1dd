"""Errors in OpenAI's shape, so harnesses surface them as they would OpenAI's own."""

from __future__ import annotations

import re

import orjson
from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    502: "engine_error",
    503: "engine_unavailable",
}


# Network addresses in a server-side failure's text: URLs, Python's (host, port) tuples,
# [IPv6]:port, IPv4[:port], IPv6, host:port, and a quoted host a database client names.
_ADDRESSES = re.compile(
    r"""\b[A-Za-z][A-Za-z0-9+.-]*://(?:\[[^\]\s]*\]|[^\s'"<>()\[\]])+"""
    r"""|\(\s*'[^']*'\s*(?:,\s*\d+\s*)+\)"""
    r"""|\[[0-9A-Fa-f:.%]+\](?::\d+)?"""
    r"""|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"""
    r"""|(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])"""
    r"""|\b[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*:\d{2,5}\b"""
    r'|(?<=server at )"[^"]*"'
)


def without_addresses(text: str) -> str:
    """``text`` without the network addresses in it (an engine's URL, a host:port, an IP)."""
    return _ADDRESSES.sub("[address]", text)


class APIError(Exception):
    """An error answer. ``message`` is what the client reads; a server-side failure's (5xx)
    says no network address (the policy under training must not learn the fleet's engine or
    database addresses). ``detail`` keeps the whole text, for the log line and the record."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.detail = message
        self.message = without_addresses(message) if status >= 500 else message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "api_error")

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        return Response(orjson.dumps(self.body()), self.status, media_type="application/json")


class ContextOverflow(APIError):
    """The prompt does not fit the model's context. Harnesses key their recovery (compacting
    the history) on their provider's words and codes, so each dialect words this as its
    provider does (``Dialect.error``); the default is OpenAI Chat Completions'."""

    def __init__(self, prompt_tokens: int, context_length: int, param: str = "messages"):
        super().__init__(
            400,
            f"This model's maximum context length is {context_length} tokens. However, your "
            f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the "
            "messages.",
            param,
            code="context_length_exceeded",
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
