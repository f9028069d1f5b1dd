"""Chat dialects: how one engine's ``/v1/chat/completions`` is asked for the token IDs it
rendered and sampled, where they come back, and how they are taken out of the response again so
the harness sees the engine's own answer.

- vLLM: ``return_token_ids`` (``prompt_token_ids`` on the response, or on the first chunk
  when streaming; per-choice ``token_ids``, delta IDs per chunk), ``return_weight_versions``
  (0.33+) and ``logprobs``.
- SGLang: ``return_input_ids_in_sglext`` / ``return_output_ids_in_sglext`` (``sglext`` on the
  response, or on a final ``choices: []`` chunk) and ``logprobs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .http import version_tuple


class ReportedChoice(Protocol):
    ids: list[int] | None


class Reported(Protocol):
    """What a dialect reads the engine's token IDs into (``capture.Capture``)."""

    prompt_ids: list[int] | None
    weight_version: object
    weight_versions: list[dict] | None

    def choice(self, index: int) -> ReportedChoice: ...


_EMPTY: tuple[object, ...] = (None, "", [], {})


@dataclass
class Asked:
    """What the harness itself asked the engine for (kept in the response)."""

    prompt_ids: bool
    output_ids: bool
    logprobs: bool
    weight_versions: bool


# The body fields that shape sampling: a capture record keeps them (``info.sampling``).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "stop_token_ids",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "logprobs",
    "top_logprobs",
    "tool_choice",
    "response_format",
    "ignore_eos",
    "min_tokens",
)


class ChatDialect(Protocol):
    """How one engine's Chat Completions route is asked for token IDs and gives them back."""

    name: str
    needs: str  # what the engine must support, for errors
    stop_key: str  # the choice field naming what stopped it (a token ID or a string)
    stop_unscored: bool  # a sampled stop token comes without a logprob entry
    prompt_ids_first: bool  # a stream's first chunk carries the prompt IDs
    detokenize_path: str

    def request(self, raw: dict, version: str | None) -> tuple[dict, Asked]:
        """The fields to add to the harness's body, and what the harness asked for itself."""
        ...

    def read_ids(self, cap: Reported, obj: dict, stream: bool) -> None:
        """Take the prompt and completion IDs out of a response (or one stream chunk)."""
        ...

    def strip_ids(self, obj: dict, asked: Asked, stream: bool) -> bool:
        """Take the added ID fields out of a response or chunk (not its choices); True when
        they were all it carried."""
        ...

    def strip_choice_ids(self, ch: dict, asked: Asked) -> None: ...


class VLLMChat:
    name = "vllm"
    needs = "return_token_ids (vLLM 0.10 or later)"
    stop_key = "stop_reason"
    stop_unscored = False
    prompt_ids_first = True
    detokenize_path = "/detokenize"

    def request(self, raw: dict, version: str | None) -> tuple[dict, Asked]:
        ids = bool(raw.get("return_token_ids"))
        asked = Asked(ids, ids, bool(raw.get("logprobs")), bool(raw.get("return_weight_versions")))
        add = {"return_token_ids": True, "logprobs": True}
        v = version_tuple(version)
        if v is not None and v >= (0, 33):  # older servers ignore it, stricter ones refuse
            add["return_weight_versions"] = True
        return add, asked

    def read_ids(self, cap: Reported, obj: dict, stream: bool) -> None:
        if not stream or obj.get("prompt_token_ids") is not None:
            cap.prompt_ids = obj.get("prompt_token_ids")
        for ch in obj.get("choices") or ():
            c = cap.choice(int(ch.get("index", 0)))
            if not stream:
                c.ids = ch.get("token_ids")
            elif ch.get("token_ids"):
                c.ids = (c.ids or []) + list(ch["token_ids"])

    def strip_ids(self, obj: dict, asked: Asked, stream: bool) -> bool:
        if not asked.prompt_ids:
            # 0.32 writes the first chunk's prompt_token_ids (and prompt_text) null when not
            # asked; earlier versions leave the key out (the fake's older shapes)
            if stream and "prompt_text" not in obj:
                obj.pop("prompt_token_ids", None)
            elif "prompt_token_ids" in obj:
                obj["prompt_token_ids"] = None
        return False

    def strip_choice_ids(self, ch: dict, asked: Asked) -> None:
        if not asked.output_ids and "token_ids" in ch:
            ch["token_ids"] = None


