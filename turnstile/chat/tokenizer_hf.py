"""Load a tokenizer from a Hugging Face model directory or the local hub cache (offline)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import tokenizers

from .loaded_tokenizer import LoadedTokenizer, eog_ids, fingerprint_of, pick_named_template
from .tokenizer_gguf import load_gguf

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_directory(directory: Path, source: str) -> LoadedTokenizer:
    """A model directory: the HF tokenizer files, or else the (first) GGUF file in it."""
    if any((directory / name).is_file() for name in _HF_TOKENIZER_FILES):
        return _load_hf(directory, source)
    ggufs = sorted(p for p in directory.glob("*.gguf") if p.is_file())
    if ggufs:
        # All quantizations and all shards' first part carry the same tokenizer metadata.
        first = [p for p in ggufs if "-00001-of-" in p.name] or ggufs
        return load_gguf(first[0], source=source)
    raise ValueError(
        f"cannot load a tokenizer from directory {str(directory)!r}: it has none of "
        f"{', '.join(_HF_TOKENIZER_FILES)} and no .gguf file"
    )


def find_hub_snapshot(repo_id: str, tried: list[str]) -> Path | None:
    """The local snapshot directory of a cached hub repo (offline), or None."""
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2 or not all(parts) or repo_id.endswith(".gguf"):
        tried.append(f"{repo_id!r} is not a hub repo id either")
        return None
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE

        cache_dir = os.environ.get("HF_HUB_CACHE") or HF_HUB_CACHE
        snapshot = snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)
    except Exception as exc:  # report whatever the hub client says
        where = os.environ.get("HF_HUB_CACHE") or "the default HF hub cache"
        tried.append(f"hub repo {repo_id!r} in {where} (offline): {type(exc).__name__}: {exc}")
        return None
    return Path(snapshot)


def _load_hf(directory: Path, source: str) -> LoadedTokenizer:
    """Load through ``AutoTokenizer`` so the result matches what vLLM/SGLang would use."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # any loader failure -> one clear error
        raise ValueError(
            f"cannot load a Hugging Face tokenizer from {str(directory)!r} "
            f"(AutoTokenizer.from_pretrained, local files only): {type(exc).__name__}: {exc}"
        ) from exc
    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, tokenizers.Tokenizer):
        raise ValueError(
            f"{str(directory)!r} loads as {type(hf).__name__}, which has no fast (Rust) tokenizer"
        )

    template = hf.chat_template
    if template is None:
        jinja = directory / "chat_template.jinja"
        template = jinja.read_text(encoding="utf-8") if jinja.is_file() else None
    if isinstance(template, dict):
        template = pick_named_template(template)

    special_tokens = {
        name: value
        for name in _SPECIAL_TOKEN_NAMES
        if isinstance(value := getattr(hf, name, None), str)
    }
    bos_token = special_tokens.get("bos_token")
    eos_token = special_tokens.get("eos_token")
    bos_id = backend.token_to_id(bos_token) if bos_token is not None else None
    eos_id = backend.token_to_id(eos_token) if eos_token is not None else None
    # Ask the tokenizer itself rather than trusting one config flag: the post-processor decides.
    with_special = hf.encode("a", add_special_tokens=True)
    add_bos = bos_id is not None and bool(with_special) and with_special[0] == bos_id

    return LoadedTokenizer(
        tokenizer=backend,
        chat_template=template,
        bos_token=bos_token,
        eos_token=eos_token,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        add_bos=add_bos,
        eog_token_ids=eog_ids(backend, eos_id, _generation_config_eos(directory)),
        special_tokens=special_tokens,
        source=source,
        fingerprint=fingerprint_of(backend, template),
    )


def _generation_config_eos(directory: Path) -> list[int]:
    """``eos_token_id`` from generation_config.json: instruct models list their stop ids there."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError):
        return []
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int)]
