"""A request's sampling, as the engine gets it: the token budget left in the context, the
end-of-turn stop tokens, and a grammar when a tool call is forced."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...engines.base import SamplingParams, Sent
from ...errors import APIError, ContextOverflow
from ...parsing import grammar
from ...parsing.detect import FormatChoice
from ...request import ChatRequest


def sampling_params(
    req: ChatRequest,
    prompt_len: int,
    context_length: int,
    eog_token_ids: Iterable[int],
    parser: FormatChoice,
    prompt_tail: str = "",
    default_max_tokens: int | None = None,
) -> SamplingParams:
    """``default_max_tokens``: the budget of a request that names none (``serve
    --default-max-tokens``; the record's ``max_tokens_default`` says it was applied): without
    one a policy that never ends its turn samples the whole context."""
    room = context_length - prompt_len
    if room <= 0:
        raise ContextOverflow(prompt_len, context_length)
    asked = req.max_tokens or default_max_tokens or room
    return SamplingParams(
        max_tokens=min(asked, room),
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=req.stop,
        top_logprobs=req.top_logprobs,
        logit_bias=req.logit_bias,
        # vLLM/SGLang stop on the template's end-of-turn even if the model config omits it
        stop_token_ids=sorted(eog_token_ids),
        grammar=tool_grammar(req, parser, prompt_tail),
        json_schema=req.json_schema,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        repetition_penalty=req.repetition_penalty,
        top_k=req.top_k,
        min_p=req.min_p,
    )


def tool_grammar(req: ChatRequest, parser: FormatChoice, prompt_tail: str = "") -> str | None:
    """For ``tool_choice`` "required" or a named function: a grammar that admits only a call
    in the template's own syntax. The call record keeps it (``sampling.grammar``): the sample
    came from a masked distribution."""
    if req.tool_choice not in ("required", "function"):
        return None
    fmt = parser.tool_format
    if not grammar.supports(fmt):
        raise APIError(
            400,
            f"tool_choice={req.tool_choice!r} needs constrained decoding in "
            f"this template's tool-call syntax ({fmt or 'none detected'}), "
            "which Turnstile cannot build yet; use 'auto'.",
            "tool_choice",
        )
    close = None
    if parser.reasoning_tags and parser.reasoning_started(prompt_tail):
        close = parser.reasoning_tags[1]
    return grammar.tool_call_grammar(
        fmt,
        req.tools or [],
        req.forced_function,
        close,
        parallel=req.tool_choice == "required" and req.parallel_tool_calls,
    )


# Where a value the engine got came from (``info.sampling_applied.from``).
FROM_REQUEST = "request"  # the harness asked for it
FROM_NEUTRAL = "neutral"  # the request left it out: Turnstile sent the no-op value
FROM_DEFAULT = "default"  # serve --default-max-tokens (the request named no budget)
FROM_CONTEXT = "context"  # the budget is the room left in the context
FROM_TURNSTILE = "turnstile"  # a field Turnstile always fixes (e.g. llama-server's typical_p 1)


def applied_sampling(
    sent: Mapping[str, Sent],
    req: ChatRequest | None,
    params: SamplingParams,
    default_max_tokens: int | None = None,
    echo: dict | None = None,
) -> dict:
    """The record's ``info.sampling_applied``: every sampler field the adapter put on the wire
    (``wire``, by the engine's own names and values), where each came from (``from``), and
    what the engine says it applied where its answer tells (``engine_echo``). A trainer reads
    the sampling distribution off it without knowing any engine's defaults."""
    wire = {k: s.value for k, s in sent.items()}
    origin = {k: _origin(s.field, req, params, default_max_tokens) for k, s in sent.items()}
    out: dict = {"wire": wire, "from": origin}
    if echo:
        out["engine_echo"] = echo
    return out


def _origin(
    name: str | None, req: ChatRequest | None, params: SamplingParams, default: int | None
) -> str:
    if name is None:
        return FROM_TURNSTILE
    if name == "max_tokens":
        asked = req.max_tokens if req is not None else params.max_tokens
        if asked is not None and asked <= params.max_tokens:
            return FROM_REQUEST
        if req is not None and asked is None and default and default <= params.max_tokens:
            return FROM_DEFAULT
        return FROM_CONTEXT
    if name == "grammar":  # a tool_choice grammar is Turnstile's reading of the request
        return FROM_REQUEST
    value = getattr(req, name, None) if req is not None else getattr(params, name, None)
    if value in (None, {}, []):
        return FROM_NEUTRAL
    if name in ("temperature", "top_p") and value == 1.0 and req is not None:
        return FROM_REQUEST if name in req.raw else FROM_NEUTRAL
    return FROM_REQUEST


def behaviour_logprobs(kind: str | None, why: str | None) -> dict:
    """The record's ``info.behaviour_logprobs``: whether the recorded logprobs are those of the
    distribution each token was sampled from (what an importance weight divides by), and if
    not, why (``engines.base.logprob_unfitness``'s verdict for this call)."""
    return {"exact": kind is not None and why is None, "kind": kind, "why": why}
