"""vLLM's ``routed_experts`` read without ``np.load`` (issue 42's CPU target): for every array
numpy's own ``np.save`` writes (the bytes vLLM's ``numpy2base64`` sends), the fast header read
gives back numpy's array, a payload whose length does not match its header is refused, and a
header the fast path does not know (Fortran order, another shape) still reads through
``np.load``. The truth is numpy's serializer, not this code."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.engines import routing
from turnstile.token_arrays import Rows, pack, unpack

pytestmark = pytest.mark.unit


def _b64(a: np.ndarray, version: tuple[int, int] | None = None) -> str:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, a, allow_pickle=False)
    else:  # the other header formats numpy writes (4-byte length)
        np.lib.format.write_array(buf, a, version=version, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 40),
    layers=st.integers(1, 6),
    k=st.integers(1, 4),
    dtype=st.sampled_from(["|u1", "<u2", "<i4", ">u2", "<i8"]),
    version=st.sampled_from([None, (2, 0), (3, 0)]),
    seed=st.integers(0, 2**16),
)
def test_every_array_numpy_saves_reads_back(rows, layers, k, dtype, version, seed) -> None:
    a = np.random.default_rng(seed).integers(0, 255, (rows, layers, k)).astype(dtype)
    got = routing.decode_npy(_b64(a, version))
    assert got.shape == a.shape and got.dtype == a.dtype
    assert np.array_equal(got, a)
    # and what the store keeps of it is the same ids, uint8 (every id < 256)
    kept, note = routing.rows(got, 3, rows, None)
    assert note is None and kept is not None
    back = unpack(pack({"routed_experts": kept}))["routed_experts"]
    assert back.start == 3 and back.values.dtype == np.uint8
    assert np.array_equal(back.values, a.astype(np.int64))


def test_a_payload_shorter_or_longer_than_its_header_is_refused() -> None:
    buf = io.BytesIO()
    np.save(buf, np.zeros((4, 2, 2), np.uint8))
    raw = buf.getvalue()
    for bad in (raw[:-3], raw + b"\x00"):
        with pytest.raises(ValueError, match="bytes, not the 16"):
            routing.decode_npy(base64.b64encode(bad).decode())
    said = routing.read(
        base64.b64encode(raw[:-1]).decode(),
        start=0,
        prompt_len=4,
        completion_len=1,
        shape=None,
        npy=True,
    )[1]
    assert said["rows"] is None and "could not be read" in said["note"]


def test_other_headers_go_through_numpy() -> None:
    a = np.asfortranarray(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
    assert np.array_equal(routing.decode_npy(_b64(a)), a)
    with pytest.raises(ValueError, match="not \\(tokens, layers, top_k\\)"):
        routing.decode_npy(_b64(np.arange(6, dtype=np.uint8)))


def test_the_stored_rows_are_the_engines_bytes_when_their_dtype_is_kept() -> None:
    a = np.random.default_rng(0).integers(0, 128, (5, 3, 2)).astype(np.uint8)
    got = routing.decode_npy(_b64(a))
    kept, _ = routing.rows(got, 0, 5, 128)
    assert kept is not None and np.shares_memory(kept.values, got)  # no copy on the way
    wide, _ = routing.rows(a.astype(np.uint16), 0, 5, 128)
    assert wide is not None and wide.values.dtype == np.uint8  # narrowed as before
    assert routing.rows(a.astype(np.int32) - 1, 0, 5, 128)[1] is not None  # -1: refused
    assert Rows(0, a).end == 5
