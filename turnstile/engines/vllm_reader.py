"""vLLM's answers read into events: response bodies or stream chunks of either route
(``/inference/v1/generate`` or ``/v1/completions``) into token events and one Finish."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import orjson

from ..media import MediaPrompt
from .base import EngineError, Finish, SamplingParams, TokenBatch
from .http import json_object
from .routing import NAME as ROUTED
from .routing import read as read_routing
from .vllm_media import check_echo

GENERATE = "/inference/v1/generate"  # token IDs in and out
COMPLETIONS = "/v1/completions"


class RouteGone(Exception):
    """/inference/v1/generate is missing and /v1/completions will serve instead."""


def _loads(raw: bytes, route: str) -> dict:
    return json_object(raw, f"vLLM {route}")


class Reader:
    """Turns response bodies / stream chunks of either route into events and one Finish."""

    def __init__(
        self,
        route: str,
        params: SamplingParams,
        prompt_ids: Sequence[int],
        logprob_kind: str,
        error: Callable[[str, int, bytes], EngineError],
        routing: bool = False,
        media: MediaPrompt | None = None,
    ):
        """``logprob_kind``: what the engine's logprobs are (its ``--logprobs-mode``);
        ``error``: the engine's error for an answer of ``route`` (status, raw body);
        ``routing``: routed experts were asked for (from ``params.rows_from``)."""
        self.route, self.params = route, params
        self.logprob_kind, self.error = logprob_kind, error
        self.prompt_len = len(prompt_ids)
        self.pending = TokenBatch()
        self.ids: list[int] = []
        self.final: dict | None = None  # the choice that carried finish_reason
        self.usage: dict | None = None
        self.request_id: str | None = None
        self.weight_versions: list[dict] | None = None
        self.routing = routing
        self.routed: object = None  # the choice's routed_experts (the final chunk's)
        # a prompt with images: vLLM's echo of the expanded prompt is checked at the finish
        self.media, self.echo, self.echo_spans = media, None, None

    def feed(self, obj: dict) -> None:
        if "error" in obj and not obj.get("choices"):
            err = obj["error"] if isinstance(obj["error"], dict) else {}
            code = int(err.get("code") or 500) if str(err.get("code", "")).isdigit() else 500
            raise self.error(self.route, code, orjson.dumps(obj))
        self.request_id = obj.get("request_id") or obj.get("id") or self.request_id
        if obj.get("usage"):
            self.usage = obj["usage"]
        if self.media is not None and obj.get("prompt_token_ids") is not None:
            self.echo, self.echo_spans = obj["prompt_token_ids"], obj.get("mm_placeholders")
        for choice in obj.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            batch = self._events(choice)
            self.pending.extend(batch)
            self.ids.extend(batch.ids)
            if choice.get("weight_versions"):
                self.weight_versions = choice["weight_versions"]
            if choice.get("routed_experts") is not None:
                self.routed = choice["routed_experts"]
            if choice.get("finish_reason") is not None:
                self.final = choice

    def feed_whole(self, raw: bytes) -> None:
        self.feed(_loads(raw, self.route))

    feed_event = feed_whole

    def take(self) -> TokenBatch:
        out, self.pending = self.pending, TokenBatch()
        return out

    def _events(self, choice: dict) -> TokenBatch:
        k = self.params.top_logprobs
        lp = choice.get("logprobs")
        if self.route == GENERATE:
            entries = (lp or {}).get("content") or []
            ids = choice.get("token_ids")
            if ids is None:
                ids = [_entry_id(e) for e in entries]
            elif k <= 0 and (fast := _plain_events(ids, entries)) is not None:
                return fast
            out = TokenBatch()
            n = len(entries)
            for i, tid in enumerate(ids):
                e = entries[i] if i < n else None
                if e is None or _entry_id(e) != tid:
                    out.add(int(tid), math.nan, [] if k > 0 else None)
                    continue
                top = (
                    _top_k(
                        [(_entry_id(t), float(t["logprob"])) for t in e.get("top_logprobs") or ()],
                        k,
                    )
                    if k > 0
                    else None
                )
                out.add(int(tid), _num(e.get("logprob")), top)
            return out
        # /v1/completions: legacy parallel lists, tokens named "token_id:N"
        lp = lp or {}
        tokens = lp.get("tokens") or []
        values = lp.get("token_logprobs") or []
        tops = lp.get("top_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None:
            ids = [_placeholder_id(t) for t in tokens]
            if any(t is None for t in ids):
                raise EngineError(
                    "vLLM /v1/completions returned no token ids (this vLLM is too "
                    "old for return_token_ids)",
                    502,
                )
        out = TokenBatch()
        for i, tid in enumerate(ids):
            if i >= len(values) or values[i] is None:
                out.add(int(tid), math.nan, [] if k > 0 else None)
                continue
            named = _placeholder_id(tokens[i]) if i < len(tokens) else None
            if named is not None and named != tid:
                raise EngineError(
                    f"vLLM /v1/completions logprob {i} is for token {named}, not the sampled {tid}",
                    502,
                )
            top_d = tops[i] if i < len(tops) and tops[i] else {}
            cands = [(_placeholder_id(t), float(v)) for t, v in top_d.items()]
            out.add(int(tid), float(values[i]), _top_k(cands, k))
        return out

    def finish(self) -> Finish:
        choice = self.final
        if choice is None:
            raise EngineError(f"vLLM {self.route} ended without a finish reason", 502)
        reason = choice.get("finish_reason")
        if reason in ("abort", "error"):
            raise EngineError(
                f"vLLM {reason}ed the request (finish_reason {reason!r}) after "
                f"{len(self.ids)} tokens",
                503,
            )
        stop_token = stop_string = None
        if reason == "length":
            out_reason = "length"
        else:
            out_reason = "stop"
            stop_reason = choice.get("stop_reason")
            if isinstance(stop_reason, int) and not isinstance(stop_reason, bool):
                stop_token = stop_reason
            elif isinstance(stop_reason, str):
                stop_string = stop_reason
            elif reason == "stop" and self.ids:
                if "stop_reason" in choice:
                    stop_token = self.ids[-1]  # null stop_reason on "stop": the EOS token
                elif self.ids[-1] in self.params.stop_token_ids:
                    stop_token = self.ids[-1]  # 0.29-0.31 report no stop_reason
        if self.media is not None:
            check_echo(self.media, self.echo, self.echo_spans)
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        spans = self.weight_versions
        arrays, asked = {}, {}
        if self.routing:
            got, asked[ROUTED] = read_routing(
                self.routed,
                start=max(0, min(self.params.rows_from, self.prompt_len)),
                prompt_len=self.prompt_len,
                completion_len=len(self.ids),
                shape=None,
                npy=True,
            )
            if got is not None:
                arrays[ROUTED] = got
        return Finish(
            reason=out_reason,
            stop_token_id=stop_token,
            stop_string=stop_string,
            prompt_tokens=int(usage.get("prompt_tokens") or self.prompt_len),
            cached_tokens=int(details.get("cached_tokens") or 0),
            engine_request_id=self.request_id,
            weight_version=spans[-1]["version"] if spans else None,
            weight_versions=[dict(s) for s in spans] if spans else None,
            logprob_kind=self.logprob_kind,
            arrays=arrays,
            asked=asked,
        )


def _plain_events(ids: list, entries: list) -> TokenBatch | None:
    """The loop below in one pass, for the usual answer (0.32+, no top-k): an entry with an
    integer ``token_id`` for every sampled token, in order. None when the answer is anything
    else (the loop then handles it entry by entry)."""
    if len(entries) != len(ids):
        return None
    try:
        sampled = [int(e["token_id"]) for e in entries]
        if sampled != ids:
            return None
        return TokenBatch(
            sampled,
            [math.nan if (v := e.get("logprob")) is None else float(v) for e in entries],
        )
    except (KeyError, TypeError, ValueError):
        return None


def _num(v: object) -> float:
    return math.nan if v is None else float(v)  # type: ignore[arg-type]


def _placeholder_id(token: object) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None


def _entry_id(e: dict) -> int | None:
    """0.32+: ``token_id``; up to 0.31: ``token`` = ``"token_id:N"``."""
    if "token_id" in e:
        return int(e["token_id"])
    return _placeholder_id(e.get("token"))


def _top_k(cands: list[tuple[int | None, float]], k: int) -> list[tuple[int, float]] | None:
    """The k most likely of the candidates vLLM returned (the sampled token first, then the
    top k or k+1): de-duplicated, best first."""
    if k <= 0:
        return None
    seen: dict[int, float] = {}
    for t, v in cands:
        if t is not None and t not in seen:
            seen[t] = v
    best = sorted(seen.items(), key=lambda kv: -kv[1])
    return best[:k]
