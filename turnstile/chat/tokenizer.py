"""Load a tokenizer and its chat template without PyTorch.

Turnstile renders prompts and counts tokens itself, so it needs the *exact* tokenizer the engine
uses. Three sources are supported:

- a Hugging Face model directory (``tokenizer.json`` + ``tokenizer_config.json``);
- a hub repo id that is already in the local Hugging Face cache (never fetched from the network);
- a GGUF file (vocab-only or a full model), which is what llama.cpp tokenizes with.

For GGUF, transformers' own GGUF reader imports torch, so the metadata is read with the
``gguf`` package (``gguf_metadata``) and handed to transformers' ``convert_gguf_tokenizer``. A
few llama.cpp conventions that transformers' mapping does not reproduce are corrected afterwards
(see ``llama_cpp_fixes``); each correction is checked against llama.cpp's tokenizer test vectors
in ``tests/test_tokenizers.py``.

This module only decides which loader a ``model`` argument goes to; ``tokenizer_hf`` and
``tokenizer_gguf`` do the loading.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from .loaded_tokenizer import LoadedTokenizer, fingerprint_of, pick_named_template
from .tokenizer_gguf import is_gguf_file, load_gguf
from .tokenizer_hf import find_hub_snapshot, load_directory

__all__ = ["LoadedTokenizer", "load_tokenizer"]


def load_tokenizer(model: str, chat_template: str | None = None) -> LoadedTokenizer:
    """Load the tokenizer for ``model``.

    model: a ``.gguf`` path, a Hugging Face model directory, or a hub repo id found in the local
    Hugging Face cache (nothing is downloaded). chat_template: an override, either a path to a
    Jinja file or the Jinja source itself.
    """
    model = os.fspath(model)
    template_override = _read_template_override(chat_template) if chat_template else None
    path = Path(os.path.expanduser(model))
    tried: list[str] = []
    if path.is_file():
        if not is_gguf_file(path):
            raise ValueError(
                f"cannot load a tokenizer from {model!r}: it is a file but not a GGUF file "
                "(pass a .gguf file, a Hugging Face model directory or a cached hub repo id)"
            )
        loaded = load_gguf(path, source=model)
    elif path.is_dir():
        loaded = load_directory(path, source=model)
    else:
        tried.append(f"no file or directory named {str(path)!r}")
        snapshot = find_hub_snapshot(model, tried)
        if snapshot is None:
            raise ValueError(f"cannot load a tokenizer for {model!r}; tried: " + "; ".join(tried))
        loaded = load_directory(snapshot, source=model)
    if template_override is not None:
        loaded = _with_template(loaded, template_override)
    return loaded


def _read_template_override(chat_template: str) -> str:
    """The Jinja source for an override given as a file path or as source text."""
    candidate = Path(os.path.expanduser(chat_template)) if "\n" not in chat_template else None
    if candidate is not None and candidate.is_file():
        text = candidate.read_text(encoding="utf-8")
        if candidate.suffix == ".json":  # a tokenizer_config.json-style file
            value = json.loads(text).get("chat_template")
            if isinstance(value, list):
                value = pick_named_template({t["name"]: t["template"] for t in value})
            if not isinstance(value, str):
                raise ValueError(f"{chat_template!r} has no 'chat_template' string")
            return value
        return text
    if "{{" in chat_template or "{%" in chat_template:
        return chat_template
    raise ValueError(
        f"chat template {chat_template!r} is neither an existing file nor Jinja source "
        "(no '{{' or '{%' in it)"
    )


def _with_template(loaded: LoadedTokenizer, template: str) -> LoadedTokenizer:
    """``loaded`` with another chat template (and the fingerprint that goes with it)."""
    fingerprint = fingerprint_of(loaded.tokenizer, template)
    return replace(loaded, chat_template=template, fingerprint=fingerprint)
