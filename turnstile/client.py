"""Python client for trainers: open sessions, hand their base URL to a harness, attach rewards,
close, fetch trajectories as numpy arrays, delete.

    import turnstile
    ts = turnstile.Client("http://127.0.0.1:8400", data="turnstile-data")   # or token="..."
    s = ts.session(group_id="task-7", sample_index=0, metadata={"split": "train"})
    run_harness(base_url=s.base_url)               # any OpenAI-compatible harness
    s.set_reward(1.0, rewards={"format": 0.5})
    s.close()
    for t in s.trajectories():                       # Trajectory: int32 ids, int8 mask, ...
        t.token_ids, t.loss_mask, t.logprobs, t.versions

:class:`AsyncClient` has the same methods as coroutines, for trainers that drive many rollouts
concurrently. Both raise :class:`TurnstileError` with the server's OpenAI-shaped error.

Credentials: the client sends the trainer's token: ``token=``, else the ``turnstile.token``
file of the server's ``data=`` directory, else ``$TURNSTILE_TOKEN``. A session's ``base_url``
carries its own capability, which allows the harness chat completions on that session only.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from .auth import TOKEN_ENV, read_token
from .store.trajectories import Trajectory

__all__ = ["AsyncClient", "AsyncSession", "Client", "Session", "SessionInfo", "TurnstileError"]


class TurnstileError(Exception):
    """An error answer from Turnstile: HTTP status plus OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ):
        super().__init__(f"{status}: {message}" + (f" (param {param!r})" if param else ""))
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type_,
        )


@dataclass
class SessionInfo:
    """A session (rollout) as the server describes it."""

    id: str
    base_url: str
    status: str = "open"
    # on turnstile.app.ray with direct replicas: Serve's proxy, for when base_url's replica is gone
    fallback_base_url: str | None = None
    group_id: str | None = None
    sample_index: int | None = None
    task_id: str | None = None
    metadata: dict = field(default_factory=dict)
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    call_rewards: dict[str, dict] = field(default_factory=dict)
    created: float | None = None
    closed: float | None = None
    termination_reason: str | None = None
    n_calls: int | None = None
    # serve --canary-fraction: the calls checked, how many a text pipeline would have given
    # other prompt IDs, where (``where``) and the first such (``first_drift``); None when off
    canary: dict | None = None

    @classmethod
    def from_json(cls, d: dict) -> Self:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def _auth_headers(token: str | None, data: str | Path | None) -> dict[str, str]:
    if token is None and data is not None:
        token = read_token(data)
        if token is None:
            raise TurnstileError(
                0,
                f"no trainer token under {data} (turnstile.token); pass "
                "token= or start the server with that --data",
            )
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    return {"authorization": f"Bearer {token}"} if token else {}


