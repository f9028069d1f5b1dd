"""Streaming detokenization in batches: ``IncrementalDetokenizer.push_many`` (the tokens of one
engine read at once) must give the text that pushing them one at a time gives, and the text of
the whole reply decoded at once (what a non-streamed reply holds), over real vocabularies
(byte-level BPE, SentencePiece with byte fallback: llama.cpp's GGUF test vocabularies), for
text with multi-byte characters split across tokens, and for arbitrary sampled token
sequences that decode to text."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import turnstile_testbed as testbed
from turnstile.chat.detokenize import IncrementalDetokenizer
from turnstile.chat.tokenizer import LoadedTokenizer, load_tokenizer

pytestmark = pytest.mark.unit

VOCABS = ["qwen2", "llama-spm", "llama-bpe", "gemma-4", "phi-3", "gpt-2", "baichuan", "falcon"]


@functools.cache
def vocab(name: str) -> LoadedTokenizer:
    return load_tokenizer(str(testbed.models_dir() / f"ggml-vocab-{name}.gguf"))


def one_by_one(tok: LoadedTokenizer, ids: list[int]) -> str:
    d = IncrementalDetokenizer(tok)
    return "".join(d.push(t) for t in ids) + d.flush()


def in_batches(tok: LoadedTokenizer, ids: list[int], cuts: list[int]) -> tuple[str, list[str]]:
    d = IncrementalDetokenizer(tok)
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    pieces = [d.push_many(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    return "".join(pieces) + d.flush(), pieces


PIECES = [*"abc xyz\n\t.,;:-_(){}[]\"'\\/<>|=", "é", "ß", "ø", "中", "文", "字", "日本"]
PIECES += ["😀", "👍🏽", "🧪", "ـ", "ع", "ñ", "\u200b", "  "]
text = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
cuts = st.lists(st.integers(0, 200), max_size=8)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", VOCABS)
@SETTINGS
@given(s=text, cut=cuts)
def test_batches_give_the_text_of_one_by_one(name: str, s: str, cut: list[int]) -> None:
    tok = vocab(name)
    ids = tok.encode(s)
    want = one_by_one(tok, ids)
    got, pieces = in_batches(tok, ids, cut)
    assert got == want
    assert got == tok.decode(ids)  # (what a non-streamed reply holds)


@pytest.mark.parametrize("name", VOCABS)
@SETTINGS
@given(data=st.data(), cut=cuts)
def test_batches_of_any_sampled_ids(name: str, data: st.DataObject, cut: list[int]) -> None:
    tok = vocab(name)
    n = tok.tokenizer.get_vocab_size()
    ids = data.draw(st.lists(st.integers(0, n - 1), max_size=40))
    # Bytes that never form a character decode differently with each window (one at a time
    # or all at once alike); where they do form text, the text must be the same.
    assume("\ufffd" not in tok.decode(ids))
    assert in_batches(tok, ids, cut)[0] == one_by_one(tok, ids)
