"""Wire dialects at the edge: each turns its request into the one internal request
(``turnstile.request.ChatRequest``) and renders the gateway's typed answer
(``turnstile.answer``: the finished call, or its events) in its own shapes, and declares its
routes. Chat Completions, Responses, Anthropic Messages and Gemini's generateContent are four
renderers side by side. A new dialect is its own modules and one line in :data:`DIALECTS`."""

from .base import Dialect, Served
from .chat.dialect import ChatDialect
from .gemini.dialect import GeminiDialect
from .messages.dialect import MessagesDialect
from .responses.dialect import ResponsesDialect

# every dialect the harness routes serve, by class (each built around the app's gateway)
DIALECTS: tuple[type[Dialect], ...] = (
    ChatDialect,
    ResponsesDialect,
    MessagesDialect,
    GeminiDialect,
)

__all__ = [
    "DIALECTS",
    "ChatDialect",
    "Dialect",
    "GeminiDialect",
    "MessagesDialect",
    "ResponsesDialect",
    "Served",
]
