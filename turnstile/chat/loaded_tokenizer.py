"""The loaded tokenizer every other module works with, and what identifies it.

Kept apart from the loaders so that the HF and GGUF loaders and the renderer can all name it
without importing each other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import tokenizers

from ..families import end_markers
from .tiktoken_encode import Decode, Encode, tiktoken_decoder, tiktoken_encoder


@dataclass(frozen=True)
class LoadedTokenizer:
    """A fast tokenizer plus everything needed to render and stop a chat turn."""

    tokenizer: tokenizers.Tokenizer
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos: bool
    eog_token_ids: frozenset[int]
    special_tokens: dict[str, str]
    source: str
    fingerprint: str
    # tiktoken's encoder where it gives this tokenizer's IDs exactly (``tiktoken_encode``)
    fast: Encode | None = field(default=None, init=False, repr=False, compare=False)
    encoder: str = field(default="tokenizers", init=False, compare=False)
    # and its table of token bytes where decoding by it gives the same text
    fast_decode: Decode | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fast, why = tiktoken_encoder(self.tokenizer, self.fingerprint)
        object.__setattr__(self, "fast", fast)
        object.__setattr__(self, "fast_decode", tiktoken_decoder(self.tokenizer, self.fingerprint))
        object.__setattr__(self, "encoder", "tiktoken" if fast else f"tokenizers ({why})")

    def encode(self, text: str) -> list[int]:
        """Token ids for already-rendered text: no BOS/EOS added, special tokens in text parsed.

        This matches how vLLM/SGLang encode a prompt rendered from a chat template.
        """
        if self.fast is not None:
            return self.fast(text)
        return self.hf_encode(text)

    def hf_encode(self, text: str) -> list[int]:
        """``encode`` by the ``tokenizers`` library itself (what the fast path must equal)."""
        # The batch "fast" path skips offset tracking (about a fifth of the time); same IDs.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text for ``ids`` (special tokens kept unless asked otherwise)."""
        ids = ids if type(ids) is list else list(ids)
        if self.fast_decode is not None and not skip_special_tokens:
            try:
                return self.fast_decode(ids)
            except (KeyError, OverflowError, TypeError):
                pass  # an ID outside the vocabulary: tokenizers' own answer
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def hf_decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """``decode`` by the ``tokenizers`` library itself (what the fast path must equal)."""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        """The vocabulary entry for ``token_id`` (e.g. ``Ġhello`` for byte-level BPE), or None."""
        return self.tokenizer.id_to_token(token_id)


def pick_named_template(templates: Mapping[str, str]) -> str | None:
    """The template to render chats with when a model ships several (HF's rule: 'default')."""
    if "default" in templates:
        return templates["default"]
    return next(iter(templates.values()), None)


def fingerprint_of(tokenizer: tokenizers.Tokenizer, template: str | None) -> str:
    """Hash of what decides token ids and rendering: model (vocab+merges), normalizer,
    pre-tokenizer, decoder, added tokens and the chat template.

    The post-processor, padding and truncation are left out: Turnstile never lets the tokenizer
    add special tokens, so two loads that differ only there produce identical records.
    """
    h = hashlib.sha256()
    for component in (tokenizer.model, tokenizer.normalizer, tokenizer.pre_tokenizer):
        h.update(component.__getstate__() if component is not None else b"null")
        h.update(b"\0")
    h.update(tokenizer.decoder.__getstate__() if tokenizer.decoder is not None else b"null")
    h.update(b"\0")
    added = sorted(tokenizer.get_added_tokens_decoder().items())
    h.update(json.dumps([(i, t.content, bool(t.special)) for i, t in added]).encode())
    h.update(b"\0")
    h.update((template or "").encode("utf-8"))
    return h.hexdigest()[:16]


def eog_ids(
    tokenizer: tokenizers.Tokenizer, eos_id: int | None, extra: Iterable[int | None]
) -> frozenset[int]:
    """EOS, explicit extra ids and every added token whose text is an end-of-turn marker
    (declared on the model families' records)."""
    ids = {i for i in (eos_id, *extra) if i is not None}
    ends = end_markers()
    for token_id, token in tokenizer.get_added_tokens_decoder().items():
        if token.content in ends:
            ids.add(token_id)
    return frozenset(ids)
