"""A replica's direct server (turnstile.app.ray.direct) without Ray: the app served by uvicorn on
the running event loop, on a port of its own, its lifespan left to its owner (Serve), and
stopped on request."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import ray  # noqa: F401  pinned (requirements.lock): a broken install fails, not skips
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from turnstile.app.ray.direct import DirectServer

pytestmark = pytest.mark.integration


def test_the_app_on_its_own_port():
    started: list[bool] = []

    async def hello(request):
        # the same loop as the server's owner: the app's asyncio state is shared
        return PlainTextResponse(str(id(asyncio.get_running_loop())))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        started.append(True)
        yield

    app = Starlette(routes=[Route("/hi", hello)], lifespan=lifespan)

    async def main() -> None:
        d = DirectServer(app, "127.0.0.1")
        origin = await d.start()
        assert origin == f"http://127.0.0.1:{d.port}"
        async with httpx.AsyncClient() as http:
            r = await http.get(origin + "/hi")
        assert r.text == str(id(asyncio.get_running_loop()))
        d.stop()
        assert d.task is not None
        await asyncio.wait_for(d.task, 10)

    asyncio.run(main())
    assert started == []  # Serve runs the lifespan, once
