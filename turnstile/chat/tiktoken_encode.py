"""Encode with tiktoken where it gives exactly the IDs the Hugging Face tokenizer gives (and
decode with its table of token bytes where that gives exactly the same text).

Encoding the new messages is the largest part of a call's CPU at coding-agent sizes (a tool
result is thousands of tokens), and tiktoken's byte-pair encoder is ~4x faster than
``tokenizers``' on the same vocabulary. The two algorithms differ: tiktoken merges the adjacent
pair whose concatenation ranks lowest in the vocabulary; ``tokenizers`` merges the adjacent
pair listed first in ``merges``. They agree when the merges are exactly the ones the ranks
induce: for every token, running tiktoken's algorithm on its bytes with only the tokens ranked
below it ends in two parts, and those two are the token's one listed merge, listed in rank
order (how vocabularies that began as tiktoken ranks, Qwen2/2.5/3 and Llama 3, were converted).
That is checked on load, token by token, together with everything else that decides the IDs
(no normalizer, a byte-level pre-tokenizer with one split pattern, no byte fallback, added
tokens that strip nothing); any other tokenizer keeps the ``tokenizers`` encoder.

Added tokens are split off first, as ``tokenizers`` does: the ones matched on raw text, then the
``normalized`` ones in what is left (leftmost, longest first).

Decoding is the same question the other way: a byte-level decoder (``ByteLevel`` alone) turns
each token back into its bytes and the whole into text, replacing what is not UTF-8. tiktoken's
table gives the bytes (an added token's are its text, which must be printable ASCII: then it
reads the same either way) and Python's UTF-8 decoder replaces as Rust's ``from_utf8_lossy``
does. In the server ``tokenizers``' decode cost ~35 us per call for 64 tokens, more than
either side of it; streaming decodes a window twice per batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import orjson
import tokenizers

# ByteLevel's own pattern (``use_regex``: GPT-2's pre-tokenizer)
BYTE_LEVEL_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]
_built: dict[str, tuple[Encode | None, str]] = {}
_decoders: dict[str, Decode | None] = {}


def byte_alphabet() -> dict[int, int]:
    """Byte-level BPE's printable stand-in for each byte (code point -> byte): printable
    Latin-1 bytes stand for themselves, the other bytes take the code points from 256 on, in
    byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: b for b in keep}
    extra = 0
    for b in range(256):
        if b not in keep:
            out[256 + extra] = b
            extra += 1
    return out


def _to_bytes() -> Callable[[str], bytes]:
    """A byte-level vocabulary entry's bytes (UnicodeEncodeError for a character outside the
    alphabet: those below 256 that stand for nothing are sent past Latin-1 first)."""
    table = {c: 0xFFFF for c in range(256)}
    table.update(byte_alphabet())
    return lambda text: text.translate(table).encode("latin-1")


def tiktoken_encoder(tok: tokenizers.Tokenizer, key: str) -> tuple[Encode | None, str]:
    """An encoder giving ``tok``'s IDs for text (no special tokens added, added tokens in the
    text parsed), or None and why not. Built once per ``key`` (the tokenizer's fingerprint)."""
    if key not in _built:
        try:
            _built[key] = _build(tok, key)
        except Exception as exc:  # noqa: BLE001 - any surprise keeps the tokenizers encoder
            _built[key] = (None, f"{type(exc).__name__}: {exc}")
    return _built[key]


def tiktoken_decoder(tok: tokenizers.Tokenizer, key: str) -> Decode | None:
    """A decoder giving ``tok.decode(ids)``'s text (special tokens kept), or None where that
    is not sure; built with the encoder (same ``key``). An ID outside the table raises
    KeyError or OverflowError (the caller then asks ``tokenizers``)."""
    tiktoken_encoder(tok, key)
    return _decoders.get(key)


def _build(tok: tokenizers.Tokenizer, key: str) -> tuple[Encode | None, str]:
    text = tok.to_str()
    spec = orjson.loads(text)
    if spec.get("normalizer") is not None:
        return None, "the tokenizer has a normalizer"
    pattern = _split_pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        return None, "the pre-tokenizer is not a byte-level split"
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None, f"the model is {model.get('type')}, not BPE"
    if model.get("byte_fallback") or model.get("dropout") not in (None, 0, 0.0):
        return None, "byte fallback or dropout"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None, "subword prefix or suffix"
    added = list(tok.get_added_tokens_decoder().items())
    if any(a.lstrip or a.rstrip or a.single_word for _, a in added):
        return None, "an added token strips whitespace or matches single words only"
    added_ids = {i for i, _ in added}

    to_bytes = _to_bytes()
    ranks: dict[bytes, int] = {}
    for entry, i in model["vocab"].items():
        if i in added_ids:
            continue  # split off before byte-pair encoding: never produced by merges
        try:
            ranks[to_bytes(entry)] = i
        except UnicodeEncodeError:
            return None, f"vocabulary entry {entry!r} is not byte-level"
    if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        return None, "the vocabulary does not hold each byte once"
    reason = _remembered(
        hashlib.sha256(text.encode()).hexdigest(),
        lambda: _merges_induced(ranks, model.get("merges") or [], to_bytes),
    )
    if reason:
        return None, reason

    # tiktoken's encoder core, without the ``Encoding`` wrapper: that keeps the Python dict of
    # ranks alive (~20 MiB for 150k tokens) for decoding, which Turnstile does elsewhere.
    from tiktoken._tiktoken import CoreBPE

    specials = {a.content: i for i, a in added}
    core = CoreBPE(ranks, specials, pattern)
    if (spec.get("decoder") or {}).get("type") == "ByteLevel" and all(
        a.content.isascii() and a.content.isprintable() and " " not in a.content for _, a in added
    ):
        decode_bytes = core.decode_bytes
        _decoders[key] = lambda ids: decode_bytes(ids).decode("utf-8", "replace")
    return _with_added(core.encode_ordinary, added), "tiktoken"


