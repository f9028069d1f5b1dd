"""vLLM's wire, as the fake writes it: the two JSON encoders vLLM's answers come out of, and
its error bodies (modelled on ``serve/exception_handling`` and ``SamplingParams._verify_args``)."""

from __future__ import annotations

import json

import orjson


def dumps_python(obj: object) -> bytes:
    """Starlette ``JSONResponse.render``."""
    return json.dumps(
        obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


def dumps_pydantic(obj: object) -> bytes:
    """``model_dump_json``: compact; floats as pydantic-core (= orjson) writes them."""
    return orjson.dumps(obj)


def error(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class Invalid(Exception):
    def __init__(self, body: dict, status: int = 400):
        super().__init__(body["error"]["message"] if "error" in body else str(body))
        self.body, self.status = body, status


def validation(loc: str, msg: str, err_type: str, input_repr: str, ctx: str) -> Invalid:
    """``validation_exception_handler``: ``"N validation error:\\n  {...}"``, 400."""
    text = (
        f"1 validation error:\n  {{'type': '{err_type}', 'loc': '{loc}', 'msg': '{msg}', "
        f"'input': '{input_repr}', 'ctx': {ctx}}}"
    )
    param = loc
    return Invalid(error(text, "Bad Request", 400, param))


def sampling_error(
    message: str, parameter: str | None, sp: dict, value: object = None, v: tuple = (0, 33)
) -> Invalid:
    if v >= (0, 32):  # as a real 0.32 answers (tests/fakes/golden)
        text = f"{message} (parameter={parameter}, value={value})"
        return Invalid(error(text, "BadRequestError", 400, parameter))
    text = (
        f"1 validation error:\n  {{'type': 'value_error', 'loc': 'body.sampling_params', "
        f"'msg': 'Value error, {message}', 'input': '<dict of {len(sp)} items>', "
        f"'ctx': {{'error': VLLMValidationError('{message}')}}}}"
    )
    return Invalid(error(text, "Bad Request", 400, parameter or "body.sampling_params"))
