"""Checks of trainer-supplied values (session fields, rewards, weight versions, query ints).

Each failure is a 400 that names the offending field, so a trainer sees what to fix.
"""

from __future__ import annotations

import math
import re

from ..errors import APIError
from ..store.records import INT32_MAX

MAX_ID_LEN = 256
WEIGHT_VERSION = re.compile(r"[A-Za-z0-9._:+/@-]{1,128}")


def session_fields(body: dict) -> dict:
    """First-class session fields from a create body, validated (400 names the field)."""
    out: dict = {}
    for name in ("group_id", "task_id"):
        v = body.get(name)
        if v is not None and not (isinstance(v, str) and 0 < len(v) <= MAX_ID_LEN):
            raise APIError(
                400,
                f"Invalid {name!r}: expected a non-empty string of at most "
                f"{MAX_ID_LEN} characters.",
                name,
            )
        if name in body:
            out[name] = v
    if "sample_index" in body:
        v = body["sample_index"]
        if v is not None and (
            not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= INT32_MAX
        ):
            raise APIError(
                400,
                f"Invalid 'sample_index': expected an integer in [0, {INT32_MAX}].",
                "sample_index",
            )
        out["sample_index"] = v
    return out


def weight_version(v: object) -> None:
    """A weight version is a label (``step-12``, a hash) or an integer; an integer, or a
    string of digits and dashes, must be a plain int64 (it becomes the per-token
    ``versions`` value)."""
    if isinstance(v, int) and not isinstance(v, bool):
        if -(2**63) <= v < 2**63:
            return
    elif isinstance(v, str) and WEIGHT_VERSION.fullmatch(v):
        if not set(v) <= set("0123456789-"):
            return
        if re.fullmatch(r"-?[0-9]+", v) and -(2**63) <= int(v) < 2**63:
            return
    raise APIError(
        400,
        "Invalid 'weight_version': expected an integer in int64 range or a "
        "label of 1-128 letters, digits and ._:+/@- (not a malformed number).",
        "weight_version",
    )


def number(v: object, param: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise APIError(400, f"Invalid {param!r}: expected a finite number, got {v!r}.", param)
    return float(v)


def int_param(raw: str | None, name: str, default: int, lo: int, hi: int) -> int:
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = lo - 1
    if not lo <= v <= hi:
        raise APIError(400, f"Invalid {name!r} {raw!r}: expected an integer in [{lo}, {hi}].", name)
    return v
