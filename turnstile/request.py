"""The one internal request every wire dialect is turned into, below the dialects that build it
and the gateways that serve it: what to render (messages, tools), how to sample, and what the
call's record keeps of the request as it came. (The answer's types are ``turnstile.answer``.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChatRequest:
    messages: list[dict]
    model: str | None = None
    tools: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # "auto" | "none" | "required" | the name of the one function that must be called
    tool_choice: str = "auto"
    forced_function: str | None = None
    parallel_tool_calls: bool = True  # OpenAI's default; "required" may then make several calls
    # Sampling knobs beyond OpenAI's core set; None = not given (the engine's neutral value).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    # response_format json_object / json_schema: the JSON Schema the reply must match
    json_schema: dict | None = None
    # Fields OpenAI clients send that change nothing Turnstile renders or samples (``user``,
    # ``metadata``, ``store``, ...): accepted, and kept in the call record's info.
    inert: dict = field(default_factory=dict)
    # What a dialect could not give the model as asked (a hosted tool left out, ...): the
    # call record's warnings.
    notes: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False)  # the body as received (retention)
    # The wire dialect the harness spoke ("chat", "responses", "messages"): every dialect is
    # turned into this one request, and each call records which one it came in.
    dialect: str = "chat"
    # What a dialect keeps in the call's record to answer later requests (the Responses
    # dialect: the input items this call added to its response chain).
    dialect_state: dict = field(default_factory=dict, repr=False)
    # The call's ID when a dialect names it before the call runs (a streamed response's ID is
    # sent first); None: the gateway draws one.
    call_id: str | None = None
    # The request's images by sha256 (their parts in ``messages`` are ``{"type": "image",
    # "sha256": ...}``: dialects/images.py); {} for text.
    images: dict[str, Any] = field(default_factory=dict, repr=False)
