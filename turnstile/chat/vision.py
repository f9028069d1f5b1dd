"""Images → their tokens, as the model's own processor writes them (issue 43).

The chat template renders one placeholder per image (Idefics3/SmolVLM: ``<image>``); the
model's processor (transformers', loaded from the model's directory: its image processor's
arguments are the model's) replaces it with the image's whole block, whose length depends on
the image (its grid of crops). Turnstile expands the rendered IDs itself with that processor,
records the expanded IDs, and holds the engine's own expansion to them on every call.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..media import Image, MediaError, MediaItem, MediaPrompt

# processor arguments worth recording (the rest are defaults of the class)
_ARGS = (
    "do_image_splitting",
    "max_image_size",
    "size",
    "image_seq_len",
    "do_resize",
    "resample",
    "do_pad",
)


@dataclass(frozen=True)
class Expansion:
    """One image's block of token IDs and how the processor cut it."""

    ids: tuple[int, ...]
    grid: tuple[int, ...]


def image_expander(model: str | Path) -> ImageExpander | None:
    """The model's image processor when its directory declares one (a processor or
    preprocessor config beside the tokenizer); None for a text model or a GGUF file."""
    path = Path(model)
    names = ("processor_config.json", "preprocessor_config.json")
    if path.is_dir() and any((path / n).exists() for n in names):
        return ImageExpander(path)
    return None


class ImageExpander:
    """The model's processor, loaded once from ``model_dir`` (a Hugging Face directory with
    a processor config); thread-safe (one lock around transformers' call)."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = str(model_dir)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._cache: dict[tuple[str, str], Expansion] = {}

    def _processor(self) -> Any:
        if self._proc is None:
            try:
                from transformers import AutoProcessor
            except ImportError as exc:  # pragma: no cover - pinned with the package
                raise MediaError(f"images need transformers' processors: {exc}") from None
            try:
                self._proc = AutoProcessor.from_pretrained(self.model_dir)
            except Exception as exc:
                raise MediaError(
                    f"the model at {self.model_dir} has no image processor ({exc})"[:300]
                ) from None
            if getattr(self._proc, "image_token", None) is None:
                raise MediaError(f"the model at {self.model_dir} takes no images")
        return self._proc

    @property
    def placeholder(self) -> str:
        return str(self._processor().image_token)

    @property
    def placeholder_id(self) -> int:
        proc = self._processor()
        return int(proc.tokenizer.convert_tokens_to_ids(proc.image_token))

    def processor_info(self) -> dict[str, Any]:
        """The processor's name, transformers' version and the arguments that decide the
        expansion: what the record keeps beside each image."""
        import transformers

        proc = self._processor()
        img = proc.image_processor.to_dict()
        args = {k: img[k] for k in _ARGS if k in img}
        if hasattr(proc, "image_seq_len"):
            args["image_seq_len"] = proc.image_seq_len
        return {
            "name": type(proc).__name__,
            "image_processor": type(proc.image_processor).__name__,
            "version": transformers.__version__,
            "args": args,
        }

    def expand_one(self, image: Image) -> Expansion:
        """The block of token IDs the processor puts in place of one placeholder."""
        key = (image.sha256, image.mime)
        if key in self._cache:
            return self._cache[key]
        import io

        from PIL import Image as PILImage

        with self._lock:
            proc = self._processor()
            with PILImage.open(io.BytesIO(image.data)) as pil:
                pil.load()
                out = proc(
                    text=proc.image_token,
                    images=[[pil.convert("RGB")]],
                    add_special_tokens=False,
                    return_tensors="np",
                )
        ids = tuple(int(t) for t in out["input_ids"][0])
        pixels = out.get("pixel_values")
        grid = tuple(int(d) for d in pixels.shape[1:]) if pixels is not None else ()
        exp = Expansion(ids, grid)
        if len(self._cache) < 1024:
            self._cache[key] = exp
        return exp

    def expand(self, rendered: Sequence[int], images: Sequence[Image]) -> MediaPrompt:
        """``rendered`` (one placeholder per image, in the images' order) with each
        placeholder replaced by its image's block (:func:`turnstile.media.join` puts it
        after a reused prefix)."""
        ph = self.placeholder_id
        at = [i for i, t in enumerate(rendered) if t == ph]
        if len(at) != len(images):
            raise MediaError(
                f"the chat template rendered {len(at)} image placeholders for {len(images)} images"
            )
        info = self.processor_info() if images else {}
        ids = array("i")
        items: list[MediaItem] = []
        prev = 0
        for pos, image in zip(at, images, strict=True):
            ids.extend(rendered[prev:pos])
            exp = self.expand_one(image)
            items.append(
                MediaItem(image.sha256, image.mime, len(ids), len(exp.ids), info, exp.grid)
            )
            ids.extend(exp.ids)
            prev = pos + 1
        ids.extend(rendered[prev:])
        return MediaPrompt(ids, tuple(items), {i.sha256: i for i in images}, ph)
