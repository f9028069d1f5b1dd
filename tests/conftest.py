"""Shared fixtures: a real llama-server on tiny and small models, a recording relay that
shows what the engine really received and returned, and Turnstile run as a real process."""

from __future__ import annotations

import _posixsubprocess
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

import turnstile_testbed as testbed
from turnstile.auth import read_token
from turnstile.client import Client
from turnstile.testing.relay import Relay, start_relay

# Subprocesses (examples, benchmarks, servers) import this checkout's turnstile and test bed,
# whatever checkout the shared virtualenv's editable installs last pointed at.
_ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [
        _ROOT,
        str(Path(_ROOT) / "testbed"),
        *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p),
    ]
)

QWEN25_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct"

# The test tiers: every module declares one with ``pytestmark``. ``./run check`` runs the unit
# tier (ruff, mypy and the tests that need no server) in minutes; ``./run test`` runs all
# three, as CI does.
TIERS = {
    "unit": "no server, no child process beyond ruff/mypy: the fast tier (./run check)",
    "integration": "real servers (llama-server, Turnstile, fakes) or slow in-process work",
    "heavy": "one heavy server per module (vLLM, coding-agent CLIs, Ray, Postgres, kills)",
}
# what a unit test may not use: each of these starts a process or a server (refused at
# collection, before anything starts; the guard below catches what they miss)
SERVER_FIXTURES = frozenset(
    {"llama_tiny", "tiny_end_ids", "no_end_bias", "relay", "turnstile", "turnstile_factory"}
    | {"postgres", "shared_relay", "shared_turnstile"}
)
# the only programs a unit test may start (``tests/test_typecheck.py``)
UNIT_PROGRAMS = frozenset({"ruff", "mypy"})


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")
    # the stdlib asks ``uname -p`` once per process and caches it (the openai client's
    # platform headers): asked here, before any test, so the unit guard never sees it
    platform.processor()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test in exactly one tier; a unit test asks for no server fixture (so the fast tier
    stays fast and needs nothing but the venv). What a unit test starts is guarded at run time
    (``UnitGuard``), whatever its fixtures are called."""
    bad = []
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        used = sorted(SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))
        if len(tiers) != 1:
            bad.append(f"{item.nodeid}: in tiers {tiers}; declare one in its pytestmark")
        elif tiers == ["unit"] and used:
            bad.append(f"{item.nodeid}: a unit test uses {used} (servers): mark it integration")
    if bad:
        raise pytest.UsageError("test tiers:\n  " + "\n  ".join(bad[:20]))


class UnitTierViolation(BaseException):
    """Raised where a unit test starts a server or a program; a BaseException so that code
    under test catching ``Exception``/``OSError`` does not hide it (and the report is failed
    from the record anyway)."""


def _program(args: object) -> str:
    """The program an argv runs: ``ruff`` for ``ruff …`` and for ``python -m ruff …``."""
    argv = [os.fsdecode(a) for a in args] if isinstance(args, list | tuple) else [str(args)]
    if not argv:
        return ""
    if len(argv) >= 3 and argv[1] == "-m":
        return argv[2]
    return os.path.basename(argv[0].split()[0]) if argv[0] else ""


class UnitGuard:
    """While a unit test runs (setup, call, teardown): a listening socket, or a child
    process other than ruff/mypy (``subprocess``, asyncio's subprocesses, ``posix_spawn``,
    multiprocessing's spawn), is recorded in ``seen`` and refused. ``os.fork`` is let through:
    a forked copy of the test process is no server and no program."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._undo: list[Callable[[], None]] = []

    def _refuse(self, what: str) -> None:
        self.seen.append(what)
        raise UnitTierViolation(f"a unit test {what}: mark it integration")

    def _patch(self, owner: object, name: str, wrap: Callable) -> None:
        original = getattr(owner, name)
        setattr(owner, name, wrap(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> UnitGuard:
        guard = self

        def listen(original: Callable) -> Callable:
            def guarded(sock: socket.socket, *a: object) -> object:
                guard._refuse(f"listened on a socket ({sock.getsockname()!r})")
                return original(sock, *a)

            return guarded

        def execute(original: Callable) -> Callable:
            def guarded(popen: subprocess.Popen, args: object, *a: object, **kw: object) -> object:
                if _program(args) not in UNIT_PROGRAMS:
                    guard._refuse(f"started a process: {args!r}")
                return original(popen, args, *a, **kw)

            return guarded

        def spawn(original: Callable, argv_at: int) -> Callable:
            def guarded(*a: object, **kw: object) -> object:
                if _program(a[argv_at]) not in UNIT_PROGRAMS:
                    guard._refuse(f"started a process: {a[argv_at]!r}")
                return original(*a, **kw)

            return guarded

        self._patch(socket.socket, "listen", listen)
        self._patch(subprocess.Popen, "_execute_child", execute)
        self._patch(_posixsubprocess, "fork_exec", lambda o: spawn(o, 0))
        for name in ("posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                self._patch(os, name, lambda o: spawn(o, 1))
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()


_GUARD = pytest.StashKey[UnitGuard]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """The unit tier's rule, by what a test starts (not by what its fixtures are named)."""
    if item.get_closest_marker("unit") is None:
        return (yield)
    with UnitGuard() as guard:
        item.stash[_GUARD] = guard
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A phase in which the guard refused something fails, even where the code under test
    caught what the guard raised."""
    report: pytest.TestReport = yield
    guard = item.stash.get(_GUARD, None)
    if guard is not None and guard.seen and report.passed:
        report.outcome = "failed"
        report.longrepr = "unit tier: " + "; ".join(guard.seen)
        guard.seen.clear()
    elif guard is not None:
        guard.seen.clear()
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    """Seconds per test module (setup, call and teardown together), the slowest first: where
    the suite's 45-minute budget on CI goes, module by module."""
    per_module: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport):
                module = rep.nodeid.split("::", 1)[0]
                per_module[module] = per_module.get(module, 0.0) + rep.duration
    if len(per_module) < 2:
        return
    ranked = sorted(per_module.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", f"seconds per module (total {sum(per_module.values()):.0f})")
    for module, seconds in ranked[:25]:
        terminalreporter.write_line(f"{seconds:8.1f}  {module}")


@pytest.fixture(scope="session")
def tiny_qwen2() -> Path:
    """Random weights on the real Qwen2 vocabulary, with the real Qwen2.5 template."""
    return testbed.tiny_model("qwen2", QWEN25_TEMPLATE)


@pytest.fixture(scope="session")
def llama_tiny(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with testbed.llama_server(tiny_qwen2, ctx=8192, parallel=2, log=log) as url:
        yield url


def llama_end_ids(model: Path, log: Path) -> list[int]:
    """Every token llama-server ends a generation on for ``model``, as it lists them itself
    (``-lv 4`` load log), with the tokenizer's own end-of-generation ids. llama.cpp picks them
    by token text: for the Qwen2 vocabulary that includes a plain ``</s>`` (128247), which
    Turnstile's tokenizer does not count, so biasing only ``eog_token_ids`` is not enough."""
    import re

    from turnstile.chat.tokenizer import load_tokenizer

    with testbed.llama_server(model, ctx=512, parallel=1, extra=["-lv", "4"], log=log):
        pass
    text = log.read_text(errors="replace")
    _, sep, rest = text.partition("printing all EOG tokens:")
    assert sep, f"llama-server no longer lists its EOG tokens: see {log}"
    ids = set()
    for line in rest.splitlines()[1:]:
        m = re.search(r"load:\s+- (\d+) \(", line)
        if not m:
            break
        ids.add(int(m.group(1)))
    assert ids, f"no EOG token read from {log}"
    return sorted(ids | load_tokenizer(str(model)).eog_token_ids)


@pytest.fixture(scope="session")
def tiny_end_ids(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> list[int]:
    """The tiny model's end tokens (see ``llama_end_ids``). A random-weight model samples one
    of them early or late depending on which CPU kernels llama.cpp picked for the machine: a
    test that needs a generation to run to ``max_tokens`` biases all of them by -100."""
    return llama_end_ids(tiny_qwen2, tmp_path_factory.mktemp("eog") / "llama-server.log")


@pytest.fixture(scope="session")
def no_end_bias(tiny_end_ids: list[int]) -> dict[str, int]:
    """OpenAI ``logit_bias`` that keeps the tiny model from ending: it runs to max_tokens."""
    return {str(t): -100 for t in tiny_end_ids}


@contextmanager
def _relayed(upstream: str) -> Iterator[Relay]:
    rel, server = start_relay(upstream)
    try:
        yield rel
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def relay(llama_tiny: str) -> Iterator[Relay]:
    with _relayed(llama_tiny) as rel:
        yield rel


class Turnstile:
    """``turnstile serve`` as a real process (so it can be SIGKILLed and restarted).

    It generates its trainer token in ``data/turnstile.token``; ``token``, ``headers`` and
    ``http`` (an httpx.Client sending it) are the trainer's credentials. Session base URLs
    (``session()["base_url"]``) carry the session's capability, as a harness gets them."""

    def __init__(
        self,
        engine_url: str | list[str],
        model: Path,
        data: Path,
        log: Path,
        extra: tuple[str, ...] = (),
    ):
        self.engine_url, self.model, self.data, self.log = engine_url, model, data, log
        self.extra = extra  # more ``turnstile serve`` options
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.token = ""
        self._http: httpx.Client | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    @property
    def http(self) -> httpx.Client:
        """An httpx client with the trainer's token (give full URLs: ``ts.url + path``)."""
        if (
            self._http is None
            or self._http.headers.get("authorization") != self.headers["authorization"]
        ):
            self._http = httpx.Client(headers=self.headers, timeout=30)
        return self._http

    def client(self, **kw: object) -> Client:
        return Client(self.url, token=self.token, **kw)

    def start(self) -> Turnstile:
        port = testbed.free_port()
        self.url = f"http://127.0.0.1:{port}"
        urls = [self.engine_url] if isinstance(self.engine_url, str) else self.engine_url
        cmd = [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "serve",
            *(a for u in urls for a in ("--engine-url", u)),
            "--model",
            str(self.model),
            "--port",
            str(port),
            "--data",
            str(self.data),
            *self.extra,
        ]
        out = self.log.open("ab")
        # no $TURNSTILE_TOKEN: the server uses (or generates) the token file under --data
        env = {k: v for k, v in os.environ.items() if k != "TURNSTILE_TOKEN"}
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        out.close()
        self.token = self._read_token(self.proc)
        testbed.wait_healthy(self.url + "/v1/models", self.proc, timeout=120, headers=self.headers)
        return self

    def _read_token(self, proc: subprocess.Popen, timeout: float = 120.0) -> str:
        """The token the server wrote (or reused) under --data: written before it listens."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tok = read_token(self.data)
            if tok:
                return tok
            if proc.poll() is not None:
                raise RuntimeError(f"turnstile exited with {proc.returncode}: see {self.log}")
            time.sleep(0.05)
        raise TimeoutError(f"no token under {self.data} after {timeout}s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def session(self, **metadata: object) -> dict:
        r = self.http.post(self.url + "/v1/sessions", json={"metadata": metadata})
        r.raise_for_status()
        return r.json()

    def get(self, path: str) -> dict:
        r = self.http.get(self.url + path, timeout=30)
        r.raise_for_status()
        return r.json()

    def series(self, prefix: str) -> dict[tuple[str, tuple], float]:
        """The ``/metrics`` samples whose name starts with ``prefix``, read with Prometheus'
        own parser: ``(name, sorted labels without replica) -> value``."""
        from prometheus_client.parser import text_string_to_metric_families

        r = self.http.get(self.url + "/metrics")
        r.raise_for_status()
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                if s.name.startswith(prefix):
                    labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))
                    out[(s.name, labels)] = s.value
        return out

    def wait_series(
        self, prefix: str, name: str, labels: tuple, value: float, timeout: float = 60
    ) -> dict[tuple[str, tuple], float]:
        """Poll :meth:`series` until ``name{labels}`` reaches ``value``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.series(prefix)
            if got.get((name, labels), 0) >= value:
                return got
            time.sleep(0.2)
        raise AssertionError(f"{name}{labels} never reached {value}: {self.series(prefix)}")


@pytest.fixture
def turnstile_factory(tmp_path: Path) -> Iterator:
    started: list[Turnstile] = []

    def make(
        engine_url: str | list[str],
        model: Path,
        data: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> Turnstile:
        t = Turnstile(
            engine_url,
            model,
            data or tmp_path / "data",
            tmp_path / f"turnstile-{len(started)}.log",
            extra,
        )
        started.append(t)
        return t.start()

    yield make
    for t in started:
        t.stop()
        if t._http is not None:
            t._http.close()


@pytest.fixture
def turnstile(relay: Relay, tiny_qwen2: Path, turnstile_factory) -> Turnstile:
    """Turnstile → recording relay → llama-server (tiny Qwen2-vocab model)."""
    return turnstile_factory(relay.url, tiny_qwen2)


@pytest.fixture(scope="module")
def shared_relay(llama_tiny: str) -> Iterator[Relay]:
    """One recording relay for a whole module (see ``shared_turnstile``)."""
    with _relayed(llama_tiny) as rel:
        yield rel


@pytest.fixture(scope="module")
def shared_turnstile(
    shared_relay: Relay, tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Turnstile]:
    """One ``turnstile serve`` (on ``shared_relay``) for a whole module whose tests each work
    in sessions of their own and leave the server as they found it: a start costs ~4 s. A
    module opts in by defining ``turnstile`` (and ``relay``, when its tests read the relay)
    as these."""
    tmp = tmp_path_factory.mktemp("shared-turnstile")
    t = Turnstile(shared_relay.url, tiny_qwen2, tmp / "data", tmp / "turnstile.log").start()
    yield t
    t.stop()
    if t._http is not None:
        t._http.close()


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def postgres() -> Iterator:
    """A real PostgreSQL server (Debian's package), for the PostgreSQL record store."""
    from turnstile_testbed.postgres import PostgresServer

    server = PostgresServer().start()
    yield server
    server.remove()
