"""A recording relay: an HTTP server in a thread that forwards every request to an engine
(llama-server) and keeps each request with the answer, so a test compares Turnstile's records
with what the engine really received and sampled, not with Turnstile's own account of it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Exchange:
    path: str
    request: dict
    response: dict  # for streams: tokens/probabilities gathered from every chunk + the last chunk


@dataclass
class Relay:
    """Forwards to llama-server and keeps every /completion request and response."""

    url: str
    exchanges: list[Exchange] = field(default_factory=list)

    def completions(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == "/completion"]


def relay_handler(upstream: str, relay: Relay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self, method: str) -> None:
            n = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(n) if n else None
            req = urllib.request.Request(
                upstream + self.path,
                body,
                method=method,
                headers={"content-type": "application/json"},
            )
            try:
                resp = urllib.request.urlopen(req, timeout=120)
            except urllib.error.HTTPError as e:
                resp = e
            self.send_response(resp.status)
            ctype = resp.headers.get("content-type", "application/json")
            self.send_header("content-type", ctype)
            recorded = False

            def record(data: dict) -> None:
                # before the client can have the whole answer: a test reads the exchange as
                # soon as its call returns
                nonlocal recorded
                if body and not recorded:
                    relay.exchanges.append(Exchange(self.path, json.loads(body), data))
                recorded = True

            if "event-stream" in ctype:
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                tokens: list = []
                probs: list = []
                last: dict = {}
                for line in resp:
                    if line.startswith(b"data: ") and line[6:].strip().startswith(b"{"):
                        last = json.loads(line[6:])
                        tokens += last.get("tokens") or []
                        probs += last.get("completion_probabilities") or []
                        if last.get("stop"):
                            record({**last, "tokens": tokens, "completion_probabilities": probs})
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                record({**last, "tokens": tokens, "completion_probabilities": probs})
                self.wfile.write(b"0\r\n\r\n")
            else:
                raw = resp.read()
                record(json.loads(raw) if raw else {})
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802
            self._forward("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._forward("POST")

    return Handler


def start_relay(upstream: str, relay: Relay | None = None) -> tuple[Relay, ThreadingHTTPServer]:
    """A relay to ``upstream`` on a free loopback port, served from a daemon thread; the caller
    stops it with ``server.shutdown(); server.server_close()``."""
    rel = relay if relay is not None else Relay("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), relay_handler(upstream, rel))
    rel.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rel, server
