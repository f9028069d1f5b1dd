"""The recording relay (``turnstile.testing.relay``), the suite's independent truth, against an
upstream that keeps what it received and sent: the relay forwards both ways byte for byte,
streams line by line as they come (never the whole stream at once: keep-alive and hold tests
rely on it) and records what went through. In-process servers only: about a second."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from turnstile.testing.relay import Relay, start_relay

pytestmark = pytest.mark.integration

# odd on purpose: spacing, key order, escapes and raw UTF-8 a re-serialiser would change
ANSWER = b'{"z": 1,  "content":"caf\xc3\xa9 \\u00e9\\n",\t"tokens":[3, 1,2], "a":1.50}'
LINES = [
    b'data: {"content":"\xc3\xa9","tokens":[5],"stop":false}\n',
    b"\n",
    b'data: {"content": "x",  "tokens":[6, 7],"completion_probabilities":[{"p":1}],"stop":false}\n',
    b"\n",
    b'data: {"content":"","tokens":[],"stop":true,"timings":{"n":3}}\n',
    b"\n",
]


class Upstream:
    """Answers ``/json`` with ANSWER (``/bad``: the same as a 400) and ``/stream`` with LINES,
    holding back everything after the first line until ``go`` is set; keeps every body."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.released: list[bool] = []  # False: the stream went on after waiting 5 s
        self.go = threading.Event()
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                up.got.append(self.rfile.read(int(self.headers["content-length"])))
                if self.path == "/stream":
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("connection", "close")
                    self.end_headers()
                    self.wfile.write(LINES[0])
                    self.wfile.flush()
                    up.released.append(up.go.wait(5))
                    for line in LINES[1:]:
                        self.wfile.write(line)
                    self.wfile.flush()
                    return
                self.send_response(400 if self.path == "/bad" else 200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(ANSWER)))
                self.end_headers()
                self.wfile.write(ANSWER)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def wire() -> Iterator[tuple[Upstream, Relay]]:
    up = Upstream()
    relay, server = start_relay(up.url)
    yield up, relay
    up.go.set()
    server.shutdown()
    server.server_close()
    up.server.shutdown()
    up.server.server_close()


REQUEST = b'{"prompt": [1, 2],\n "n_predict":3, "s":"\xc3\xa9"}'


@pytest.mark.parametrize("path", ["/json", "/bad"])
def test_a_json_answer_goes_through_byte_for_byte_and_is_kept(wire, path):
    up, relay = wire
    r = httpx.post(relay.url + path, content=REQUEST, headers={"content-type": "application/json"})
    assert r.status_code == (400 if path == "/bad" else 200)
    assert up.got == [REQUEST] and r.content == ANSWER  # what each side received, as sent
    (ex,) = relay.wait(1)
    assert (ex.method, ex.path, ex.status, ex.stream) == ("POST", path, r.status_code, False)
    assert ex.body == REQUEST and ex.request == json.loads(REQUEST)
    assert ex.raw == ANSWER and ex.response == json.loads(ANSWER)
    assert ex.parts() == [json.loads(ANSWER)]


def test_a_stream_goes_through_line_by_line_as_it_comes_and_is_kept(wire):
    up, relay = wire
    got = b""
    with httpx.stream("POST", relay.url + "/stream", content=REQUEST, timeout=30) as r:
        chunks = r.iter_raw()
        while b"\n" not in got:
            got += next(chunks)
        # the upstream holds the rest back until now: a relay that buffered would hang above
        assert got == LINES[0] and not up.go.is_set()
        up.go.set()
        got += b"".join(chunks)
    assert up.released == [True]  # by the test, once it had the first line
    assert up.got == [REQUEST] and got == b"".join(LINES)
    (ex,) = relay.wait(1)
    assert ex.stream and ex.raw == got
    chunks_sent = [json.loads(line[6:]) for line in LINES if line.startswith(b"data: ")]
    assert ex.chunks == ex.parts() == chunks_sent
    # llama-server's per-chunk lists, joined, on the last chunk
    assert ex.response == {**chunks_sent[-1], "tokens": [5, 6, 7],
                           "completion_probabilities": [{"p": 1}]}  # fmt: skip
    assert relay.completions() == []  # not llama-server's /completion route


def test_paths_keep_only_those_routes(wire):
    up, relay = wire
    relay.paths = ("/json",)
    for path in ("/bad", "/json"):
        httpx.post(relay.url + path, content=REQUEST)
    assert [e.path for e in relay.wait(1)] == ["/json"] and len(up.got) == 2
