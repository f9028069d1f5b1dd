"""Wire dialects at the edge: each turns its request into the one internal request
(``turnstile.request.ChatRequest``) and the gateway's answer back into its own shapes, and
declares its routes. Chat Completions is the internal shape itself; Responses and Anthropic
Messages translate. A new dialect is its own modules and one line in :data:`DIALECTS`."""

from .base import Dialect, Served
from .chat import ChatDialect
from .messages import MessagesDialect
from .responses import ResponsesDialect

# every dialect the harness routes serve, by class (each built around the app's gateway)
DIALECTS: tuple[type[Dialect], ...] = (ChatDialect, ResponsesDialect, MessagesDialect)

__all__ = ["DIALECTS", "ChatDialect", "Dialect", "MessagesDialect", "ResponsesDialect", "Served"]
