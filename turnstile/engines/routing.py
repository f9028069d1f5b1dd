"""Routed experts (MoE router replay) as vLLM and SGLang return them, read into per-token rows.

Both engines give, once a request has finished, the experts their router picked for every token
they forwarded from a requested start: positions ``[start, prompt + completion - 1)`` (the last
sampled token is never forwarded). vLLM (``--enable-return-routed-experts``) sends base64 of a
``.npy`` ``(rows, layers, experts_per_token)``, uint8 up to 256 experts, else uint16; SGLang
(``--enable-return-routed-experts`` and ``return_routed_experts`` per request) base64 of raw
int32 with no shape, reshaped here with the model's layer count and top-k
(``num_hidden_layers``, ``num_experts_per_tok``, as its capturer sizes them).

A call asks only for rows its parent's record does not hold (``SamplingParams.rows_from``);
rows the answer does not carry, or carries in a shape that does not fit, are left absent and
the record says why (``Finish.asked``), never filled in.
"""

from __future__ import annotations

import binascii
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pybase64

from ..token_arrays import ROUTED_EXPERTS, Rows

NAME = ROUTED_EXPERTS.name


@dataclass(frozen=True)
class RoutingShape:
    """A model's routing: MoE layers as the engine counts them, experts per token, experts."""

    layers: int
    top_k: int
    experts: int | None = None


def parse_option(value: str | None) -> tuple[bool, RoutingShape | None]:
    """``serve --routed-experts``: off (None, "", "off"), "on" (the shape from the engine or
    the model's config), or "LAYERS,TOPK[,EXPERTS]"."""
    if value is None or value.strip().lower() in ("", "off", "no", "false", "0"):
        return False, None
    if value.strip().lower() in ("on", "yes", "true", "1"):
        return True, None
    try:
        parts = [int(p) for p in value.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3) or min(parts) <= 0:
        raise ValueError(
            f"--routed-experts takes 'on' or LAYERS,TOPK[,EXPERTS] (positive integers), "
            f"not {value!r}"
        )
    return True, RoutingShape(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def shape_from_config(config: dict) -> RoutingShape | None:
    """The routing shape from a Hugging Face ``config.json`` (its text config where nested)."""
    nested = config.get("text_config")
    cfg: dict = nested if isinstance(nested, dict) else config
    layers = cfg.get("num_hidden_layers")
    top_k = cfg.get("num_experts_per_tok") or cfg.get("moe_topk")
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    if not isinstance(layers, int) or not isinstance(top_k, int):
        return None
    return RoutingShape(layers, top_k, experts if isinstance(experts, int) else None)


def shape_from_model_dir(path: object) -> RoutingShape | None:
    """The routing shape from the ``config.json`` of a local model directory, if there is one."""
    if not isinstance(path, str):
        return None
    cfg = Path(path) / "config.json"
    try:
        return shape_from_config(orjson.loads(cfg.read_bytes()))
    except (OSError, ValueError, AttributeError):
        return None


# A ``.npy`` header as numpy writes it for a plain C-order integer array (format 1.0-3.0):
# read here with one regex, not ``np.load``'s ``ast.literal_eval`` (a third of a call's
# routing cost at agent lengths). Anything else goes through ``np.load``.
_NPY_HEADER = re.compile(
    rb"\{'descr': '([<|>][ui][1248])', 'fortran_order': False, "
    rb"'shape': \((\d+), (\d+), (\d+)\), \} *\n"
)


def decode_npy(b64: str) -> np.ndarray:
    """vLLM's ``routed_experts``: base64 of a ``.npy`` (never pickled objects). A view on the
    decoded bytes, not a copy."""
    raw = pybase64.b64decode(b64, validate=True)
    if raw[:6] == b"\x93NUMPY" and len(raw) >= 10:
        size = 2 if raw[6] == 1 else 4
        n = int.from_bytes(raw[8 : 8 + size], "little")
        start = 8 + size
        m = _NPY_HEADER.fullmatch(raw, start, start + n)
        if m is not None:
            dtype = np.dtype(m[1].decode())
            shape = (int(m[2]), int(m[3]), int(m[4]))
            count = shape[0] * shape[1] * shape[2]
            if len(raw) - (start + n) != count * dtype.itemsize:
                raise ValueError(
                    f"routed_experts holds {len(raw) - start - n} bytes, not the "
                    f"{count * dtype.itemsize} of its header's shape {shape}"
                )
            return np.frombuffer(raw, dtype=dtype, offset=start + n).reshape(shape)
    arr = np.load(io.BytesIO(raw), allow_pickle=False)
    if arr.ndim != 3:
        raise ValueError(f"routed_experts has shape {arr.shape}, not (tokens, layers, top_k)")
    return arr


def decode_int32(b64: str, shape: RoutingShape) -> np.ndarray:
    """SGLang's ``meta_info.routed_experts``: base64 of raw little-endian int32 rows."""
    flat = np.frombuffer(pybase64.b64decode(b64, validate=True), dtype="<i4")
    per_row = shape.layers * shape.top_k
    if flat.size % per_row:
        raise ValueError(
            f"routed_experts holds {flat.size} ids, not a whole number of rows of "
            f"{shape.layers} layers x {shape.top_k} experts"
        )
    return flat.reshape(-1, shape.layers, shape.top_k)


def rows(
    decoded: np.ndarray, start: int, expected: int, experts: int | None
) -> tuple[Rows | None, str | None]:
    """The engine's rows placed from ``start`` (``expected`` of them), in the declared dtype;
    or None and why when they cannot be vouched for (a count or value the wire does not
    allow: the record marks them absent rather than guess which tokens they belong to)."""
    if len(decoded) != expected:
        return None, f"the engine returned {len(decoded)} routing rows, expected {expected}"
    # one pass for the largest id (and one for the smallest only where ids may be negative)
    top = int(decoded.max()) if decoded.size else -1
    if decoded.size and (
        (decoded.dtype.kind == "i" and int(decoded.min()) < 0) or (experts and top >= experts)
    ):
        return None, "the engine returned expert ids outside the model's experts"
    dtype = np.dtype(np.uint8 if (experts or top + 1) <= 256 else np.uint16)
    if decoded.dtype == dtype and decoded.flags.c_contiguous:
        return Rows(start, decoded), None  # the engine's own bytes, kept as they came
    return Rows(start, np.ascontiguousarray(decoded, dtype=dtype)), None


def read(
    raw: object,
    *,
    start: int,
    prompt_len: int,
    completion_len: int,
    shape: RoutingShape | None,
    npy: bool,
) -> tuple[Rows | None, dict]:
    """One answer's routing (``raw``: the base64 field, or None) as rows and what the record
    says of it (``{"asked", "from", "rows", "note"}``)."""
    expected = max(0, prompt_len + completion_len - 1 - start)
    said: dict = {"asked": True, "from": start, "rows": None}
    if raw is None:
        said["note"] = "the engine returned no routing (is it started with routing on?)"
        return None, said
    if not isinstance(raw, str):
        said["note"] = f"routed_experts is a {type(raw).__name__}, not base64"
        return None, said
    try:
        if npy:
            decoded = decode_npy(raw)
        elif shape is None:
            said["note"] = "the model's layers and top-k are not known (--routed-experts L,K)"
            return None, said
        else:
            decoded = decode_int32(raw, shape)
    except (ValueError, binascii.Error) as exc:
        said["note"] = f"routed_experts could not be read: {exc}"
        return None, said
    got, note = rows(decoded, start, expected, shape.experts if shape else None)
    if got is None:
        said["note"] = note
        return None, said
    said["rows"] = len(got)
    return got, said
