"""Wire dialects at the edge: each turns its request into the one internal request
(``server.requests.ChatRequest``) and the gateway's answer back into its own shapes. Chat
Completions is the internal shape itself; Responses and Anthropic Messages translate."""

from .base import Dialect
from .chat import ChatDialect

__all__ = ["ChatDialect", "Dialect"]