def _remembered(digest: str, check: Callable[[], str]) -> str:
    """``check()``'s verdict, kept on disk by the tokenizer's digest: it walks every token
    (seconds for a 150k vocabulary), and a tokenizer's merges do not change."""
    path = Path(os.environ.get("TURNSTILE_CACHE", Path.home() / ".cache" / "turnstile"))
    path = path / "tiktoken-checked" / digest
    with contextlib.suppress(OSError):
        return path.read_text()
    verdict = check()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(verdict)
        tmp.replace(path)
    return verdict


def _split_pattern(pre: dict | None) -> str | None:
    if not pre:
        return None
    if pre.get("type") == "ByteLevel":
        if pre.get("use_regex", True) and not pre.get("add_prefix_space"):
            return BYTE_LEVEL_PATTERN
        return None
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, level = steps
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or "Regex" not in (split.get("pattern") or {})
        or level.get("type") != "ByteLevel"
        or level.get("use_regex")
        or level.get("add_prefix_space")
    ):
        return None
    return split["pattern"]["Regex"]


def _merges_induced(ranks: dict[bytes, int], merges: list, to_bytes: Callable[[str], bytes]) -> str:
    """Why the merges are not exactly the ones the ranks induce ('' when they are)."""
    listed: dict[int, tuple[bytes, bytes]] = {}
    last = -1
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        pa, pb = to_bytes(a), to_bytes(b)
        r = ranks.get(pa + pb)
        if r is None or r <= last or r in listed:
            return f"merge {a!r} + {b!r} is not in rank order of the vocabulary"
        listed[r], last = (pa, pb), r
    for token, r in ranks.items():
        n = len(token)
        if n == 1:
            continue
        want = listed.get(r)
        if want is None:
            return f"token {token!r} has no merge"
        if n == 2:
            if want != (token[:1], token[1:]):
                return f"token {token!r} is not merged as its rank induces"
        elif _split_below(token, r, ranks) != list(want):
            return f"token {token!r} is not merged as its rank induces"
    if len(listed) != sum(len(t) > 1 for t in ranks):
        return "merges produce tokens outside the vocabulary"
    return ""


def _split_below(token: bytes, rank: int, ranks: dict[bytes, int]) -> list[bytes]:
    """tiktoken's algorithm on ``token``'s bytes with only the tokens ranked below ``rank``
    (the lowest-ranked adjacent pair merged first, the leftmost of equal ones)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    pair = [ranks.get(parts[i] + parts[i + 1], rank) for i in range(len(parts) - 1)]
    while len(parts) > 2:
        best = min(pair)
        if best >= rank:
            break
        at = pair.index(best)
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
        del pair[at]
        if at > 0:
            pair[at - 1] = ranks.get(parts[at - 1] + parts[at], rank)
        if at < len(pair):
            pair[at] = ranks.get(parts[at] + parts[at + 1], rank)
    return parts


def _with_added(ordinary: Encode, added: list) -> Encode:
    """``ordinary`` on the text between added tokens; the ones matched on raw text first, then
    the ``normalized`` ones in the rest (no normalizer: the same text)."""
    raw = {a.content: i for i, a in added if not a.normalized}
    normalized = {a.content: i for i, a in added if a.normalized}
    passes = [(_alternation(d), d) for d in (raw, normalized) if d]
    if not passes:
        return ordinary

    def split(text: str, level: int, out: list[int]) -> None:
        if level == len(passes):
            if text:
                out.extend(ordinary(text))
            return
        pattern, ids = passes[level]
        start = 0
        for m in pattern.finditer(text):
            split(text[start : m.start()], level + 1, out)
            out.append(ids[m.group()])
            start = m.end()
        split(text[start:], level + 1, out)

    def encode(text: str) -> list[int]:
        out: list[int] = []
        split(text, 0, out)
        return out

    return encode


def _alternation(tokens: dict[str, int]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
