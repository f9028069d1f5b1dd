"""Load a tokenizer and its chat template without PyTorch.

Turnstile renders prompts and counts tokens itself, so it needs the *exact* tokenizer the engine
uses. Three sources are supported:

- a Hugging Face model directory (``tokenizer.json`` + ``tokenizer_config.json``);
- a hub repo id that is already in the local Hugging Face cache (never fetched from the network);
- a GGUF file (vocab-only or a full model), which is what llama.cpp tokenizes with.

For GGUF, transformers' own GGUF reader imports torch, so the metadata is read here with the
``gguf`` package and handed to transformers' ``convert_gguf_tokenizer``. A few llama.cpp
conventions that transformers' mapping does not reproduce are corrected afterwards (see
``_PRE_TOKENIZER_FIXES``, ``_IGNORE_MERGES_PRE`` and ``_repair_added_tokens``); each
correction is checked against llama.cpp's tokenizer test vectors in ``tests/test_tokenizers.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from gguf import GGUFReader, GGUFValueType, TokenType
from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

__all__ = ["END_OF_TURN_MARKERS", "LoadedTokenizer", "load_tokenizer"]

# Token texts that end a turn in the chat formats we know of. A control token with one of these
# texts stops generation even when the file only names a different token as EOS (Qwen's
# `<|endoftext|>` vs `<|im_end|>`, Llama 3's `<|eot_id|>` vs `<|end_of_text|>`, ...).
END_OF_TURN_MARKERS: frozenset[str] = frozenset(
    {
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<turn|>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek
    }
)

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


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

    def encode(self, text: str) -> list[int]:
        """Token ids for already-rendered text: no BOS/EOS added, special tokens in text parsed.

        This matches how vLLM/SGLang encode a prompt rendered from a chat template.
        """
        # The batch "fast" path skips offset tracking (about a fifth of the time); same IDs.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text for ``ids`` (special tokens kept unless asked otherwise)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        """The vocabulary entry for ``token_id`` (e.g. ``Ġhello`` for byte-level BPE), or None."""
        return self.tokenizer.id_to_token(token_id)


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
        if not _is_gguf_file(path):
            raise ValueError(
                f"cannot load a tokenizer from {model!r}: it is a file but not a GGUF file "
                "(pass a .gguf file, a Hugging Face model directory or a cached hub repo id)"
            )
        loaded = _load_gguf(path, source=model)
    elif path.is_dir():
        loaded = _load_directory(path, source=model)
    else:
        tried.append(f"no file or directory named {str(path)!r}")
        snapshot = _find_hub_snapshot(model, tried)
        if snapshot is None:
            raise ValueError(f"cannot load a tokenizer for {model!r}; tried: " + "; ".join(tried))
        loaded = _load_directory(snapshot, source=model)
    if template_override is not None:
        loaded = _with_template(loaded, template_override)
    return loaded


# --------------------------------------------------------------------------------------------
# Shared helpers


def _read_template_override(chat_template: str) -> str:
    """The Jinja source for an override given as a file path or as source text."""
    candidate = Path(os.path.expanduser(chat_template)) if "\n" not in chat_template else None
    if candidate is not None and candidate.is_file():
        text = candidate.read_text(encoding="utf-8")
        if candidate.suffix == ".json":  # a tokenizer_config.json-style file
            value = json.loads(text).get("chat_template")
            if isinstance(value, list):
                value = _pick_named_template({t["name"]: t["template"] for t in value})
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


def _pick_named_template(templates: Mapping[str, str]) -> str | None:
    """The template to render chats with when a model ships several (HF's rule: 'default')."""
    if "default" in templates:
        return templates["default"]
    return next(iter(templates.values()), None)


def _with_template(loaded: LoadedTokenizer, template: str) -> LoadedTokenizer:
    """``loaded`` with another chat template (and the fingerprint that goes with it)."""
    fingerprint = _fingerprint(loaded.tokenizer, template)
    return replace(loaded, chat_template=template, fingerprint=fingerprint)


def _fingerprint(tokenizer: tokenizers.Tokenizer, template: str | None) -> str:
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


def _eog_ids(
    tokenizer: tokenizers.Tokenizer, eos_id: int | None, extra: Iterable[int | None]
) -> frozenset[int]:
    """EOS, explicit extra ids and every added token whose text is an end-of-turn marker."""
    ids = {i for i in (eos_id, *extra) if i is not None}
    for token_id, token in tokenizer.get_added_tokens_decoder().items():
        if token.content in END_OF_TURN_MARKERS:
            ids.add(token_id)
    return frozenset(ids)


def _is_gguf_file(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


# --------------------------------------------------------------------------------------------
# Hugging Face directories and the hub cache

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _load_directory(directory: Path, source: str) -> LoadedTokenizer:
    """A model directory: the HF tokenizer files, or else the (first) GGUF file in it."""
    if any((directory / name).is_file() for name in _HF_TOKENIZER_FILES):
        return _load_hf(directory, source)
    ggufs = sorted(p for p in directory.glob("*.gguf") if p.is_file())
    if ggufs:
        # All quantizations and all shards' first part carry the same tokenizer metadata.
        first = [p for p in ggufs if "-00001-of-" in p.name] or ggufs
        return _load_gguf(first[0], source=source)
    raise ValueError(
        f"cannot load a tokenizer from directory {str(directory)!r}: it has none of "
        f"{', '.join(_HF_TOKENIZER_FILES)} and no .gguf file"
    )


def _find_hub_snapshot(repo_id: str, tried: list[str]) -> Path | None:
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
        template = _pick_named_template(template)

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
        eog_token_ids=_eog_ids(backend, eos_id, _generation_config_eos(directory)),
        special_tokens=special_tokens,
        source=source,
        fingerprint=_fingerprint(backend, template),
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


# --------------------------------------------------------------------------------------------
# GGUF


class _TokenizerMetadataReader(GGUFReader):
    """``GGUFReader`` that reads only the key/value metadata, and reads arrays in bulk.

    The stock reader makes two numpy views per array element and parses the tensor table, which
    takes ~10 s for a 150k-token vocabulary. Here a numeric array is one view, a string array is
    one byte view of its whole payload (``parts[-1]``, decoded by ``_string_array``), and tensors
    are skipped.
    """

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list[int], list]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_item_type = self._get(orig_offs, np.uint32)
        count_part = self._get(orig_offs + 4, np.uint64)
        item_type = GGUFValueType(int(raw_item_type[0]))
        count = int(count_part[0])
        start = orig_offs + 12
        types = [GGUFValueType.ARRAY, item_type]
        scalar = self.gguf_scalar_to_np.get(item_type)
        if scalar is not None:
            values = self._get(start, scalar, count)
            return 12 + int(values.nbytes), [raw_item_type, count_part, values], [2], types
        if item_type != GGUFValueType.STRING:
            raise ValueError(f"nested GGUF arrays are not supported (at offset {orig_offs})")
        length = struct.Struct(self._uint64_format())
        buffer = memoryview(self.data)
        end = start
        for _ in range(count):
            end += 8 + length.unpack_from(buffer, end)[0]
        # `data` is empty so that `ReaderField.contents()` cannot misread the packed payload.
        return end - orig_offs, [raw_item_type, count_part, self.data[start:end]], [], types

    def _build_tensor_info(self, offs: int, count: int) -> tuple[int, list]:
        return offs, []  # tensors are irrelevant for the tokenizer (and may use unknown types)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        self.tensors = []

    def _uint64_format(self) -> str:
        host_little = sys.byteorder == "little"
        little = host_little if self.byte_order == "I" else not host_little
        return "<Q" if little else ">Q"

    def value(self, key: str) -> Any:
        """A metadata value as plain Python (str, int, float, bool or list), or None."""
        field = self.fields.get(key)
        if field is None:
            return None
        if field.types[0] != GGUFValueType.ARRAY:
            return field.contents()
        if field.types[-1] == GGUFValueType.STRING:
            return self._string_array(field.parts[-1], int(field.parts[-2][0]), key)
        return field.parts[-1].tolist()

    def _string_array(self, payload: np.ndarray, count: int, key: str) -> list[str]:
        raw = payload.tobytes()
        length = struct.Struct(self._uint64_format())
        out: list[str] = []
        pos = 0
        for index in range(count):
            (size,) = length.unpack_from(raw, pos)
            pos += 8
            try:
                out.append(raw[pos : pos + size].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{key}[{index}] is not valid UTF-8: {exc}") from exc
            pos += size
        return out


def _read_gguf_tokenizer_metadata(path: Path) -> tuple[str, dict[str, Any]]:
    """``(architecture, {tokenizer.* key: value})`` from a GGUF file."""
    try:
        reader = _TokenizerMetadataReader(path)
    except Exception as exc:  # the reader raises several types
        raise ValueError(f"cannot read GGUF metadata from {str(path)!r}: {exc}") from exc
    architecture = reader.value("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError(f"{str(path)!r} has no general.architecture key; is it a model GGUF?")
    metadata = {key: reader.value(key) for key in reader.fields if key.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in metadata:
        raise ValueError(f"{str(path)!r} has no tokenizer (no tokenizer.ggml.tokens key)")
    return architecture, metadata


def _gguf_tokenizer_dict(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The dict ``convert_gguf_tokenizer`` expects, named as in transformers' mapping."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    return {
        name: metadata[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if metadata.get(f"tokenizer.{key}") is not None
    }


def _load_gguf(path: Path, source: str) -> LoadedTokenizer:
    architecture, metadata = _read_gguf_tokenizer_metadata(path)
    tokenizer_dict = _gguf_tokenizer_dict(metadata)
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
    default_bos, default_eos = _default_add_special(
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

    eog = set(_eog_ids(backend, eos_id, (token_id("eot_token_id"), token_id("eom_token_id"))))
    for i, (text, kind) in enumerate(zip(tokens, token_types, strict=False)):
        if kind == TokenType.CONTROL and text in END_OF_TURN_MARKERS:
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
        fingerprint=_fingerprint(backend, template),
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


# ---- corrections to transformers' GGUF mapping, all verified against llama.cpp's test vectors

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


def _default_add_special(tokenizer_type: str | None, pre: str | None) -> tuple[bool, bool]:
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
    model: models.Model, vocab: dict[str, int], tokenizer_dict: Mapping[str, Any]
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
