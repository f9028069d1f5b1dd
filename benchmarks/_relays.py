"""The minimal relays Turnstile is measured against (``relay-aiohttp``, ``relay-httpx``): the
floor a Python proxy can reach. Bare ASGI apps, run by ``_servers.py``."""

from __future__ import annotations

import orjson

from turnstile.testing.asgi import asgi_body, asgi_lifespan


def relay_app(upstream: str, kind: str):
    """The floor a Python proxy can reach: read the body, parse it once (as any proxy that
    looks at the request must), forward the bytes, stream the answer back."""
    state: dict = {}
    ok_h = [(b"content-type", b"application/json")]

    async def startup() -> None:
        if kind == "relay-aiohttp":
            import aiohttp

            state["s"] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
            )
        else:
            import httpx

            state["c"] = httpx.AsyncClient(
                timeout=600,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024),
            )

    async def shutdown() -> None:
        if "s" in state:
            await state["s"].close()
        if "c" in state:
            await state["c"].aclose()

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send, startup, shutdown)
        body = await asgi_body(receive)
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": ok_h})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        req = orjson.loads(body) if body else {}
        stream = isinstance(req, dict) and bool(req.get("stream"))
        url = upstream + scope["path"]
        headers = {"content-type": "application/json"}
        if kind == "relay-aiohttp":
            async with state["s"].post(url, data=body, headers=headers) as r:
                await send(
                    {
                        "type": "http.response.start",
                        "status": r.status,
                        "headers": [(b"content-type", r.headers.get("content-type", "").encode())],
                    }
                )
                if stream:
                    async for part in r.content.iter_any():
                        await send({"type": "http.response.body", "body": part, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                else:
                    await send({"type": "http.response.body", "body": await r.read()})
            return
        client = state["c"]
        async with client.stream("POST", url, content=body, headers=headers) as r:
            await send(
                {
                    "type": "http.response.start",
                    "status": r.status_code,
                    "headers": [(b"content-type", r.headers.get("content-type", "").encode())],
                }
            )
            if stream:
                async for part in r.aiter_raw():
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                await send({"type": "http.response.body", "body": await r.aread()})

    return app
