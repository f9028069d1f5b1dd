"""Images by remote URL, only from the prefixes ``serve --image-url-allow`` names (issue 43).

Off by default: the policy under training must not make the gateway reach arbitrary
addresses. A prefix is matched on the parsed URL (scheme, host, port equal; the path starts
with the prefix's path), never as a string, so ``http://good.test`` does not admit
``http://good.test.evil/`` nor ``http://good.test@evil/``. Redirects are followed by hand, each
hop checked against the allow-list again (at most :data:`MAX_REDIRECTS`); the body is read up
to the image limit and no further; the whole fetch has a deadline.

The server fetches before it parses, off its event loop's critical path: :func:`prefetch` finds
the allowed image URLs of a body (any dialect), fetches them concurrently with an async client
(the deadline enforced on the whole fetch, body included, by ``asyncio.timeout``), decodes them
in a worker thread, and hands them to the parser (:func:`using`): a slow asset server holds up
only the call that names it. :func:`fetch` (blocking) is for callers without an event loop."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from urllib.parse import urljoin, urlsplit

import httpx

from .media import Image, Limits, MediaError, decode

MAX_REDIRECTS = 5
_PORTS = {"http": 80, "https": 443}


def _parts(url: str) -> tuple[str, str, int, str] | None:
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        return None
    scheme = u.scheme.lower()
    if scheme not in _PORTS or not u.hostname or u.username is not None or u.password:
        return None
    return scheme, u.hostname.lower(), port or _PORTS[scheme], u.path or "/"


def allowed(url: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``url`` lies under one of ``prefixes`` (scheme, host and port equal, the path
    under the prefix's path; a URL with credentials never does)."""
    got = _parts(url)
    if got is None:
        return False
    for p in prefixes:
        want = _parts(p)
        if want is not None and got[:3] == want[:3] and got[3].startswith(want[3]):
            return True
    return False


def check_prefix(prefix: str) -> str:
    """A ``--image-url-allow`` value, refused unless it is an http(s) URL with a host."""
    if _parts(prefix) is None:
        raise ValueError(f"--image-url-allow {prefix!r}: expected an http(s) URL such as "
                         "https://assets.example/screens/")  # fmt: skip
    return prefix


def fetch(url: str, limits: Limits) -> Image:
    """The image at ``url`` (allowed), read within the limits; any failure a MediaError. For a
    caller without a running event loop (a script parsing a body): :func:`fetch_async` run to
    the end on a loop of its own."""

    async def one() -> Image:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
            return await fetch_async(url, limits, client)

    return asyncio.run(one())


def _check_length(r: httpx.Response, cap: int) -> None:
    declared = r.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise MediaError(
            f"an image of {declared} bytes; this server takes at most {cap} (serve --max-image-mb)"
        )


def _check_read(n: int, cap: int) -> None:
    if n > cap:
        raise MediaError(
            f"an image of over {cap} bytes; this server takes at most {cap} (serve --max-image-mb)"
        )


# ---- off the event loop -----------------------------------------------------------------

# the images fetched for the request being parsed: URL -> its image or why not
_FETCHED: contextvars.ContextVar[dict[str, Image | MediaError] | None] = contextvars.ContextVar(
    "turnstile_fetched_images", default=None
)
# where an image URL sits in each dialect's body: Chat ``image_url`` (a string or
# ``{"url"}``), Responses ``input_image.image_url``, Anthropic ``source: {type: url, url}``
_URL_KEYS = frozenset({"url", "image_url"})


def image_urls(body: object, prefixes: tuple[str, ...]) -> list[str]:
    """The allowed remote URLs of ``body`` where an image URL may sit (any dialect), once
    each, in order. Over-inclusive on purpose (any ``url`` key): a URL fetched and never
    used as an image costs one fetch and changes nothing; one missed would be fetched by
    the parser on the event loop, so none may be."""
    if not prefixes:
        return []
    out: dict[str, None] = {}
    stack = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if k in _URL_KEYS and isinstance(x, str):
                    if not x.startswith("data:") and allowed(x, prefixes):
                        out.setdefault(x)
                elif isinstance(x, dict | list):
                    stack.append(x)
        elif isinstance(v, list):
            stack.extend(x for x in v if isinstance(x, dict | list))
    return list(out)


async def fetch_async(url: str, limits: Limits, client: httpx.AsyncClient) -> Image:
    """:func:`fetch` without blocking the event loop: the whole fetch (redirects and body)
    under one deadline, the bytes decoded in a worker thread."""
    try:
        async with asyncio.timeout(limits.url_timeout):
            data = await _get(url, limits, client)
    except TimeoutError:
        raise MediaError(f"fetching {url!r} took over {limits.url_timeout} s") from None
    return await asyncio.to_thread(decode, data, None, limits)


async def _get(url: str, limits: Limits, client: httpx.AsyncClient) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        try:
            async with client.stream("GET", url) as r:
                if r.is_redirect:
                    nxt = urljoin(url, r.headers.get("location", ""))
                    if not allowed(nxt, limits.url_allow):
                        raise MediaError(
                            f"{url!r} redirects to {nxt!r}, outside serve --image-url-allow"
                        )
                    url = nxt
                    continue
                if r.status_code != 200:
                    raise MediaError(f"fetching {url!r} answered {r.status_code}")
                _check_length(r, limits.max_image_bytes)
                out = bytearray()
                async for chunk in r.aiter_bytes():
                    out += chunk
                    _check_read(len(out), limits.max_image_bytes)
                return bytes(out)
        except httpx.HTTPError as exc:
            raise MediaError(f"fetching {url!r} failed: {type(exc).__name__}") from None
    raise MediaError(f"fetching {url!r}: more than {MAX_REDIRECTS} redirects")


async def prefetch(
    body: object, limits: Limits, cached_image: Callable[[str], Image | None]
) -> dict[str, Image | MediaError]:
    """The allowed image URLs of ``body``, fetched concurrently (each its image or the
    :class:`MediaError` the parser raises for it as a 400 naming the part); a URL already
    decoded (``cached_image``: a resent history's) is not fetched again."""
    urls = image_urls(body, limits.url_allow)
    if not urls:
        return {}
    out: dict[str, Image | MediaError] = {}
    todo = []
    for u in urls:
        cached = cached_image(u)
        if cached is not None:
            out[u] = cached
        else:
            todo.append(u)
    if todo:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:

            async def one(u: str) -> Image | MediaError:
                try:
                    return await fetch_async(u, limits, client)
                except MediaError as exc:
                    return exc

            for u, got in zip(todo, await asyncio.gather(*(one(u) for u in todo)), strict=True):
                out[u] = got
    return out


@contextlib.contextmanager
def using(fetched: dict[str, Image | MediaError]) -> Iterator[None]:
    """Parse with these prefetched images (what :func:`prefetched` answers)."""
    token = _FETCHED.set(fetched)
    try:
        yield
    finally:
        _FETCHED.reset(token)


def prefetched(url: str) -> Image | MediaError | None:
    """The image fetched for ``url`` before this parse (None: not fetched)."""
    got = _FETCHED.get()
    return None if got is None else got.get(url)


def on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
