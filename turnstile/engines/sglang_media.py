"""Images on SGLang's token-in route (``POST /generate``, 0.5.23): what is sent and what the
answer must echo (issue 43).

Read from the 0.5.23 wheel (``srt/multimodal/processors/base_processor.py``,
``srt/managers/tokenizer_manager.py``): with ``input_ids`` and ``image_data``, and
``SGLANG_MM_AVOID_RETOKENIZE`` on (its default), SGLang keeps the caller's IDs and expands the
i-th image placeholder into ``counts[i]`` copies of the placeholder
(``_expand_input_ids``, the counts from the processor's ``_get_num_multimodal_tokens``), but
only when the prompt holds exactly one placeholder per image; otherwise it logs a warning and
falls back to decoding the IDs to text and re-tokenizing them with the processor (the prompt
may drift). So the prompt goes out collapsed, one placeholder per image, the images as data
URLs in ``image_data`` (their ``mm_content_hashes`` the sha256 of their bytes: an identity
only, SGLang still keys its cache on the features it computes), with
``return_prompt_token_ids``: every answer (each stream event too) then carries the expanded
``prompt_token_ids``, which must equal the expansion Turnstile recorded from the model's own
processor. A mismatch (a fallback, or a family whose processor writes more than placeholders
around an image, as Idefics3's) is an error, never a silent fallback.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from ..media import MediaPrompt
from .base import EngineError
from .prompt_json import wire_ids


def image_fields(prompt: MediaPrompt) -> dict:
    """The ``/generate`` fields of a prompt with images (``input_ids`` collapsed)."""
    urls, hashes = [], []
    for m in prompt.media:
        image = prompt.images.get(m.sha256)
        if image is None:
            raise EngineError(f"the bytes of image {m.sha256[:16]} are not at hand", 500)
        urls.append(f"data:{image.mime};base64," + base64.b64encode(image.data).decode())
        hashes.append("sha256:" + m.sha256)
    return {
        "input_ids": wire_ids(prompt.collapsed()),
        "image_data": urls,
        "mm_content_hashes": hashes,
        "return_prompt_token_ids": True,
    }


def check_echo(prompt: MediaPrompt, echoed: Sequence[int] | None) -> None:
    """SGLang's expanded prompt IDs against the recorded expansion."""
    if echoed is None:
        raise EngineError(
            "SGLang did not echo the expanded prompt (prompt_token_ids) of a call with "
            "images; the recorded expansion cannot be checked",
            502,
        )
    ours = prompt.ids.tolist()
    got = [int(t) for t in echoed]
    if got != ours:
        at = next((i for i, (a, b) in enumerate(zip(got, ours, strict=False)) if a != b), None)
        at = min(len(got), len(ours)) if at is None else at
        raise EngineError(
            f"SGLang expanded the images to {len(got)} prompt IDs, the model's processor to "
            f"{len(ours)}; they differ from position {at} (SGLang {got[at : at + 8]}, "
            f"expected {ours[at : at + 8]}): SGLang repeats the placeholder per image, or "
            "fell back to re-tokenizing the text",
            502,
        )
