"""Images on vLLM's token-in route (``/inference/v1/generate``, 0.32): what is sent and what
the answer must echo.

vLLM expands every image placeholder it is sent and cannot tell an already expanded block
(sent expanded, the block is expanded again, silently: 26 IDs instead of 20 on the tiny
Idefics3, a 200). So the prompt goes out collapsed, one placeholder per image, with
``content_parts`` beside it (the image as a data URL, its ``uuid`` the sha256 of its bytes:
vLLM trusts a uuid as the key of its feature cache, so only the content's hash is safe), and
``return_token_ids`` asks for the expanded prompt and ``mm_placeholders`` back. The echo must
equal the expansion Turnstile recorded from the model's own processor, every call: a
mismatch is an error, never a silent fallback.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from ..media import MediaPrompt
from .base import EngineError


def content_parts(prompt: MediaPrompt) -> list[dict]:
    """One ``image_url`` part per image, in the prompt's order."""
    parts = []
    for m in prompt.media:
        image = prompt.images.get(m.sha256)
        if image is None:
            raise EngineError(f"the bytes of image {m.sha256[:16]} are not at hand", 500)
        url = f"data:{image.mime};base64," + base64.b64encode(image.data).decode()
        parts.append({"type": "image_url", "url": url, "uuid": m.sha256})
    return parts


def check_echo(prompt: MediaPrompt, echoed: Sequence[int] | None, spans: object) -> None:
    """vLLM's expanded prompt IDs and image spans against the recorded expansion."""
    if echoed is None:
        raise EngineError(
            "vLLM did not echo the expanded prompt (prompt_token_ids) of a call with images; "
            "the recorded expansion cannot be checked",
            502,
        )
    ours = prompt.ids.tolist()
    if list(echoed) != ours:
        at = next((i for i, (a, b) in enumerate(zip(echoed, ours, strict=False)) if a != b), None)
        at = min(len(echoed), len(ours)) if at is None else at
        raise EngineError(
            f"vLLM expanded the images to {len(echoed)} prompt IDs, the model's processor "
            f"to {len(ours)}; they differ from position {at} "
            f"(vLLM {list(echoed[at : at + 8])}, expected {ours[at : at + 8]})",
            502,
        )
    got = (spans or {}).get("image") if isinstance(spans, dict) else None
    want = [{"offset": m.offset, "length": m.length} for m in prompt.media]
    have = [{"offset": s.get("offset"), "length": s.get("length")} for s in got or ()]
    if have != want:
        raise EngineError(f"vLLM placed the images at {have}; the recorded spans are {want}", 502)
