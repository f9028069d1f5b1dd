"""A held call's chunks: what is sent to go on from prompt + the tokens sampled so far, and
what is recorded of each chunk (``info["chunks"]``), so a call preempted by weight updates
(``POST /admin/pause {"mode": "hold"}``) is still one call whose every token is recorded
once, with the version that sampled it.

What changes across the seam is handled here, and said in the record (``info["hold"]``):

- presence/frequency penalties count the completion's tokens only; the resubmitted tokens
  move into the prompt, so their penalties are carried as ``logit_bias`` (both are added to
  the logits before the temperature: vLLM, SGLang, OpenAI);
- a seed restarts: each chunk is sent the call's seed;
- a stop string may straddle the seam: the engine sees only the new chunk's text, so the
  joined text is checked here and the call cut where the engine would have cut it;
- a grammar (a forced tool call, a JSON schema) would restart at the prompt's end: such a
  call goes on only from no sampled token, else it is aborted with that reason.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...engines.base import Finish, SamplingParams

BIAS_LIMIT = 100.0  # what OpenAI and vLLM accept for one token's logit_bias


@dataclass
class Chunk:
    """One engine request of a call: completion tokens ``[start, end)``."""

    start: int
    prompt_tokens: int
    sampling: dict
    version: str | None  # the policy version when it was sent
    end: int = 0
    finish_reason: str = "preempted"
    engine_request_id: str | None = None
    cached_tokens: int | None = None
    spans: list[dict] | None = None  # the engine's own version spans, chunk-relative
    held_s: float | None = None  # how long the call was held after this chunk

    def as_info(self) -> dict:
        out: dict[str, object] = {
            "start": self.start,
            "end": self.end,
            "engine_request_id": self.engine_request_id,
            "finish_reason": self.finish_reason,
            "weight_version": self.version,
            "prompt_tokens": self.prompt_tokens,
            # the prompt the engine computed afresh (under the chunk's weights): all of it but
            # what its prefix cache held, when it said
            "recomputed_tokens": None
            if self.cached_tokens is None
            else self.prompt_tokens - self.cached_tokens,
            "sampling": self.sampling,
        }
        if self.held_s is not None:
            out["held_s"] = round(self.held_s, 3)
        return out


@dataclass
class Seams:
    """The chunks of one call, and the notes on what changed across their seams."""

    params: SamplingParams  # as the call asked
    chunks: list[Chunk] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    preemptions: int = 0

    def resumed(self, sampled: Sequence[int]) -> SamplingParams:
        """The sampling for a chunk that goes on after ``sampled``: ``max_tokens`` less what
        was sampled, the penalties of the sampled tokens carried as ``logit_bias``."""
        p = self.params
        out = dataclasses.replace(p, max_tokens=p.max_tokens - len(sampled))
        if (p.presence_penalty or p.frequency_penalty) and sampled:
            bias = dict(p.logit_bias)
            clamped = 0
            for tid, n in Counter(sampled).items():
                b = (
                    bias.get(tid, 0.0)
                    - (p.presence_penalty or 0.0)
                    - (p.frequency_penalty or 0.0) * n
                )
                if abs(b) > BIAS_LIMIT:
                    b, clamped = max(-BIAS_LIMIT, min(BIAS_LIMIT, b)), clamped + 1
                bias[tid] = b
            out.logit_bias = bias
            self.note(
                "presence/frequency penalties of the tokens sampled before a seam carried as "
                "logit_bias (they moved into the prompt, which the penalties do not count)"
                + (f"; {clamped} clamped to +-{BIAS_LIMIT:g}" if clamped else "")
            )
        if p.seed is not None:
            self.note("the seed restarts at each chunk (each is sent the call's seed)")
        return out

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def spans(self) -> list[dict]:
        """Weight-version spans over the whole completion, in ``Finish.weight_versions``'s
        format: the engine's own spans where it gave them, else the policy version when the
        chunk was sent (None where the trainer had declared none)."""
        out: list[dict] = []
        for c in self.chunks:
            if c.end <= c.start:
                continue
            parts = c.spans or [{"version": c.version, "start": 0, "end": c.end - c.start}]
            for s in parts:
                a, b = c.start + int(s["start"]), min(c.end, c.start + int(s["end"]))
                if b <= a:
                    continue
                if out and out[-1]["version"] == s["version"] and out[-1]["end"] == a:
                    out[-1]["end"] = b
                else:
                    out.append({"version": s["version"], "start": a, "end": b})
        return out

    def info(self) -> dict:
        return {
            "chunks": [c.as_info() for c in self.chunks],
            "hold": {"preemptions": self.preemptions, "notes": self.notes},
        }


def seam_stop(
    decode: Callable[[list[int]], str], ids: Sequence[int], seam: int, stops: Sequence[str]
) -> tuple[int, str] | None:
    """A stop string the engine could not see: one that begins before the seam (in tokens the
    engine was sent as prompt) and ends after it. Returns ``(k, stop)``: the first ``k``
    tokens hold it whole (where the engine would have stopped), or None."""
    before = decode(list(ids[:seam]))
    text = decode(list(ids))
    found: tuple[int, str] | None = None
    for stop in stops:
        i = text.find(stop, max(0, len(before) - len(stop) + 1))
        if 0 <= i < len(before) and (found is None or i < found[0]):
            found = (i, stop)
    if found is None:
        return None
    at, stop = found
    for k in range(seam + 1, len(ids) + 1):
        if decode(list(ids[:k])).find(stop, at) == at:
            return k, stop
    return len(ids), stop


def reaches_past(
    decode: Callable[[list[int]], str], ids: Sequence[int], seam: int, stops: Sequence[str]
) -> bool:
    """Whether the text after the seam is already longer than any stop string (none can
    straddle the seam any more)."""
    longest = max((len(s) for s in stops), default=0)
    return len(decode(list(ids[seam:]))) > longest


def finish_of(chunk: Chunk, finish: Finish) -> None:
    """What a chunk's own finish says, into the chunk."""
    chunk.finish_reason = finish.reason
    chunk.engine_request_id = finish.engine_request_id
    chunk.cached_tokens = finish.cached_tokens
    chunk.spans = finish.weight_versions
    if finish.weight_versions is None and finish.weight_version is not None:
        chunk.version = finish.weight_version
