"""A recording relay: an HTTP server in a thread between a client and an engine or provider
(llama-server, vLLM's token-in and OpenAI routes, SGLang, Turnstile itself, a dialect's own
API) that forwards every request and answer byte for byte, streams line by line as they come,
and keeps each exchange: so a test compares Turnstile's records with what the other side really
received and returned on the wire, not with Turnstile's own account of it.

Each :class:`Exchange` holds the request's bytes and JSON, the answer's status, bytes, JSON (a
stream's ``data:`` objects in ``chunks``, folded into ``response``) and ``done`` once it ended.
An exchange is kept, and its ``response`` complete, before the client has the answer's last
byte: a test reads it as soon as its call returns. A client that goes away mid-stream closes the
relay's connection upstream, as a direct client's departure would."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# not forwarded either way: the relay's own connection's (and accept-encoding: the answers it
# keeps stay readable; what it forwards is still what it received)
HOP = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "accept-encoding",
}
_ended = itertools.count()


@dataclass
class Exchange:
    path: str
    request: dict  # the request's JSON ({} for none, or a body that is not JSON)
    response: dict | None = None  # the JSON answer; a stream's last chunk with its lists joined
    chunks: list[dict] = field(default_factory=list)  # a stream's data: objects, in order
    status: int = 0
    done: bool = False
    method: str = "POST"
    stream: bool = False  # an event stream (its data: objects in ``chunks``)
    body: bytes = b""  # the request as received and forwarded
    raw: bytes = b""  # the answer's body as received and forwarded
    ended: int = -1  # when the answer was complete (an order across exchanges), -1 until then

    def parts(self) -> list[dict]:
        """The answer's JSON objects: a stream's chunks, or the one answer."""
        if self.stream:
            return self.chunks
        return [self.response] if self.response is not None else []


@dataclass
class Relay:
    """Keeps every exchange (``paths``: only POSTs to those paths), and the bodies of vLLM's
    ``/abort_requests`` calls with its status."""

    url: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    aborts: list[tuple[dict, int]] = field(default_factory=list)
    paths: tuple[str, ...] = ()
    upstream: str = ""

    def on(self, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == path]

    def completions(self) -> list[Exchange]:
        """llama-server's ``/completion`` exchanges whose answer is complete, in the order
        they completed."""
        done = [e for e in self.on("/completion") if e.ended >= 0]
        return sorted(done, key=lambda e: e.ended)

    def wait(self, n: int, timeout: float = 30.0) -> list[Exchange]:
        """The first ``n`` exchanges, once all of them have ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.exchanges) >= n and all(e.done for e in self.exchanges[:n]):
                return self.exchanges[:n]
            time.sleep(0.05)
        raise TimeoutError(f"{len(self.exchanges)} exchanges, {n} expected")


def _json(raw: bytes) -> dict | None:
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return None


def _fold(ex: Exchange, last: dict, lists: dict[str, list]) -> None:
    """A stream's answer so far: its last chunk, with llama-server's per-chunk lists joined."""
    ex.response = {**last, **lists}


def relay_handler(upstream: str, relay: Relay) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(upstream)
    if not up.hostname:
        raise ValueError(f"the relay's upstream {upstream!r} names no host")
    host = up.hostname
    prefix = up.path.rstrip("/")
    conn_cls = http.client.HTTPSConnection if up.scheme == "https" else http.client.HTTPConnection

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                out = b""
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    out += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return out
            n = int(self.headers.get("content-length") or 0)
            return self.rfile.read(n) if n else b""

        def _forward(self) -> None:
            method, body = self.command, self._body()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            if "upgrade" in self.headers:  # e.g. Codex's WebSocket try: answered over HTTP
                headers["connection"] = "Upgrade"
                headers["upgrade"] = self.headers["upgrade"]
            if body or method in ("POST", "PUT", "PATCH"):
                headers["content-length"] = str(len(body))
            conn = conn_cls(host, up.port, timeout=300)
            ex = None
            keep = not relay.paths or (method == "POST" and self.path in relay.paths)
            try:
                conn.request(method, prefix + self.path, body or None, headers)
                resp = conn.getresponse()
            except OSError as e:
                conn.close()
                if keep:
                    ex = Exchange(self.path, _json(body) or {}, status=502, method=method)
                    ex.body, ex.done, ex.ended = body, True, next(_ended)
                    relay.exchanges.append(ex)
                self.send_error(502, f"relay: {upstream} unreachable ({e})")
                return
            if self.path.endswith("/abort_requests") and body:
                relay.aborts.append((_json(body) or {}, resp.status))
            ctype = resp.headers.get("content-type", "")
            if keep:
                ex = Exchange(self.path, _json(body) or {}, status=resp.status, method=method)
                ex.body, ex.stream = body, "event-stream" in ctype
                relay.exchanges.append(ex)
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                if k.lower() not in HOP and k.lower() not in ("server", "date"):  # its own
                    self.send_header(k, v)
            try:
                if method == "HEAD" or resp.status in (204, 304):
                    if method == "HEAD" and resp.headers.get("content-length"):
                        self.send_header("content-length", resp.headers["content-length"])
                    self.end_headers()
                    resp.read()
                    if ex is not None:
                        ex.ended = next(_ended)
                elif "event-stream" in ctype or resp.headers.get("content-length") is None:
                    self._stream(resp, ex)
                else:
                    raw = resp.read()
                    if ex is not None:
                        ex.raw, ex.response, ex.ended = raw, _json(raw), next(_ended)
                    self.send_header("content-length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    self.wfile.flush()
            except OSError:  # the client went away: so does the relay's call upstream
                self.close_connection = True
            finally:
                conn.close()
                if ex is not None:
                    if ex.ended < 0:
                        ex.ended = next(_ended)
                    ex.done = True

        def _stream(self, resp: http.client.HTTPResponse, ex: Exchange | None) -> None:
            """Line by line as the upstream sends them, each line one chunk to the client."""
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            raw = bytearray()
            last: dict = {}
            lists: dict[str, list] = {}
            while line := resp.readline():
                if ex is not None:
                    raw += line
                    if ex.stream and line.startswith(b"data: ") and line[6:].lstrip()[:1] == b"{":
                        last = json.loads(line[6:])
                        ex.chunks.append(last)
                        if "stop" in last:  # llama-server's: the lists of every chunk, joined
                            for key in ("tokens", "completion_probabilities"):
                                lists.setdefault(key, []).extend(last.get(key) or [])
                        _fold(ex, last, lists)
                        if last.get("stop") is True and ex.ended < 0:
                            ex.ended = next(_ended)
                    elif ex.stream and line.startswith(b"data: [DONE]") and ex.ended < 0:
                        ex.ended = next(_ended)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            if ex is not None:
                ex.raw = bytes(raw)
                if not ex.stream:
                    ex.response = _json(ex.raw)
            if ex is not None and ex.ended < 0:
                ex.ended = next(_ended)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward

    return Handler


def start_relay(
    upstream: str, relay: Relay | None = None, *, paths: tuple[str, ...] | None = None
) -> tuple[Relay, ThreadingHTTPServer]:
    """A relay to ``upstream`` on a free loopback port, served from a daemon thread; the caller
    stops it with ``server.shutdown(); server.server_close()``. ``paths``: keep only POSTs to
    these (every exchange where not given)."""
    rel = relay if relay is not None else Relay()
    rel.upstream = upstream
    if paths is not None:
        rel.paths = paths
    server = ThreadingHTTPServer(("127.0.0.1", 0), relay_handler(upstream, rel))
    server.daemon_threads = True
    rel.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rel, server
