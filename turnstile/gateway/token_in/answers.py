"""What the token-in gateway makes of a call's text before it becomes the answer
(``turnstile.answer``): the stop string cut, the finish reason, stop strings held back in a
stream, and the sampled tokens' logprob entries. Each dialect renders the answer itself."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...chat.tokenizer import LoadedTokenizer
from ...engines.base import Finish
from ...parsing.markers import partial_marker_len


def cut_stop(text: str, finish: Finish | None) -> str:
    """The text a harness gets: OpenAI leaves a matched stop string (and anything the last
    token carried after it) out. The record keeps every sampled ID."""
    stop = finish.stop_string if finish else None
    if stop:
        i = text.find(stop)
        if i >= 0:
            return text[:i]
    return text


def finish_reason(tool_calls: bool, finish: Finish) -> str:
    """As OpenAI and vLLM: a reply cut by the token limit is "length" even when it holds a
    (then truncated) tool call; "tool_calls" only for calls the model finished."""
    if finish.reason == "length":
        return "length"
    return "tool_calls" if tool_calls else finish.reason


class StopStrings:
    """What of a stream's text may leave yet: text that could be the start of a stop string is
    held until the next tokens tell; once a stop string is seen, nothing after it leaves."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def visible(self, text: str, last: bool = False) -> str:
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        self.held += text
        at = min([i for x in self.stops if (i := self.held.find(x)) >= 0], default=-1)
        if at >= 0:
            out, self.held, self.stopped = self.held[:at], "", True
            return out
        keep = 0 if last else partial_marker_len(self.held, self.stops)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out


def logprob_entry(tok: LoadedTokenizer, tid: int, logprob: float, top: Sequence) -> dict:
    text = tok.decode([tid])
    return {
        "token": text,
        "logprob": logprob,
        "bytes": list(text.encode()),
        "top_logprobs": [
            {"token": (t := tok.decode([i])), "logprob": lp, "bytes": list(t.encode())}
            for i, lp in top
        ],
    }


def logprobs(
    tok: LoadedTokenizer, ids: Sequence[int], lps: Sequence[float], tops: Iterable[Sequence]
) -> dict:
    """The response's ``logprobs`` (end-of-turn tokens are not content)."""
    return {
        "content": [
            logprob_entry(tok, t, lp, top)
            for t, lp, top in zip(ids, lps, tops, strict=False)
            if t not in tok.eog_token_ids
        ],
        "refusal": None,
    }
