"""Per-token arrays, declared once as data: what each is, how it is stored and stitched.

A per-token fact beyond the token IDs (an engine's routed experts, the weight version a token
was sampled under) travels the same path whatever it is: the engine adapter hands it over in
:class:`Rows` (``Finish.arrays``), the call record keeps it by name, the store packs it as raw
bytes (:func:`pack`), the stitched trajectory lays each call's rows on the sample's positions
(:func:`stitch`) with a presence mask, and the exports and converters read it by name. Adding
one is a :class:`TokenArray` in :data:`DECLARED` plus the engine's reader; nothing between
them names it.

Positions are absolute in the call's whole sequence (prompt then completion), so a child call's
rows and its parent's land on the same axis: a reused prefix's rows come from the first call
on the path that recorded them, and a position no call covers is absent (never a silent zero).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

COMPLETION = "completion"  # rows only for sampled tokens (the sampled call's own)
SEQUENCE = "sequence"  # rows for prompt and completion tokens alike (a prefix reused)


@dataclass(frozen=True)
class TokenArray:
    """One per-token array. ``dtypes``: what a value may be stored as (the first is the
    default; a sample whose calls differ takes the widest); ``trailing``: the names of the
    dimensions after the token axis; ``covers``: :data:`COMPLETION` (only the sampled calls'
    rows count) or :data:`SEQUENCE` (a reused prefix's rows come from the earliest call on the
    path that holds them); ``fill``: the value of an absent row in a stitched sample."""

    name: str
    dtypes: tuple[str, ...]
    trailing: tuple[str, ...]
    covers: str
    fill: int | float = 0
    doc: str = ""
    # a key of its own on the stitched sample (``<name>`` and ``<name>_present``); False for
    # an array a sample already gives in another form (weight versions: ``versions``)
    own_key: bool = True
    # the trailing dimensions may differ call to call (top-k lists: each call asks its own k):
    # a sample pads every call's rows with ``fill`` to the widest, where otherwise a call of
    # another shape is left absent
    ragged: bool = False

    def empty(self, tail: tuple[int, ...] = ()) -> np.ndarray:
        return np.zeros((0, *tail), dtype=self.dtypes[0])


# The weight version each sampled token ran under, as an integer (-1: not reported or not an
# integer; the engine's raw names stay in the record's ``info.weight_versions`` spans).
WEIGHT_VERSION = TokenArray(
    "weight_version",
    ("int64",),
    (),
    COMPLETION,
    fill=-1,
    doc="the policy version of each sampled token (engine spans, as integers)",
    own_key=False,
)
# The experts the engine's router picked for each token in each MoE layer (router replay, R3):
# uint8 for up to 256 experts, else uint16, as vLLM returns them.
ROUTED_EXPERTS = TokenArray(
    "routed_experts",
    ("uint8", "uint16"),
    ("layers", "experts_per_token"),
    SEQUENCE,
    doc="the routed experts of each token, per MoE layer (router replay)",
)
# The probability mass of the sampler's kept set (top-k/top-p/min-p) under the temperature-
# scaled distribution, per sampled token, where the engine returns its sampler's own logprob
# (SGLang's sampling mask): the call's logprobs are then the sampler's (renormalised over the
# kept set), and ``logprob + log(kept_mass)`` is the scaled logprob before the cut.
KEPT_MASS = TokenArray(
    "kept_mass",
    ("float32",),
    (),
    COMPLETION,
    fill=float("nan"),
    doc="the kept set's mass of each sampled token (the engine's sampling mask)",
)
# The top-k candidates of each sampled token, as the engine returned them for a request that
# asked for top logprobs (Chat and Responses ``top_logprobs``): their ids and logprobs, best
# first, ``k`` the most any token of the call got (at least the k asked). A short row (the
# engine gave fewer) is padded with -1 / NaN; a call that asked for none has no rows.
TOP_IDS = TokenArray(
    "top_ids",
    ("int32",),
    ("k",),
    COMPLETION,
    fill=-1,
    doc="the ids of each sampled token's top-k candidates, best first (-1: none)",
    ragged=True,
)
TOP_LOGPROBS = TokenArray(
    "top_logprobs",
    ("float32",),
    ("k",),
    COMPLETION,
    fill=float("nan"),
    doc="the logprobs of each sampled token's top-k candidates, as top_ids (NaN: none)",
    ragged=True,
)
DECLARED: dict[str, TokenArray] = {
    a.name: a for a in (WEIGHT_VERSION, ROUTED_EXPERTS, KEPT_MASS, TOP_IDS, TOP_LOGPROBS)
}


def declared(name: str) -> TokenArray:
    try:
        return DECLARED[name]
    except KeyError:
        raise KeyError(f"no per-token array {name!r} is declared ({sorted(DECLARED)})") from None


@dataclass(slots=True)
class Rows:
    """Rows of one array for positions ``[start, start + len(values))`` of a call's sequence."""

    start: int
    values: np.ndarray

    @property
    def end(self) -> int:
        return self.start + len(self.values)

    def __len__(self) -> int:
        return len(self.values)


