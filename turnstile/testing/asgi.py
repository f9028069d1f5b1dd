"""Two ASGI helpers for the bare apps of the fast fake engine and the benchmarks' relays
(no framework: a framework's per-request cost would be measured with them)."""

from __future__ import annotations


async def asgi_lifespan(receive, send, startup=None, shutdown=None) -> None:  # noqa: ANN001
    """Answer an ASGI ``lifespan`` scope for the bare apps here, running their set-up."""
    while True:
        msg = await receive()
        step = startup if msg["type"] == "lifespan.startup" else shutdown
        if step is not None:
            await step()
        await send({"type": msg["type"] + ".complete"})
        if msg["type"] == "lifespan.shutdown":
            return


async def asgi_body(receive) -> bytes:  # noqa: ANN001
    """A request's whole body."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body
