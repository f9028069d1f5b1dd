"""Errors in OpenAI's shape, so harnesses surface them as they would OpenAI's own."""

from __future__ import annotations

import orjson
from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    502: "engine_error",
    503: "engine_unavailable",
}


class APIError(Exception):
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
        self.message = message
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
