"""Load a tokenizer from a GGUF file (vocab-only or a full model), as llama.cpp tokenizes.

transformers' own GGUF reader imports torch, so the metadata is read by ``gguf_metadata`` and
handed to transformers' ``convert_gguf_tokenizer``; ``llama_cpp_fixes`` then corrects what that
mapping does not reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tokenizers
from gguf import TokenType
from tokenizers import processors

from ..families import end_markers
from .gguf_metadata import gguf_tokenizer_dict, read_gguf_tokenizer_metadata
from .llama_cpp_fixes import apply_llama_cpp_conventions, default_add_special
from .loaded_tokenizer import LoadedTokenizer, eog_ids, fingerprint_of


def is_gguf_file(path: Path) -> bool:
    """By name, else by the magic bytes (a GGUF saved without the suffix)."""
    if path.suffix.lower() == ".gguf":
        return True
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def load_gguf(path: Path, source: str) -> LoadedTokenizer:
    """The file's embedded ``tokenizer.json`` when it has one, else one built from its vocab."""
    architecture, metadata = read_gguf_tokenizer_metadata(path)
    tokenizer_dict = gguf_tokenizer_dict(metadata)
    tokens: list[str] = tokenizer_dict["tokens"]
    token_types: list[int] = tokenizer_dict.get("token_type") or []

    hf_json = metadata.get("tokenizer.huggingface.json")
    if isinstance(hf_json, str):  # the original tokenizer.json, embedded verbatim: exact
        backend = tokenizers.Tokenizer.from_str(hf_json)
    else:
        backend = _build_gguf_backend(architecture, tokenizer_dict, path)

    def token_id(key: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        return value if isinstance(value, int) and 0 <= value < len(tokens) else None

    bos_id, eos_id = token_id("bos_token_id"), token_id("eos_token_id")
    special_ids = {
        "bos_token": bos_id,
        "eos_token": eos_id,
        "unk_token": token_id("unknown_token_id"),
        "pad_token": token_id("padding_token_id"),
    }
    special_tokens = {
        name: _gguf_token_text(backend, tokens, i)
        for name, i in special_ids.items()
        if i is not None
    }
    default_bos, default_eos = default_add_special(
        tokenizer_dict.get("tokenizer_type"), tokenizer_dict.get("pre_tokenizer_type")
    )
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = default_bos
    add_eos = metadata.get("tokenizer.ggml.add_eos_token")
    if not isinstance(add_eos, bool):
        add_eos = default_eos
    if not isinstance(hf_json, str):
        _add_special_post_processor(
            backend,
            special_tokens.get("bos_token") if add_bos else None,
            special_tokens.get("eos_token") if add_eos else None,
        )
    template = metadata.get("tokenizer.chat_template")
    if not isinstance(template, str):
        template = None

    eog = set(eog_ids(backend, eos_id, (token_id("eot_token_id"), token_id("eom_token_id"))))
    ends = end_markers()
    for i, (text, kind) in enumerate(zip(tokens, token_types, strict=False)):
        if kind == TokenType.CONTROL and text in ends:
            eog.add(i)

    return LoadedTokenizer(
        tokenizer=backend,
        chat_template=template,
        bos_token=special_tokens.get("bos_token"),
        eos_token=special_tokens.get("eos_token"),
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        add_bos=add_bos,
        eog_token_ids=frozenset(eog),
        special_tokens=special_tokens,
        source=source,
        fingerprint=fingerprint_of(backend, template),
    )


def _add_special_post_processor(
    backend: tokenizers.Tokenizer, bos: str | None, eos: str | None
) -> None:
    """Make ``backend.encode(text)`` (special tokens on) add BOS/EOS as the model expects.

    Turnstile itself always encodes with ``add_special_tokens=False``; this only keeps a plain
    ``encode`` on the GGUF-built tokenizer consistent with the same model's HF ``tokenizer.json``.
    """
    if bos is None and eos is None:
        return
    ids = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
    if (bos is not None and bos not in ids) or (eos is not None and eos not in ids):
        return  # not an added token: TemplateProcessing could not name it
    single = [*([bos] if bos else []), "$A", *([eos] if eos else [])]
    pair = [*single, *([bos] if bos else []), "$B:1", *([eos] if eos else [])]
    backend.post_processor = processors.TemplateProcessing(
        single=single,
        pair=pair,
        special_tokens=[(t, ids[t]) for t in dict.fromkeys(x for x in (bos, eos) if x)],
    )


def _gguf_token_text(backend: tokenizers.Tokenizer, tokens: list[str], token_id: int) -> str:
    """A special token's text as it appears in rendered prompts (the added token's content)."""
    added = backend.get_added_tokens_decoder().get(token_id)
    return added.content if added is not None else tokens[token_id]


def _build_gguf_backend(
    architecture: str, tokenizer_dict: dict[str, Any], path: Path
) -> tokenizers.Tokenizer:
    """transformers' GGUF conversion, then the llama.cpp conventions it does not reproduce."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    try:
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except Exception as exc:  # name the file and what it declared
        raise ValueError(
            f"cannot build a tokenizer from {str(path)!r} (architecture {architecture!r}, "
            f"tokenizer.ggml.model {tokenizer_dict.get('tokenizer_type')!r}, "
            f"tokenizer.ggml.pre {tokenizer_dict.get('pre_tokenizer_type')!r}): {exc}"
        ) from exc
    return apply_llama_cpp_conventions(backend, architecture, tokenizer_dict)
