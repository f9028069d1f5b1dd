"""Token IDs of whole rendered prompts, with the pieces between added tokens remembered.

A tokenizer splits text at its added tokens (``<|im_start|>``, ``<tool_call>``, ...) before
anything else, so a render's IDs are its pieces' IDs with the added tokens' IDs between them.
Every rollout of a batch renders the same system prompt and tool schemas, and every sample of a
GRPO group the same task: those pieces are tokenized once and looked up after that.

Exactness rests on two facts checked per tokenizer, not assumed: every added token matches the
raw text (no normalisation, no stripping of neighbouring spaces), and encoding a piece after a
one-token *anchor* (the EOS text) gives the IDs the piece gets after any added token in a whole
render (no SentencePiece prefix space, no merge across the boundary). A probe that mixes
added tokens with spaces, newlines and non-ASCII text must encode identically both ways, or the
encoder falls back to encoding the whole text.
"""

from __future__ import annotations

import re
from array import array

from .tokenizer import LoadedTokenizer

_PROBE_TEXTS = (
    "Hello world",
    " leading space",
    "\n\nnewlines\n",
    "  two spaces ",
    "1234567",
    "ünïcödé 日本語 🙂",
    "▁metaspace",
    "\t tab",
    "",
)


class PromptEncoder:
    def __init__(self, tok: LoadedTokenizer, anchor: str | None, max_tokens: int = 1 << 22):
        self.tok = tok
        self.max_tokens = max_tokens  # the cache is emptied past this (4 bytes per token)
        self._cache: dict[tuple[str, bool], array] = {}
        self._cached_tokens = 0
        self.hits = self.misses = 0
        self._anchor = anchor or ""  # used only when pieces are cached (anchor given)
        self._split, self._ids = _added_token_split(tok) if anchor else (None, {})
        if self._split is not None and not self._agrees():
            self._split = None

    @property
    def piecewise(self) -> bool:
        """Whether pieces are cached (False: every text is encoded whole)."""
        return self._split is not None

    def encode(self, text: str) -> list[int]:
        """IDs of ``text`` exactly as ``tok.encode(text)`` gives them."""
        if self._split is None:
            return self.tok.encode(text)
        parts = self._split.split(text)  # text, token, text, token, ..., text
        pieces = parts[0::2]
        cache = self._cache
        found: list[array | list[int] | None] = [
            cache.get((p, i == 0)) if p else None for i, p in enumerate(pieces)
        ]
        missing = [i for i, ids in enumerate(found) if ids is None and pieces[i]]
        if missing:
            self.misses += len(missing)
            anchor = self._anchor
            texts = [pieces[i] if i == 0 else anchor + pieces[i] for i in missing]
            encoded = self.tok.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            for i, enc in zip(missing, encoded, strict=True):
                ids = enc.ids if i == 0 else enc.ids[1:]
                found[i] = ids
                if self._cached_tokens + len(ids) > self.max_tokens:
                    cache.clear()
                    self._cached_tokens = 0
                cache[(pieces[i], i == 0)] = array("i", ids)
                self._cached_tokens += len(ids)
        self.hits += len(pieces) - len(missing)
        out: list[int] = []
        added = self._ids
        for i, piece in enumerate(found):
            if piece:
                out.extend(piece)
            if i + 1 < len(pieces):
                out.append(added[parts[2 * i + 1]])
        return out

    def _agrees(self) -> bool:
        names = sorted(self._ids, key=len)[:6]
        probe = ""
        for i, text in enumerate(_PROBE_TEXTS):
            probe += text + (names[i % len(names)] if names else "")
        for text in (probe, probe[1:], " " + probe, names[0] + probe if names else probe):
            self._cache.clear()
            if self.encode(text) != self.tok.encode(text):
                return False
            if self.encode(text) != self.tok.encode(text):  # the cached pieces too
                return False
        self._cache.clear()
        self._cached_tokens = 0
        return True


def _added_token_split(tok: LoadedTokenizer) -> tuple[re.Pattern | None, dict[str, int]]:
    """A pattern that splits at added tokens as the tokenizer does (leftmost, longest first),
    or None when some added token is matched differently (normalised or stripping)."""
    added = tok.tokenizer.get_added_tokens_decoder()
    ids: dict[str, int] = {}
    for tid, a in added.items():
        if a.normalized or a.lstrip or a.rstrip or a.single_word:
            return None, {}
        if a.content:
            ids[a.content] = tid
    if not ids:
        return None, {}
    alternatives = sorted(ids, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, alternatives)) + ")"), ids
