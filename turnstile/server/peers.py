"""The gateways of one ``turnstile serve --workers N``: what one of them does for the others.

Every worker process records into the same store and serves any session (a session's base
URL names the worker that owns it, ``turnstile.app.workers``), but each keeps its own door
(:class:`~turnstile.gateway.control.PolicyControl`: paused or not, the weight version, the calls
it runs). The front (the worker on ``--port``) answers the trainer's pause, resume, status,
close and delete for all of them: it acts on its own gateway and sends the same step to every
other worker's ``POST /internal/peer`` (:class:`Peers`), which acts on that worker's gateway
only (``routes_admin.peer``). A worker that starts (or restarts) takes the front's door first
(:func:`front_state`), so none admits a call under an old version.
"""

from __future__ import annotations

import asyncio

import httpx

PEER_PATH = "/internal/peer"


class Peers:
    """The other workers' origins, and the trainer's token to reach them with."""

    def __init__(self, origins: list[str], token: str | None):
        self.origins = origins
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._headers = headers
        self._http: httpx.AsyncClient | None = None

    async def send(self, op: dict, wait: float = 0.0) -> list[dict]:
        """``op`` on every other worker at once: each one's answer, or ``{"origin", "error"}``
        for one that did not answer within ``wait`` + 60 s (a worker restarting answers once
        it is up: its port stays open meanwhile)."""
        if self._http is None:
            self._http = httpx.AsyncClient(headers=self._headers, timeout=wait + 60.0)

        async def one(origin: str) -> dict:
            for attempt in range(3):  # every op is idempotent: sent again on a new connection
                try:
                    r = await self._http.post(  # type: ignore[union-attr]
                        origin + PEER_PATH, json=op, timeout=wait + 60.0
                    )
                    r.raise_for_status()
                    return {"origin": origin, **r.json()}
                except httpx.TransportError as exc:  # a kept connection to a worker that died
                    error: Exception = exc
                    await asyncio.sleep(0.1 * attempt)
                except (httpx.HTTPError, ValueError) as exc:
                    error = exc
                    break
            return {"origin": origin, "error": f"{type(error).__name__}: {error}"}

        return list(await asyncio.gather(*(one(o) for o in self.origins)))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def total(answers: list[dict], key: str) -> int:
    return sum(int(a.get(key) or 0) for a in answers)


def front_state(front: str, token: str | None, timeout: float = 120.0) -> dict:
    """The front's door (paused, weight version), asked by a worker before it serves; waits
    while the front is still starting."""
    import time

    headers = {"authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.post(
                front + PEER_PATH, json={"op": "status"}, headers=headers, timeout=timeout
            )
            r.raise_for_status()
            return r.json()
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
