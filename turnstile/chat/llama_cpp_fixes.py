"""Corrections to transformers' GGUF tokenizer mapping, so tokens match llama.cpp's.

Each table and repair here is checked against llama.cpp's tokenizer test vectors in
``tests/test_tokenizers.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import tokenizers
from gguf import TokenType
from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
)


def apply_llama_cpp_conventions(
    backend: tokenizers.Tokenizer, architecture: str, tokenizer_dict: dict[str, Any]
) -> tokenizers.Tokenizer:
    """``backend`` as transformers built it, corrected to the llama.cpp conventions it misses."""
    tokenizer_type = tokenizer_dict.get("tokenizer_type")
    pre = tokenizer_dict.get("pre_tokenizer_type")
    backend = _repair_added_tokens(backend, tokenizer_dict)
    if tokenizer_type == "gpt2":
        fix = _PRE_TOKENIZER_FIXES.get(pre or "")
        if fix is not None:
            backend.pre_tokenizer = fix()
        if pre in _IGNORE_MERGES_PRE:
            backend.model.ignore_merges = True
    elif tokenizer_type == "llama" and architecture not in _SPM_ARCHITECTURES_HANDLED:
        _use_sentencepiece_prefix(backend, tokenizer_dict.get("add_prefix_space", True))
    return backend


# Architectures whose sentencepiece layout transformers already builds explicitly.
_SPM_ARCHITECTURES_HANDLED = frozenset({"gemma", "gemma2", "gemma3", "phi3"})


def _use_sentencepiece_prefix(backend: tokenizers.Tokenizer, add_prefix: bool) -> None:
    """Sentencepiece's own whitespace handling, which llama.cpp reproduces for SPM vocabularies.

    transformers builds a ``Metaspace(prepend_scheme="first")`` pre-tokenizer, which drops the
    dummy prefix for text that already starts with a space (`" Hello"` -> `▁Hello`), while
    sentencepiece and llama.cpp write `▁▁Hello`. A normalizer that prepends ``▁`` (to every
    segment between special tokens, as llama.cpp does) and maps spaces to ``▁`` matches them.
    """
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "\u2581")]
    if add_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = None
    if not add_prefix:  # no prefix was added, so none may be stripped when decoding
        backend.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        )


def _splits_then_digits(*patterns: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    """The deepseek layout: isolate each pattern in turn, then single digits, then bytes."""

    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns]
            + [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    """Single digits, then GPT-2's split (starcoder, refact, command-r, smollm, ...)."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _falcon() -> pre_tokenizers.PreTokenizer:
    """Falcon: runs of punctuation, GPT-2's split, then numbers cut into groups of three."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Punctuation(behavior="contiguous"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated"),
        ]
    )


# Patterns from the models' own tokenizer.json files; non-ASCII written as \x{...} so that no
# editor or Unicode normalization can silently change a range bound.
_CJK = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"
# deepseek-llm's letter class: the cased letters of the scripts its tokenizer.json lists.
_DEEPSEEK_LLM_LETTERS = (
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}"
    r"\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}"
    r"\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}"
    r"\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}"
    r"\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}"
    r"\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}"
    r"\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}"
    r"\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}"
    r"\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}"
    r"\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}"
    r"\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}"
    r"\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}"
    r"\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}"
    r"\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}"
    r"\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}"
    r"\x{1E900}-\x{1E943}]+"
)
_DEEPSEEK_LLM_PUNCTUATION = (
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+"
)

# tokenizer.ggml.pre values whose split transformers' mapping lacks (it falls back to GPT-2's).
_PRE_TOKENIZER_FIXES: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "command-r": _digits_then_gpt2,
    "smollm": _digits_then_gpt2,
    "codeshell": _digits_then_gpt2,
    "exaone": _digits_then_gpt2,
    "minerva-7b": _digits_then_gpt2,
    "falcon": _falcon,
    "deepseek-coder": _splits_then_digits("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK),
    "deepseek-llm": _splits_then_digits(
        "[\r\n]", _DEEPSEEK_LLM_LETTERS, _DEEPSEEK_LLM_PUNCTUATION, r"\s+$", _CJK
    ),
}

# The Llama 3 family of tokenizer.ggml.pre values (same split, same conventions).
_LLAMA3_PRE = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
    | {"jina-v5-nano"}
)

# tokenizer.ggml.pre values whose tokenizer.json sets `"ignore_merges": true` (a word that is
# itself in the vocabulary is emitted whole, whatever the merges would have made of it).
_IGNORE_MERGES_PRE = _LLAMA3_PRE | {
    "tekken",
    "glm4",
    "glm5",
    "youtu",
    "minicpm5",
    "granite-embed-multi-97m",
}

# Byte-level vocabularies that expect BOS when the file has no tokenizer.ggml.add_bos_token
# (llama.cpp's defaults; sentencepiece vocabularies always do).
_ADD_BOS_PRE = _LLAMA3_PRE | {"tekken", "chameleon"}


def default_add_special(tokenizer_type: str | None, pre: str | None) -> tuple[bool, bool]:
    """``(add_bos, add_eos)`` for a file that does not say."""
    if tokenizer_type == "llama":
        return True, False
    if tokenizer_type == "t5":
        return False, True
    return tokenizer_type == "gpt2" and pre in _ADD_BOS_PRE, False


def _repair_added_tokens(
    backend: tokenizers.Tokenizer, tokenizer_dict: Mapping[str, Any]
) -> tokenizers.Tokenizer:
    """Make the added tokens exactly the file's control and user-defined tokens, at their ids.

    Two things go wrong in transformers' conversion:

    - the tokenizer class may invent a default special token the file does not have (GPT-2's
      ``<|endoftext|>`` for Llama 3), appended past the end of the vocabulary: an id the model
      cannot embed. Those are dropped.
    - in byte-level vocabularies llama.cpp stores control and user-defined tokens as raw text
      (`"  "`, `<\uff5cbegin\u2581of\u2581sentence\uff5c>`) and matches that text in the input;
      transformers re-spells them into the byte alphabet, so they are never matched (and the
      re-spelling can shadow an ordinary token). Each is put back under its raw text at its own id
      and registered as an added token, so tokenization and decoding follow llama.cpp.
    """
    tokens: list[str] = tokenizer_dict["tokens"]
    kinds: list[int] = tokenizer_dict.get("token_type") or []
    phantom = [i for i in backend.get_added_tokens_decoder() if i >= len(tokens)]
    raw_ids: list[int] = []
    if tokenizer_dict.get("tokenizer_type") == "gpt2":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        to_alphabet = bytes_to_unicode()
        alphabet = set(to_alphabet.values())
        raw_ids = [
            i
            for i, (text, kind) in enumerate(zip(tokens, kinds, strict=False))
            if kind in (TokenType.CONTROL, TokenType.USER_DEFINED) and not set(text) <= alphabet
        ]
    if not phantom and not raw_ids:
        return backend

    model = backend.model
    if raw_ids:
        if not isinstance(model, models.BPE):  # a "gpt2" GGUF tokenizer is byte-level BPE
            raise ValueError(f"GGUF tokenizer_type gpt2 with a {type(model).__name__} model")
        vocab = backend.get_vocab(with_added_tokens=False)
        raw = set(raw_ids)
        shadowed: set[str] = set()
        for i in raw_ids:
            spelled = "".join(to_alphabet[b] for b in tokens[i].encode("utf-8"))
            if vocab.get(spelled) == i:
                del vocab[spelled]
                shadowed.add(spelled)
        for i, text in enumerate(tokens):  # ordinary tokens the re-spelling had overwritten
            if text in shadowed and i not in raw and text not in vocab:
                vocab[text] = i
        vocab.update((tokens[i], i) for i in raw_ids)
        model = _bpe_like(model, vocab, tokenizer_dict)

    # A fresh Tokenizer around the (possibly same) model: the only way to drop added tokens.
    rebuilt = tokenizers.Tokenizer(model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if (value := getattr(backend, part)) is not None:
            setattr(rebuilt, part, value)
    added = {i: t for i, t in backend.get_added_tokens_decoder().items() if i < len(tokens)}
    for i in raw_ids:
        added.setdefault(
            i, AddedToken(tokens[i], normalized=False, special=kinds[i] == TokenType.CONTROL)
        )
    for i in sorted(added):
        token = added[i]
        if token.special:
            rebuilt.add_special_tokens([token])
        else:
            rebuilt.add_tokens([token])
        if rebuilt.token_to_id(token.content) != i:
            raise ValueError(f"GGUF added token {token.content!r} could not be kept at id {i}")
    return rebuilt


def _bpe_like(
    model: models.BPE, vocab: dict[str, int], tokenizer_dict: Mapping[str, Any]
) -> models.Model:
    """A BPE model with ``model``'s options and merges but another vocabulary."""
    if "merges" in tokenizer_dict:
        merges = [tuple(m.split(" ", 1)) for m in tokenizer_dict["merges"]]
    else:
        merges = [tuple(m) for m in json.loads(model.__getstate__())["merges"]]
    return models.BPE(
        vocab=vocab,
        merges=merges,
        dropout=model.dropout,
        unk_token=model.unk_token,
        continuing_subword_prefix=model.continuing_subword_prefix,
        end_of_word_suffix=model.end_of_word_suffix,
        fuse_unk=model.fuse_unk,
        byte_fallback=model.byte_fallback,
        ignore_merges=model.ignore_merges,
    )
