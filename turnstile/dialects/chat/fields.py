"""A wire dialect's top-level fields sorted: each is used (it shapes the prompt or the sampling),
inert (accepted, kept in the call record's info) or refused with a 400 naming it — nothing a
harness asks for is dropped silently."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import APIError


def openai_refusal(key: str, reason: str | None) -> APIError:
    if reason:
        return APIError(
            400, f"Unsupported parameter: '{key}': {reason}", key, code="unsupported_parameter"
        )
    return APIError(
        400, f"Unrecognized request argument supplied: {key}", key, code="unrecognized_argument"
    )


@dataclass(frozen=True)
class Fields:
    used: frozenset[str]
    inert: frozenset[str] = frozenset()
    unsupported: dict[str, str] = field(default_factory=dict)  # field -> why, what instead

    def sort(
        self, body: dict, refuse: Callable[[str, str | None], APIError] = openai_refusal
    ) -> dict:
        """The inert fields of ``body``; a field neither used nor inert is refused (an
        unsupported one only when it asks for something: ``false``/empty is harmless)."""
        inert = {}
        for key, value in body.items():
            if key in self.used or value is None:
                continue
            if key in self.inert:
                inert[key] = value
            elif key not in self.unsupported or value not in (False, [], {}):
                raise refuse(key, self.unsupported.get(key))
        return inert
