"""Read a GGUF file's tokenizer metadata fast, without torch and without the tensor table."""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


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
        buffer = self.data.data  # the memmap's bytes, as a memoryview (no copy)
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


def read_gguf_tokenizer_metadata(path: Path) -> tuple[str, dict[str, Any]]:
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


def gguf_tokenizer_dict(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The dict ``convert_gguf_tokenizer`` expects, named as in transformers' mapping."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    return {
        name: metadata[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if metadata.get(f"tokenizer.{key}") is not None
    }