def expert_dtype(num_experts: int | None, values: np.ndarray | None = None) -> np.dtype:
    """uint8 when every expert id fits (the model's expert count, else the values seen)."""
    if num_experts is None:
        top = int(values.max()) + 1 if values is not None and values.size else 0
        num_experts = top
    return np.dtype(np.uint8 if num_experts <= 256 else np.uint16)


# --- the store's blob: raw bytes per array, a small header, no JSON per token ---------------

_MAGIC = b"TA1\x00"


def pack(arrays: Mapping[str, Rows]) -> bytes | None:
    """``arrays`` as one blob: a JSON header (name, dtype, start, shape per array) and the
    arrays' bytes back to back (C order, little-endian). None when there are none."""
    if not arrays:
        return None
    head, blobs = [], []
    for name, rows in arrays.items():
        v = np.ascontiguousarray(rows.values)
        if v.dtype.byteorder == ">":
            v = v.astype(v.dtype.newbyteorder("<"))
        head.append([name, v.dtype.str, int(rows.start), list(v.shape)])
        blobs.append(v.reshape(-1).view(np.uint8).data)  # joined once below, not copied twice
    header = orjson.dumps(head)
    return b"".join((_MAGIC, struct.pack("<I", len(header)), header, *blobs))


def unpack(blob: bytes | memoryview | None) -> dict[str, Rows]:
    """The inverse of :func:`pack` (an empty dict for None); arrays are read-only views."""
    if not blob:
        return {}
    raw = bytes(blob)
    if raw[:4] != _MAGIC:
        raise ValueError("not a per-token arrays blob")
    (n,) = struct.unpack_from("<I", raw, 4)
    at = 8 + n
    out = {}
    for name, dtype, start, shape in orjson.loads(raw[8:at]):
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 0
        values = np.frombuffer(raw, dtype=dt, count=count, offset=at).reshape(shape)
        at += count * dt.itemsize
        out[name] = Rows(int(start), values)
    return out


# --- weight versions: the engine's spans as a per-token array -------------------------------


def version_number(v: object) -> int:
    """A weight version as an integer: ints and integer strings ("12") map to themselves;
    anything else (None, hashes, names, numbers no int64 holds) to -1."""
    if isinstance(v, bool) or v is None:
        return -1
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        s = v.strip()
        body = s[1:] if s[:1] == "-" else s
        # ASCII digits only: "²".isdigit() is True
        v = int(s) if 0 < len(body) <= 19 and body.isascii() and body.isdigit() else None
    if isinstance(v, int) and -(2**63) <= v <= 2**63 - 1:
        return v
    return -1


def span_versions(spans: list[dict] | None, n: int) -> list | None:
    """The raw weight version of each of ``n`` completion tokens from an engine's spans (None
    where no span covers it; a later span wins a token two cover), or None without spans."""
    if not spans:
        return None
    out: list = [None] * n
    for span in spans:
        for i in range(max(0, int(span["start"])), min(n, int(span["end"]))):
            out[i] = span["version"]
    return out


def version_rows(spans: list[dict] | None, start: int, n: int) -> Rows | None:
    """The weight version of each of ``n`` completion tokens (starting at sequence position
    ``start``) from an engine's spans ``{"version", "start", "end"}`` over completion indexes;
    None when the engine reported none."""
    if not spans or n <= 0:
        return None
    out = np.full(n, -1, dtype=np.int64)
    for span in spans:
        lo, hi = max(0, int(span["start"])), min(n, int(span["end"]))
        if lo < hi:
            out[lo:hi] = version_number(span["version"])
    return Rows(start, out)


# --- top-k candidates: the engine's ragged lists as two padded arrays ---------------------


