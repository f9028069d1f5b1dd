"""The one contract every engine adapter meets: token IDs in, token IDs and logprobs out.

The rest of Turnstile never knows which engine it talks to. An adapter turns
``(prompt_ids, SamplingParams)`` into a stream of :class:`TokenBatch` followed by one
:class:`Finish`, and maps its engine's failures onto :class:`EngineError`. A batch is what one
read from the engine brought (never empty): a whole completion, or the tokens of the stream
events that arrived together, so a burst costs one pass through the gateway, not one per token;
and it holds them column by column, so it is one object however many tokens it carries.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, Self

from ..token_arrays import Rows, span_versions

# What the logprob numbers an engine returns mean (``Finish.logprob_kind``). Only a logprob of
# the distribution the token was actually sampled from is a behaviour-policy logprob.
RAW_LOGPROBS = "raw_logprobs"  # log-softmax of the model's logits: before bias, temperature, top-p
SCALED_LOGPROBS = "scaled_logprobs"  # log-softmax((logits + bias) / T): before top-k/top-p
PROCESSED_LOGPROBS = "processed_logprobs"  # the distribution sampled from (after everything)
RAW_LOGITS = "raw_logits"  # not logprobs at all (vLLM --logprobs-mode raw_logits)
PROCESSED_LOGITS = "processed_logits"  # idem, after processing (vLLM processed_logits)


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # Token IDs that end generation besides the engine's own EOS (e.g. the chat template's
    # end-of-turn token). The one sampled is kept in the completion and reported in
    # ``Finish.stop_token_id``. llama-server has no such option: it stops on its vocabulary's
    # end-of-generation tokens only.
    stop_token_ids: list[int] = field(default_factory=list)
    # GBNF the sample must match (tool_choice "required" / a named function), or None.
    grammar: str | None = None
    # JSON Schema the sample must match (response_format json_object / json_schema), or None.
    json_schema: dict | None = None
    # None: not asked for, the engine's neutral value (no penalty, no top-k/min-p cut).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    # Prompt positions whose per-token arrays (routed experts) the parent's record already
    # holds: the engine is asked only for rows after them (vLLM routed_experts_prompt_start,
    # SGLang routed_experts_start_len). Not a sampling option: left out of ``as_dict``.
    rows_from: int = 0

    def as_dict(self) -> dict:
        """JSON-ready, for the call record."""
        out = {
            k: v for k, v in self.__dict__.items() if v not in (None, [], {}) and k != "rows_from"
        }
        if self.logit_bias:
            out["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return out


@dataclass(frozen=True, slots=True)
class Sent:
    """One sampler field as an adapter put it on its wire: ``value`` as sent, and the
    :class:`SamplingParams` field it carries (None: a value Turnstile fixes itself, such as
    llama-server's ``typical_p`` 1.0, so that no engine default is left in play)."""

    field: str | None
    value: object


def sent_fields(body: Mapping[str, object], wire: Mapping[str, str | None]) -> dict[str, Sent]:
    """The sampler fields of an adapter's request ``body``: each key of ``wire`` (wire name →
    :class:`SamplingParams` field) that the body holds, with its value as sent."""
    return {k: Sent(f, body[k]) for k, f in wire.items() if k in body}


@dataclass(slots=True)
class TokenBatch:
    """Sampled tokens, as columns: ``ids[i]`` was sampled with ``logprobs[i]`` (NaN where the
    engine gave none) and, when top-k logprobs were asked for, ``top[i]`` (its candidates as
    ``(token_id, logprob)``). Columns, not an object per token: a whole answer of 2,000
    tokens was 2,000 objects built and read back, ~0.25 us each."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def add(
        self, token_id: int, logprob: float, top: list[tuple[int, float]] | None = None
    ) -> None:
        """One token more (``top``: its candidates, None when none were asked for or given)."""
        if top is not None and self.top is None:
            self.top = [[] for _ in self.ids]
        self.ids.append(token_id)
        self.logprobs.append(logprob)
        if self.top is not None:
            self.top.append(top or [])

    def extend(self, other: TokenBatch) -> None:
        if other.top is not None and self.top is None:
            self.top = [[] for _ in self.ids]
        self.ids.extend(other.ids)
        self.logprobs.extend(other.logprobs)
        if self.top is not None:
            self.top.extend(other.tops())

    def tops(self) -> list[list[tuple[int, float]]]:
        """Each token's candidates (empty lists when there were none)."""
        return self.top if self.top is not None else [[] for _ in self.ids]


@dataclass
class Finish:
    """How a generation ended. ``stop_token_id`` is set when the model sampled an
    end-of-generation token (which may or may not appear among the events)."""

    reason: str  # "stop" | "length"
    stop_token_id: int | None = None
    engine_reason: str | None = None  # the engine's own reason, where the gateway corrected it
    stop_string: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    engine_request_id: str | None = None
    weight_version: str | None = None  # the version of the last sampled token, if known
    logprob_kind: str = ""
    timings: dict = field(default_factory=dict)
    # Spans ``{"version", "start", "end"}`` over completion-token indexes ``[start, end)``, as
    # the engine reported them (vLLM ``weight_versions``, SGLang ``meta_info.weight_versions``).
    weight_versions: list[dict] | None = None
    # Per-token arrays the engine returned whole (``token_arrays.DECLARED`` names), positioned
    # on the call's prompt + completion: vLLM and SGLang give routed experts once, at the end.
    arrays: dict[str, Rows] = field(default_factory=dict)
    # What the adapter asked of each array (``{"asked": True, "from": 12}``), for the record.
    asked: dict[str, dict] = field(default_factory=dict)
    # The sampler settings the engine says it applied, where its answer echoes them
    # (llama-server's ``generation_settings``), by the adapter's wire names.
    engine_sampling: dict | None = None

    def token_versions(self, n: int) -> list[str | None] | None:
        """The weight version of each of ``n`` completion tokens (see :func:`token_versions`)."""
        return token_versions(self.weight_versions, n)


def token_versions(spans: list[dict] | None, n: int) -> list[str | None] | None:
    """The weight version of each of ``n`` completion tokens from an engine's spans (None where
    no span covers it), or None when the engine reported no spans."""
    return span_versions(spans, n)


class EngineError(Exception):
    """The engine could not serve the call. ``status`` is the HTTP status to give the harness."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


def logprob_unfitness(kind: str, params: SamplingParams | None) -> str | None:
    """Why logprobs of ``kind``, recorded for a call with ``params``, are not the log-probability
    of the sampled token under the distribution it was sampled from (None when they are).

    Without ``params`` only what is wrong whatever the request is reported."""
    if kind in (RAW_LOGITS, PROCESSED_LOGITS):
        return (
            f"the engine returns {kind} (unnormalised logits), not logprobs: they cannot "
            f"be used as behaviour-policy logprobs (start vLLM with "
            f"--logprobs-mode processed_logprobs)"
        )
    if kind not in (RAW_LOGPROBS, SCALED_LOGPROBS, PROCESSED_LOGPROBS):
        return f"the engine's logprob kind is unknown ({kind or 'not reported'})"
    if params is None or kind == PROCESSED_LOGPROBS:
        return None
    if params.temperature == 0:
        return (
            "greedy decoding (temperature 0): the behaviour policy is deterministic; the "
            f"recorded {kind} are the model's distribution, not the sampling one"
        )
    changes = []
    if kind == RAW_LOGPROBS and not math.isclose(params.temperature, 1.0):
        changes.append(f"temperature {params.temperature:g}")
    if kind == RAW_LOGPROBS and params.logit_bias:
        changes.append("logit_bias")
    if params.top_p < 1.0:
        changes.append(f"top_p {params.top_p:g}")
    if params.top_k:
        changes.append(f"top_k {params.top_k}")
    if params.min_p:
        changes.append(f"min_p {params.min_p:g}")
    if kind == RAW_LOGPROBS and (
        params.frequency_penalty
        or params.presence_penalty
        or params.repetition_penalty not in (None, 1.0)
    ):
        changes.append("penalties")
    if params.grammar or params.json_schema:
        changes.append("a grammar")
    if not changes:
        return None
    return (
        f"recorded logprobs are {kind}, taken before {', '.join(changes)} changed the "
        f"sampling distribution: they are not behaviour-policy logprobs"
    )


# The contracts. An engine is what the server drives (:class:`EngineControl`); a token-in engine
# (:class:`Engine`) also picks what serves a session's call (:class:`Generator`): an adapter
# serves every call itself (:class:`EngineAdapter`), a replica pool binds one replica per
# session. :class:`EngineBase` gives the parts a single engine need not implement.


class Generator(Protocol):
    """What serves one call: an engine adapter, or the replica a pool picked for a session."""

    @property
    def url(self) -> str | None:
        """Where the call goes (recorded as ``info.engine_url``); None for an in-process
        engine."""
        ...

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[TokenBatch | Finish]:
        """``prompt_ids``: a list, or an int32 ``array`` (see :func:`~.prompt_json.wire_ids`).

        ``stream`` is a hint: an adapter whose engine cannot stream exact token IDs
        returns them all at once."""
        ...


class EngineControl(Protocol):
    """What the server drives on every engine, token-in or engine-rendered capture, one engine
    or a replica pool: its life, health, logprob contract, sessions and weight-update pauses."""

    @property
    def name(self) -> str: ...

    @property
    def context_length(self) -> int:
        """Tokens of context (0: not known yet; :meth:`refresh` learns it)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def refresh(self) -> None:
        """Learn the engine's settings (model, context, logprob kind); EngineError if it
        cannot be reached."""
        ...

    async def health(self) -> bool: ...

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        """Why this engine's recorded logprobs are unfit as behaviour-policy logprobs for a call
        with ``params`` (None: fit). Without ``params``: what is wrong with the engine's
        configuration whatever the request (for a warning at start)."""
        ...

    def sampling_notes(self, params: SamplingParams) -> list[str]:
        """What of ``params`` this engine cannot honour as asked (for the record's warnings)."""
        ...

    def sent_sampling(self, params: SamplingParams) -> dict[str, Sent]:
        """Every sampler field this engine's wire carries for ``params``, by its wire name, with
        the value sent (the record's ``sampling_applied``): read from the adapter's own request
        body, so the record says what the engine got, not what Turnstile meant."""
        ...

    def forget(self, session_id: str) -> None:
        """A deleted session: drop what is kept for it (a pool's sticky replica)."""
        ...

    def end_ids(self, vocab: Mapping[str, int]) -> frozenset[int]:
        """Tokens of ``vocab`` (text → id) this engine ends a generation on by a rule of its
        own, beyond the tokenizer's end-of-turn tokens (llama-server: by their text)."""
        ...

    async def pause(self, mode: str) -> str:
        """Forward a pause for a weight update ("drain" | "abort"); what the engine said."""
        ...

    async def resume(self) -> str: ...

    def replica_health(self) -> list[tuple[str | None, bool]] | None:
        """``(url, healthy)`` of each replica of a pool; None for a single engine."""
        ...


class Engine(EngineControl, Protocol):
    """A token-in engine as the gateway uses it: one adapter, or a replica pool of them."""

    def pick(self, session_id: str) -> Generator:
        """What serves this session's next call (a pool keeps a session on one replica)."""
        ...


class EngineAdapter(Engine, Generator, Protocol):
    """One token-in engine: it serves every call itself (``pick`` returns it)."""


class EngineBase:
    """The parts of the contract a single engine (an adapter, or a test's in-process engine)
    need not implement: it serves every session itself, honours every sampling option, keeps
    nothing per session and has no pause route."""

    url: str | None = None

    def pick(self, session_id: str) -> Self:
        """The engine that serves this session: itself (a replica pool chooses one)."""
        return self

    def forget(self, session_id: str) -> None:
        """A deleted session: nothing to drop (a replica pool drops its sticky replica)."""

    def end_ids(self, vocab: Mapping[str, int]) -> frozenset[int]:
        """No ends of its own: the engine stops on the stop tokens it is sent."""
        return frozenset()

    def sampling_notes(self, params: SamplingParams) -> list[str]:
        return []

    def sent_sampling(self, params: SamplingParams) -> dict[str, Sent]:
        """An in-process engine has no wire: the parameters themselves."""
        return {k: Sent(k, v) for k, v in params.as_dict().items()}

    async def pause(self, mode: str) -> str:
        """Forward a pause for a weight update; engines without such a route say so."""
        return "no pause route on this engine; Turnstile holds new calls itself"

    async def resume(self) -> str:
        return "no resume route on this engine"

    def replica_health(self) -> list[tuple[str | None, bool]] | None:
        return None