def _raise_for(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise TurnstileError(r.status_code, r.text or r.reason_phrase) from None
    raise TurnstileError(
        r.status_code, err.get("message", ""), err.get("param"), err.get("code"), err.get("type")
    )


def _create_body(
    metadata: dict | None,
    group_id: str | None,
    sample_index: int | None,
    task_id: str | None,
    session_id: str | None,
) -> dict:
    body: dict[str, Any] = {"metadata": metadata or {}}
    for k, v in (
        ("group_id", group_id),
        ("sample_index", sample_index),
        ("task_id", task_id),
        ("id", session_id),
    ):
        if v is not None:
            body[k] = v
    return body


def _reward_body(
    reward: float | None, rewards: dict[str, float] | None, call_id: str | None
) -> dict:
    body: dict[str, Any] = {}
    if reward is not None:
        body["reward"] = reward
    if rewards:
        body["rewards"] = rewards
    if call_id is not None:
        body["call_id"] = call_id
    return body


def _traj_params(
    mode: str, lineages: str, mask_stale_versions: bool, max_preemptions: int | None
) -> dict:
    """The trajectories route's query; the hold masks only when asked (older servers)."""
    params = {"mode": mode, "lineages": lineages}
    if mask_stale_versions:
        params["mask_stale_versions"] = "true"
    if max_preemptions is not None:
        params["max_preemptions"] = str(max_preemptions)
    return params


def _list_params(group_id: str | None, status: str | None, after: str | None) -> dict:
    params = {"limit": "1000"}
    if group_id is not None:
        params["group"] = group_id
    if status is not None:
        params["status"] = status
    if after is not None:
        params["after"] = after
    return params


def _ordered(trajs: list[Trajectory]) -> list[Trajectory]:
    """Group members in sample order (stable for equal or missing indices)."""
    return sorted(trajs, key=lambda t: (t.sample_index is None, t.sample_index or 0))


class Session(SessionInfo):
    """A session bound to a :class:`Client`: ``s.set_reward(...)``, ``s.close()``, ...
    (``s.reward``/``s.rewards`` are the values as last fetched; ``s.refresh()`` updates)."""

    _client: Client

    def set_reward(
        self,
        reward: float | None = None,
        *,
        rewards: dict[str, float] | None = None,
        call_id: str | None = None,
    ) -> Session:
        return self._client.set_reward(self.id, reward, rewards=rewards, call_id=call_id)

    def close(self, termination_reason: str | None = None) -> Session:
        return self._client.close(self.id, termination_reason)

    def trajectories(
        self,
        mode: str = "merged",
        lineages: str = "all",
        *,
        mask_stale_versions: bool = False,
        max_preemptions: int | None = None,
    ) -> list[Trajectory]:
        return self._client.trajectories(
            self.id,
            mode,
            lineages,
            mask_stale_versions=mask_stale_versions,
            max_preemptions=max_preemptions,
        )

    def calls(self) -> list[dict]:
        return self._client.calls(self.id)

    def image(self, sha256: str) -> bytes:
        """The bytes of an image of this session's trajectories (``images[i]["sha256"]``)."""
        return self._client.image(self.id, sha256)

    def refresh(self) -> Session:
        return self._client.get_session(self.id)

    def delete(self) -> None:
        self._client.delete(self.id)


class AsyncSession(SessionInfo):
    """A session bound to an :class:`AsyncClient`; the same methods, awaitable."""

    _client: AsyncClient

    async def set_reward(
        self,
        reward: float | None = None,
        *,
        rewards: dict[str, float] | None = None,
        call_id: str | None = None,
    ) -> AsyncSession:
        return await self._client.set_reward(self.id, reward, rewards=rewards, call_id=call_id)

    async def close(self, termination_reason: str | None = None) -> AsyncSession:
        return await self._client.close(self.id, termination_reason)

    async def trajectories(
        self,
        mode: str = "merged",
        lineages: str = "all",
        *,
        mask_stale_versions: bool = False,
        max_preemptions: int | None = None,
    ) -> list[Trajectory]:
        return await self._client.trajectories(
            self.id,
            mode,
            lineages,
            mask_stale_versions=mask_stale_versions,
            max_preemptions=max_preemptions,
        )

    async def calls(self) -> list[dict]:
        return await self._client.calls(self.id)

    async def refresh(self) -> AsyncSession:
        return await self._client.get_session(self.id)

    async def delete(self) -> None:
        await self._client.delete(self.id)


class Client:
    """Synchronous client. ``http`` lets a caller share or configure the httpx client."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8400",
        timeout: float = 60.0,
        http: httpx.Client | None = None,
        *,
        token: str | None = None,
        data: str | Path | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.Client(timeout=timeout)
        self._headers = _auth_headers(token, data)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    def disconnect(self) -> None:
        """Close the HTTP connections (``close`` closes a session)."""
        self._http.close()

    def _req(self, method: str, path: str, **kw: Any) -> Any:
        r = self._http.request(method, self.base_url + path, headers=self._headers, **kw)
        _raise_for(r)
        return r.json()

    def _session(self, d: dict) -> Session:
        s = Session.from_json(d)
        s._client = self
        return s

    def session(
        self,
        metadata: dict | None = None,
        *,
        group_id: str | None = None,
        sample_index: int | None = None,
        task_id: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Open a session (one rollout); give the harness ``.base_url``."""
        body = _create_body(metadata, group_id, sample_index, task_id, session_id)
        return self._session(self._req("POST", "/v1/sessions", json=body))

    def get_session(self, session_id: str) -> Session:
        return self._session(self._req("GET", f"/v1/sessions/{session_id}"))

    def sessions(self, group_id: str | None = None, status: str | None = None) -> list[Session]:
        """All sessions (of a group / with a status), following pages."""
        out: list[Session] = []
        after = None
        while True:
            page = self._req("GET", "/v1/sessions", params=_list_params(group_id, status, after))
            out += [self._session(d) for d in page["data"]]
            if not page["has_more"]:
                return out
            after = page["last_id"]

    def set_reward(
        self,
        session_id: str,
        reward: float | None = None,
        *,
        rewards: dict[str, float] | None = None,
        call_id: str | None = None,
    ) -> Session:
        """Attach a scalar and/or named rewards to the session, or to one of its calls."""
        body = _reward_body(reward, rewards, call_id)
        return self._session(self._req("POST", f"/v1/sessions/{session_id}/rewards", json=body))

    def close(self, session_id: str, termination_reason: str | None = None) -> Session:
        body = {"termination_reason": termination_reason} if termination_reason else {}
        return self._session(self._req("POST", f"/v1/sessions/{session_id}/close", json=body))

    def calls(self, session_id: str) -> list[dict]:
        return self._req("GET", f"/v1/sessions/{session_id}/calls")["data"]

    def image(self, session_id: str, sha256: str) -> bytes:
        """An image's bytes by its sha256, if the session's calls hold it (else a 404)."""
        path = f"/v1/sessions/{session_id}/images/{sha256}"
        r = self._http.request("GET", self.base_url + path, headers=self._headers)
        _raise_for(r)
        return r.content

    def trajectories(
        self,
        session_id: str,
        mode: str = "merged",
        lineages: str = "all",
        *,
        mask_stale_versions: bool = False,
        max_preemptions: int | None = None,
    ) -> list[Trajectory]:
        """Samples as numpy arrays; ``mode`` is ``merged`` or ``per_call``; ``lineages``:
        ``all``, ``main`` (the agent's own conversation) or ``side`` (its titles, summaries,
        sub-agents); ``mask_stale_versions`` / ``max_preemptions``: the route's loss masks of
        calls weight updates reached (docs/weight_sync.md)."""
        params = _traj_params(mode, lineages, mask_stale_versions, max_preemptions)
        data = self._req("GET", f"/v1/sessions/{session_id}/trajectories", params=params)
        return [Trajectory.from_json(d) for d in data["data"]]

    def group_trajectories(
        self, group_id: str, mode: str = "merged", status: str | None = None
    ) -> list[Trajectory]:
        """Every sample of a group's sessions, ordered by sample index."""
        out: list[Trajectory] = []
        for s in self.sessions(group_id, status):
            out += self.trajectories(s.id, mode)
        return _ordered(out)

    def delete(self, session_id: str) -> None:
        self._req("DELETE", f"/v1/sessions/{session_id}")


class AsyncClient:
    """Asynchronous client (httpx.AsyncClient); same methods as :class:`Client`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8400",
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
        max_connections: int = 256,
        *,
        token: str | None = None,
        data: str | Path | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=max_connections)
        )
        self._headers = _auth_headers(token, data)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    async def disconnect(self) -> None:
        """Close the HTTP connections (``close`` closes a session)."""
        await self._http.aclose()

    async def _req(self, method: str, path: str, **kw: Any) -> Any:
        r = await self._http.request(method, self.base_url + path, headers=self._headers, **kw)
        _raise_for(r)
        return r.json()

    def _session(self, d: dict) -> AsyncSession:
        s = AsyncSession.from_json(d)
        s._client = self
        return s

    async def session(
        self,
        metadata: dict | None = None,
        *,
        group_id: str | None = None,
        sample_index: int | None = None,
        task_id: str | None = None,
        session_id: str | None = None,
    ) -> AsyncSession:
        body = _create_body(metadata, group_id, sample_index, task_id, session_id)
        return self._session(await self._req("POST", "/v1/sessions", json=body))

    async def get_session(self, session_id: str) -> AsyncSession:
        return self._session(await self._req("GET", f"/v1/sessions/{session_id}"))

    async def sessions(
        self, group_id: str | None = None, status: str | None = None
    ) -> list[AsyncSession]:
        out: list[AsyncSession] = []
        after = None
        while True:
            page = await self._req(
                "GET", "/v1/sessions", params=_list_params(group_id, status, after)
            )
            out += [self._session(d) for d in page["data"]]
            if not page["has_more"]:
                return out
            after = page["last_id"]

    async def set_reward(
        self,
        session_id: str,
        reward: float | None = None,
        *,
        rewards: dict[str, float] | None = None,
        call_id: str | None = None,
    ) -> AsyncSession:
        body = _reward_body(reward, rewards, call_id)
        return self._session(
            await self._req("POST", f"/v1/sessions/{session_id}/rewards", json=body)
        )

    async def close(self, session_id: str, termination_reason: str | None = None) -> AsyncSession:
        body = {"termination_reason": termination_reason} if termination_reason else {}
        return self._session(await self._req("POST", f"/v1/sessions/{session_id}/close", json=body))

    async def calls(self, session_id: str) -> list[dict]:
        return (await self._req("GET", f"/v1/sessions/{session_id}/calls"))["data"]

    async def trajectories(
        self,
        session_id: str,
        mode: str = "merged",
        lineages: str = "all",
        *,
        mask_stale_versions: bool = False,
        max_preemptions: int | None = None,
    ) -> list[Trajectory]:
        params = _traj_params(mode, lineages, mask_stale_versions, max_preemptions)
        data = await self._req("GET", f"/v1/sessions/{session_id}/trajectories", params=params)
        return [Trajectory.from_json(d) for d in data["data"]]

    async def group_trajectories(
        self, group_id: str, mode: str = "merged", status: str | None = None
    ) -> list[Trajectory]:
        sessions = await self.sessions(group_id, status)
        parts = await asyncio.gather(*(self.trajectories(s.id, mode) for s in sessions))
        return _ordered([t for p in parts for t in p])

    async def delete(self, session_id: str) -> None:
        await self._req("DELETE", f"/v1/sessions/{session_id}")
