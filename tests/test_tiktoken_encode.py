"""The tiktoken encoder gives exactly the IDs of the ``tokenizers`` library where it is used, and
is refused where the two algorithms could differ.

The truth is the ``tokenizers`` library's own ``encode`` of the same text (and, through
``tests/test_tokenizers.py`` and ``tests/test_tokenize_agreement.py``, llama.cpp's reference
vectors and llama-server's ``/tokenize``, which now go through this encoder where it is used).
"""

from __future__ import annotations

import functools
import json

import pytest
import tiktoken
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turnstile_testbed as testbed
from turnstile.chat import tiktoken_encode
from turnstile.chat.tiktoken_encode import byte_alphabet, tiktoken_encoder
from turnstile.chat.tokenizer import LoadedTokenizer, load_tokenizer

pytestmark = pytest.mark.unit

FAST = ["qwen2", "qwen35", "gpt-2", "aquila"]  # byte-level BPE converted from tiktoken ranks
KEPT = {  # and why the tokenizers encoder stays
    "llama-bpe": "rank order",  # several merges per token (Llama 3's tokenizer.json)
    "llama-spm": "normalizer",
    "gemma-4": "normalizer",
    "deepseek-coder": "pre-tokenizer",
}


@functools.cache
def vocab(name: str) -> LoadedTokenizer:
    return load_tokenizer(str(testbed.models_dir() / f"ggml-vocab-{name}.gguf"))


def pieces(tok: LoadedTokenizer) -> st.SearchStrategy[str]:
    """Text the way a chat render makes it: added tokens between code, prose, whitespace runs,
    digits, contractions and any Unicode."""
    added = sorted(a.content for a in tok.tokenizer.get_added_tokens_decoder().values())[:64]
    tricky = [" ", "\n", "\n\n", "  ", "\t", "\r\n", "\u00a0", "'s", "'S", "'LL", "\u017f"]
    tricky += ["123456", "½", "élan", "日本語", "🙂🦙", "ǅ", "x=1;\ty", "    def f():\n"]
    return st.lists(
        st.one_of(st.text(max_size=24), st.sampled_from([*added, *tricky])), max_size=16
    ).map("".join)


@pytest.mark.parametrize("name", FAST)
def test_tiktoken_equals_tokenizers(name: str):
    tok = vocab(name)
    assert tok.encoder == "tiktoken"
    seen: list[int] = []

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(pieces(tok))
    def agree(text: str) -> None:
        ids = tok.encode(text)
        assert ids == tok.hf_encode(text), repr(text)
        seen.append(len(ids))

    agree()
    assert sum(seen) > 1000  # texts long enough to exercise merges


@pytest.mark.parametrize("name", sorted(KEPT))
def test_refused_where_it_could_differ(name: str):
    tok = vocab(name)
    assert tok.fast is None
    assert KEPT[name] in tok.encoder, tok.encoder
    text = "<|im_start|>user\nHAVING fun in Zürich? 🦙 x=1;\ty\n"
    assert tok.encode(text) == tok.hf_encode(text)


def _tiny_bpe(merges: list[tuple[str, str]], extra: list[str]) -> tokenizers.Tokenizer:
    """A byte-level BPE over all 256 bytes plus ``extra`` tokens (ranked in that order)."""
    alphabet = {b: chr(c) for c, b in byte_alphabet().items()}
    vocab_ = {alphabet[b]: b for b in range(256)}
    for i, t in enumerate(extra):
        vocab_[t] = 256 + i
    spec = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "BPE",
            "vocab": vocab_,
            "merges": [list(m) for m in merges],
            "ignore_merges": False,
        },
    }
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def test_merges_the_ranks_do_not_induce_are_refused(tmp_path, monkeypatch):
    """ "abc" is listed as a + bc, but its rank induces ab + c (ab ranks below bc): the two
    algorithms encode "abc" differently, so the tokenizers encoder must stay."""
    monkeypatch.setenv("TURNSTILE_CACHE", str(tmp_path))
    bad = _tiny_bpe([("a", "b"), ("b", "c"), ("a", "bc")], ["ab", "bc", "abc"])
    fast, why = tiktoken_encoder(bad, "test-bad")
    assert fast is None and "induces" in why
    # what tiktoken on the same ranks would have given: not the tokenizers library's IDs
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}
    naive = tiktoken.Encoding("naive", pat_str=".+", mergeable_ranks=ranks, special_tokens={})
    hf = bad.encode_batch_fast(["abc"], add_special_tokens=False)[0].ids
    assert naive.encode_ordinary("abc") != hf

    good = _tiny_bpe([("a", "b"), ("b", "c"), ("ab", "c")], ["ab", "bc", "abc"])
    fast, why = tiktoken_encoder(good, "test-good")
    assert fast is not None, why
    for text in ["abc", "abcbc", "babc", "cab abc  bc\n"]:
        assert fast(text) == good.encode_batch_fast([text], add_special_tokens=False)[0].ids


def test_the_merge_check_is_remembered_on_disk(tmp_path, monkeypatch):
    """The token-by-token check runs once per tokenizer and machine; its verdict is read back."""
    monkeypatch.setenv("TURNSTILE_CACHE", str(tmp_path))
    good = _tiny_bpe([("a", "b"), ("b", "c"), ("ab", "c")], ["ab", "bc", "abc"])
    assert tiktoken_encoder(good, "first")[0] is not None
    assert len(list((tmp_path / "tiktoken-checked").iterdir())) == 1

    def must_not_run(*_: object) -> str:
        raise AssertionError("checked again")

    monkeypatch.setattr(tiktoken_encode, "_merges_induced", must_not_run)
    assert tiktoken_encoder(good, "second")[0] is not None


@pytest.mark.parametrize("name", FAST)
def test_fast_decode_equals_tokenizers(name: str):
    """The table decode gives ``tokenizers``' text for any IDs: added tokens, lone bytes that
    are not UTF-8 (each maximal bad run one U+FFFD, as Rust's ``from_utf8_lossy``), the whole
    vocabulary; an ID outside it gets what ``tokenizers`` answers."""
    tok = vocab(name)
    assert tok.fast_decode is not None
    size = tok.tokenizer.get_vocab_size()
    added = sorted(tok.tokenizer.get_added_tokens_decoder())
    by_byte = [tok.tokenizer.token_to_id(chr(cp)) for cp in byte_alphabet()]
    assert None not in by_byte
    ids = st.one_of(st.integers(0, size - 1), st.sampled_from(added), st.sampled_from(by_byte))

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(ids, max_size=24))
    def agree(seq: list[int]) -> None:
        assert tok.decode(seq) == tok.hf_decode(seq)

    agree()

    def outcome(f, seq):  # noqa: ANN001, ANN202
        try:
            return f(seq)
        except Exception as exc:  # noqa: BLE001 - the same failure either way
            return type(exc)

    for seq in ([size], [1, size + 7, 2], [-1]):
        assert outcome(tok.decode, seq) == outcome(tok.hf_decode, seq)