def top_rows(tops: Sequence[Sequence[tuple[int, float]]], start: int, k: int) -> dict[str, Rows]:
    """The top-k candidates of the sampled tokens (``tops[i]``: token ``i``'s ``(id,
    logprob)`` pairs, as the engine returned them) as :data:`TOP_IDS` and :data:`TOP_LOGPROBS`
    rows from sequence position ``start``: ``[n, width]``, ``width`` the longest list or ``k``
    (what was asked) if more, short lists padded. Empty when none was asked for (``k`` 0)."""
    n = len(tops)
    if k <= 0 or n == 0:
        return {}
    lengths = set(map(len, tops))
    width = max(k, *lengths)
    if lengths == {width}:  # every row whole (the usual answer): one conversion, no loop
        flat = [x for row in tops for pair in row for x in pair]
        ids = np.array(flat[0::2], dtype=TOP_IDS.dtypes[0]).reshape(n, width)
        lps = np.array(flat[1::2], dtype=TOP_LOGPROBS.dtypes[0]).reshape(n, width)
        return {TOP_IDS.name: Rows(start, ids), TOP_LOGPROBS.name: Rows(start, lps)}
    ids = np.full((n, width), TOP_IDS.fill, dtype=TOP_IDS.dtypes[0])
    lps = np.full((n, width), TOP_LOGPROBS.fill, dtype=TOP_LOGPROBS.dtypes[0])
    for i, row in enumerate(tops):
        if row:
            m = len(row)
            ids[i, :m] = [t for t, _ in row]
            lps[i, :m] = [v for _, v in row]
    return {TOP_IDS.name: Rows(start, ids), TOP_LOGPROBS.name: Rows(start, lps)}


def top_lists(ids: np.ndarray, logprobs: np.ndarray) -> list[list[tuple[int, float]]]:
    """The inverse of :func:`top_rows` for one array pair: each row's candidates, the
    padding (id -1) left out."""
    return [
        [(int(t), float(v)) for t, v in zip(r_ids, r_lps, strict=True) if t != TOP_IDS.fill]
        for r_ids, r_lps in zip(ids.tolist(), logprobs.tolist(), strict=True)
    ]


# --- stitching ------------------------------------------------------------------------------


@dataclass(slots=True)
class Piece:
    """One call's rows on a sample: ``offset`` moves the call's positions to the sample's
    (0 in merged samples: every call's sequence is a prefix of the last); ``sampled``: the
    call's completion is trained on in this sample."""

    rows: Rows
    offset: int
    sampled: bool


def stitch(
    array: TokenArray, total: int, pieces: Iterable[Piece]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The sample's ``[total, *trailing]`` array and its int8 presence mask from the calls'
    rows, in path order (the first call to cover a position wins); None when no call on the
    path recorded the array. Rows of differing dtypes take the widest."""
    usable = [p for p in pieces if (p.sampled or array.covers == SEQUENCE) and len(p.rows)]
    if not usable:
        return None
    tail = usable[0].rows.values.shape[1:]
    if array.ragged:  # each call's own width: padded to the widest
        tails = [p.rows.values.shape[1:] for p in usable if p.rows.values.ndim == len(tail) + 1]
        tail = tuple(max(d) for d in zip(*tails, strict=True)) if tail else tail
    dtype = np.result_type(*(p.rows.values.dtype for p in usable))
    out = np.full((total, *tail), array.fill, dtype=dtype)
    present = np.zeros(total, dtype=np.int8)
    for p in usable:
        v = p.rows.values
        if array.ragged and v.ndim == len(tail) + 1 and v.shape[1:] != tail:
            wide = np.full((len(v), *tail), array.fill, dtype=dtype)
            wide[(slice(None), *(slice(0, d) for d in v.shape[1:]))] = v
            v = wide
        if v.shape[1:] != tail:
            continue  # a call recorded another model's shape: left absent, never reshaped
        lo, hi = p.rows.start + p.offset, p.rows.end + p.offset
        a, b = max(lo, 0), min(hi, total)
        if a >= b:
            continue
        free = present[a:b] == 0
        if free.all():
            out[a:b] = v[a - lo : b - lo]
            present[a:b] = 1
        elif free.any():
            idx = np.nonzero(free)[0]
            out[a + idx] = v[a - lo + idx]
            present[a + idx] = 1
    return out, present
