"""A request's sampling, as the engine gets it: the token budget left in the context, the
end-of-turn stop tokens, and a grammar when a tool call is forced."""

from __future__ import annotations

from collections.abc import Iterable

from ..engines.base import SamplingParams
from ..errors import APIError, ContextOverflow
from ..parsing import grammar
from ..parsing.detect import FormatChoice
from ..request import ChatRequest


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