class SGLangChat:
    name = "sglang"
    needs = "return_input_ids_in_sglext / return_output_ids_in_sglext (a recent SGLang)"
    stop_key = "matched_stop"
    stop_unscored = True  # a token's logprob streams with that step's text; a stop has none
    prompt_ids_first = False  # they come on the last chunk
    detokenize_path = "/v1/detokenize"

    def request(self, raw: dict, version: str | None) -> tuple[dict, Asked]:
        asked = Asked(
            bool(raw.get("return_input_ids_in_sglext")),
            bool(raw.get("return_output_ids_in_sglext")),
            bool(raw.get("logprobs")),
            True,
        )
        return {
            "return_input_ids_in_sglext": True,
            "return_output_ids_in_sglext": True,
            "logprobs": True,
        }, asked

    def read_ids(self, cap: Reported, obj: dict, stream: bool) -> None:
        ext = obj.get("sglext")
        if not stream:
            ext = ext or {}
            cap.prompt_ids = ext.get("input_ids")
            meta = obj.get("metadata") or {}
            cap.weight_version = meta.get("weight_version")
            cap.weight_versions = meta.get("weight_versions") or None
        elif not isinstance(ext, dict):
            return
        elif ext.get("input_ids") is not None:
            cap.prompt_ids = ext["input_ids"]
        for i, ids in enumerate(ext.get("output_ids") or ()):
            cap.choice(i).ids = ids

    def strip_ids(self, obj: dict, asked: Asked, stream: bool) -> bool:
        ext = obj.get("sglext")
        if not isinstance(ext, dict):
            return False
        if not asked.prompt_ids:
            ext.pop("input_ids", None)
        if not asked.output_ids:
            ext.pop("output_ids", None)
        if all(v in _EMPTY for v in ext.values()):
            obj["sglext"] = None
            return True
        return False

    def strip_choice_ids(self, ch: dict, asked: Asked) -> None:
        pass  # the IDs are in sglext


def _strip_choice(ch: dict, asked: Asked, dialect: ChatDialect, stream: bool) -> None:
    dialect.strip_choice_ids(ch, asked)
    if not asked.logprobs and "logprobs" in ch:
        ch["logprobs"] = None
    if not asked.weight_versions and "weight_versions" in ch:
        if stream:
            del ch["weight_versions"]  # only the final chunk carries it, when asked
        else:
            ch["weight_versions"] = None


def strip_response(resp: dict, asked: Asked, dialect: ChatDialect) -> dict:
    """The engine's response as it would be without Turnstile's additions (fields the engine
    always writes become null again, as they are when not requested)."""
    dialect.strip_ids(resp, asked, stream=False)
    for ch in resp.get("choices") or ():
        _strip_choice(ch, asked, dialect, stream=False)
    return resp


def strip_chunk(chunk: dict, asked: Asked, dialect: ChatDialect) -> dict | None:
    """A stream chunk without Turnstile's additions, or None for a chunk the engine sent only
    because of them (the ID chunk; a token chunk whose text is empty)."""
    only_ids = dialect.strip_ids(chunk, asked, stream=True)
    choices = chunk.get("choices")
    if not choices:
        return None if only_ids and not chunk.get("usage") else chunk
    for ch in choices:
        _strip_choice(ch, asked, dialect, stream=True)
    if not asked.output_ids and not asked.logprobs:
        kept = [
            ch
            for ch in choices
            if ch.get("finish_reason") is not None
            or any(v not in _EMPTY for v in (ch.get("delta") or {}).values())
        ]
        if not kept and not chunk.get("usage"):
            return None
        chunk["choices"] = kept
    return chunk
