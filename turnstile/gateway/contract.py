"""The gateway contract: what the app and its routes use of a gateway, whichever recording mode
it runs (token-in :class:`~.token_in.gateway.Gateway`, engine-rendered capture
:class:`~.capture.gateway.PassthroughGateway`). mypy checks both against it where the app is built
(``create_app``) and below.

Every call a gateway serves ends as one :class:`~turnstile.store.records.CallRecord` (or one
per choice) committed to its :attr:`store`; the engine behind it meets
:class:`~turnstile.engines.base.EngineControl`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from ..answer import Answer, Relayed
from ..engines.base import EngineControl
from ..request import ChatRequest
from ..store.store import Store
from .admission import Chunks
from .control import PolicyControl

if TYPE_CHECKING:
    from .capture.gateway import PassthroughGateway
    from .token_in.gateway import Gateway


class AppGateway(Protocol):
    """A recording gateway as the HTTP app drives it."""

    @property
    def engine(self) -> EngineControl: ...

    @property
    def store(self) -> Store: ...

    @property
    def control(self) -> PolicyControl:
        """Admission, pauses for weight updates and the policy version."""
        ...

    @property
    def model_name(self) -> str: ...

    @property
    def template_ignores_tools(self) -> bool:
        """The chat template drops ``tools`` (warned about at start)."""
        ...

    @property
    def renders_prompt(self) -> bool:
        """Turnstile renders the prompt itself (token-in), so requests are checked in full;
        False: the engine renders it (capture), which checks the rest."""
        ...

    async def complete(
        self,
        session_id: str,
        req: ChatRequest,
        disconnected: Callable[[], Awaitable[object]] | None = None,
    ) -> Answer | Relayed:
        """The whole answer (capture: the engine's own, relayed); ``disconnected`` returns when
        the harness has gone (a gateway that watches it then raises
        :class:`~.token_in.ClientGone`)."""
        ...

    async def stream(self, session_id: str, req: ChatRequest) -> Chunks:
        """The events of a streamed response (errors before the first chunk are raised);
        closing them ends the call."""
        ...

    def count_tokens(self, session_id: str, req: ChatRequest) -> int:
        """The prompt tokens ``req`` would send now; nothing sampled or recorded."""
        ...

    def forget(self, session_id: str) -> None:
        """A deleted session: drop what is cached for it."""
        ...

    def closed(self, session_id: str) -> None:
        """A closed session: free what it no longer needs."""
        ...


def _conforms(token_in: Gateway, capture: PassthroughGateway) -> tuple[AppGateway, ...]:
    """Never called: mypy checks here that both gateways meet the contract."""
    return token_in, capture
