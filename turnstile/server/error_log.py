"""One log line per error answered to a harness or the trainer.

The HTTP edge (``server.metrics``' middleware) sees every answer's status; what its line says
beyond that is gathered while the request is answered, in a context variable: the session the
request acted on (``access.harness_session``) and the error itself (``error_handlers``, and
``admission.Chunks`` for an error a stream sends in-band after its 200). The error's
``detail`` is the whole text, which its client may not have been told (an engine's address).

The line names the route's template, never the path (a harness's path holds its session's
capability), and masks anything shaped like a capability or a trainer token in the text.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("turnstile.errors")

_SECRET = re.compile(r"\b(cap|tst)_[A-Za-z0-9_-]+")


@dataclass
class Answer:
    """What one request's log line will say besides its status."""

    session_id: str | None = None
    error: BaseException | None = None


_answer: ContextVar[Answer | None] = ContextVar("turnstile_answer", default=None)


def begin() -> tuple[Answer, Token]:
    """A request starts being answered (its tasks see this one :class:`Answer`)."""
    answer = Answer()
    return answer, _answer.set(answer)


def end(token: Token) -> None:
    _answer.reset(token)


def note_session(session_id: str) -> None:
    answer = _answer.get()
    if answer is not None:
        answer.session_id = session_id


def note_error(exc: BaseException) -> None:
    answer = _answer.get()
    if answer is not None:
        answer.error = exc


def _masked(text: str) -> str:
    return _SECRET.sub(r"\1_…", text)


def _one_line(text: str, limit: int = 2000) -> str:
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "…"


def _session(scope: MutableMapping[str, Any], route: str, answer: Answer) -> str:
    if answer.session_id is not None:
        return answer.session_id
    # trainer routes name the session in their path; ``/s/{sid}`` holds a capability
    sid = (scope.get("path_params") or {}).get("sid")
    return sid if sid is not None and not route.startswith("/s/") else "-"


def answered(
    scope: MutableMapping[str, Any], answer: Answer, status: int, kind: str, in_band: bool = False
) -> None:
    """Log the error answer of one request: status (the error's own when a stream sent it
    in-band after its 200), method and route template, the error's code (else its type), the
    session, and the error's whole text."""
    level = logging.WARNING if status >= 500 else logging.INFO
    if not log.isEnabledFor(level):
        return
    route = getattr(scope.get("route"), "path", None) or "-"
    err: Any = answer.error
    code = (getattr(err, "code", None) or getattr(err, "type", None) or kind) if err else kind
    text = (getattr(err, "detail", None) or str(err)) if err is not None else ""
    session = _masked(_session(scope, route, answer))
    log.log(
        level,
        "answered %s%s to %s %s code=%s session=%s%s",
        status,
        " in-band" if in_band else "",
        scope.get("method", "-"),
        route,
        code,
        session,
        f": {_one_line(_masked(text))}" if text else "",
        extra={
            "status": status,
            "in_band": in_band,
            "route": route,
            "code": code,
            "session_id": session,
        },
    )


def log_to_stderr(level: str) -> None:
    """Turnstile's own log lines on stderr from ``level`` up (``serve --log-level``)."""
    logger = logging.getLogger("turnstile")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:  turnstile: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
