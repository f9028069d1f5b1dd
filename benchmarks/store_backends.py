"""What the record store costs per call: the embedded SQLite file next to a PostgreSQL database
(Debian's server on loopback, fsync on), side by side in one run.

1. The store alone (in process): sessions of agent turns (a ~500-token prompt delta, a
   100-token completion with logprobs, the parsed message and a call's usual ``info``),
   written with ``Store.add_call`` from 1 and from 8 threads (a gateway's writer threads).
   Agents run sessions of 20 calls. Token IDs, logprobs and hashes are random (incompressible).
   Per call: wall time of the commit (p50/p99), the writer's CPU, the database server's CPU
   (PostgreSQL's processes; SQLite has none), transactions committed (PostgreSQL's own
   ``pg_stat_database.xact_commit``; SQLite: WAL commit frames counted from the WAL file's
   frame headers), bytes appended to the write-ahead log, and the stored bytes.
1b. A fleet's replicas: 1 and 4 processes, each its own ``Store``, writing one database at
   once (SQLite: one file, one write lock across processes; PostgreSQL: one connection each).
2. The gateway end to end: ``overhead.py``'s agent workload through a real Turnstile server
   in front of the fake engine, once with ``--data`` (SQLite) and once with ``--store``
   (PostgreSQL): the gateway's CPU per call, the database server's CPU per call, latency.

    python benchmarks/store_backends.py            # ~3 minutes
    python benchmarks/store_backends.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import random
import statistics
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import _machine
import _report
import _servers
import _workload
import psutil
import psycopg

from turnstile.store.records import CallRecord
from turnstile.store.store import Store

HERE = Path(__file__).resolve().parent

INFO = {
    "model": "qwen2.5-7b-instruct",
    "engine": {"kind": "vllm", "url": "http://10.0.0.7:8000", "request_id": "gen-7f3a9c21"},
    "template": "sha256:4c1e0b7d9a2f+think-strip",
    "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 1024, "seed": 1234},
    "usage": {"prompt_tokens": 6120, "completion_tokens": 100, "cached_tokens": 5620},
    "timings": {"queue_ms": 0.4, "engine_ms": 812.3, "own_ms": 2.9, "render_ms": 0.6},
    "weight_version": "step-000412",
    "parse": {"status": "ok", "family": "hermes", "tool_calls": 1},
    "dialect": "chat",
    "finish": {"reason": "tool_calls", "stop_token_id": 151645},
}
MESSAGE = {
    "role": "assistant",
    "content": "Let me look at the failing test first.",
    "tool_calls": [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"cmd": "pytest -x tests/test_io.py"}'},
        }
    ],
}


TURNS = 20  # calls per agent session before it ends and a new one starts
_rng = random.Random(0)


def _record(sid: str, seq: int, parent: str | None, reused: int) -> CallRecord:
    """A call as a gateway records it, with incompressible token IDs, logprobs and hashes
    (PostgreSQL compresses large values: zeros or ranges would flatter it)."""
    delta, completion = 500, 100
    return CallRecord(
        id=f"{sid}-c{seq}",
        session_id=sid,
        seq=seq,
        parent_id=parent,
        segment_reason=None if parent else "first_call",
        reused_prefix_len=reused,
        prompt_delta=array("i", (_rng.randrange(151_000) for _ in range(delta))),
        completion_ids=array("i", (_rng.randrange(151_000) for _ in range(completion))),
        completion_logprobs=array("f", (-_rng.expovariate(2.0) for _ in range(completion))),
        finish_reason="tool_calls",
        stop_token_id=151645,
        seam="<|im_end|>\n",
        status="ok",
        error=None,
        message=MESSAGE,
        history_hash=_rng.randbytes(8),
        prefix_hashes=[_rng.randbytes(8) for _ in range(2 * seq + 2)],  # one per message
        info=INFO,
        created=time.time(),
    )


def _pg_stats(url: str) -> tuple[int, int, int]:
    """(commits, WAL position, database size) as PostgreSQL counts them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]
        lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    return int(commits), int(lsn), int(size)


def _wal_commits(wal: Path, page_size: int) -> tuple[int, int]:
    """(commit frames, bytes) in an SQLite WAL file: a frame whose header's second field
    (database size after commit) is non-zero ends a transaction."""
    raw = wal.read_bytes() if wal.exists() else b""
    frame = 24 + page_size
    commits = sum(
        1 for off in range(32, len(raw) - frame + 1, frame) if raw[off + 4 : off + 8] != bytes(4)
    )
    return commits, len(raw)


def _server_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def store_alone(name: str, location: str, pg_pid: int | None, calls: int, threads: int) -> dict:
    store = Store(location)
    if store.path is not None:  # the WAL is the log: keep every frame of the run to count
        for db in (store._db, store._wdb):  # (either connection's commit may checkpoint)
            db.execute("PRAGMA wal_autocheckpoint=0")
        store._wdb.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = store._wdb.execute("PRAGMA page_size").fetchone()[0]
        size0 = store.path.stat().st_size
    else:  # the statistics reader commits too: its own share is read from a run of nothing
        noop0 = _pg_stats(location)[0]
        time.sleep(0.5)
        commits0, lsn0, size0 = _pg_stats(location)
        noop = commits0 - noop0
        time.sleep(0.5)
    srv0 = _server_cpu(pg_pid)
    cpu: list[float] = []
    lat: list[float] = []
    per_thread = calls // threads

    def writer(k: int) -> None:
        """4 agents taking turns, each a session of TURNS calls, then a new session."""
        agents = [[f"{name}-t{threads}-w{k}-a{a}", None, 0, 0, 0] for a in range(4)]
        for a in agents:
            store.create_session({}, a[0] + "-0")
        for n in range(per_thread):
            a = agents[n % 4]
            base, parent, reused, seq, gen = a
            sid = f"{base}-{gen}"
            rec = _record(sid, seq, parent, reused)
            t0, c0 = time.perf_counter(), time.thread_time()
            store.add_call(rec, session_created=None)
            cpu.append(time.thread_time() - c0)
            lat.append(time.perf_counter() - t0)
            a[1:4] = [rec.id, reused + 600, seq + 1]
            if seq + 1 == TURNS:
                a[1:5] = [None, 0, 0, gen + 1]
                store.create_session({}, f"{base}-{gen + 1}")

    t0 = time.perf_counter()
    pool = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    n = len(lat)
    srv = _server_cpu(pg_pid) - srv0
    if store.path is not None:
        commits, wal_bytes = _wal_commits(Path(str(store.path) + "-wal"), page)
        store._wdb.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = store.path.stat().st_size - size0
        store.close()
    else:
        store.close()  # a backend reports its commits to the statistics as it exits
        time.sleep(0.5)
        commits1, lsn1, size1 = _pg_stats(location)
        commits, wal_bytes, size = commits1 - commits0 - noop, lsn1 - lsn0, size1 - size0
    return {
        "store": name,
        "threads": threads,
        "calls": n,
        "p50 ms": statistics.median(lat) * 1000,
        "p99 ms": _report.pct(lat, 99) * 1000,
        "writer CPU ms": sum(cpu) / n * 1000,
        "db server CPU ms": srv / n * 1000,
        "calls/s": n / wall,
        "commits/call": commits / n,
        "log KB/call": wal_bytes / n / 1024,
        "stored KB/call": size / n / 1024,
    }


def _writer_process(location: str, tag: str, calls: int, out: Any) -> None:
    store = Store(location)
    base, parent, reused, seq, gen = tag, None, 0, 0, 0
    store.create_session({}, f"{base}-0")
    lat = []
    start = time.time()  # (wall clock: comparable across the processes)
    for _ in range(calls):
        rec = _record(f"{base}-{gen}", seq, parent, reused)
        t0 = time.perf_counter()
        store.add_call(rec)
        lat.append(time.perf_counter() - t0)
        parent, reused, seq = rec.id, reused + 600, seq + 1
        if seq == TURNS:
            parent, reused, seq, gen = None, 0, 0, gen + 1
            store.create_session({}, f"{base}-{gen}")
    out.put((start, time.time(), lat))
    store.close()


def fleet_writes(name: str, location: str, procs: int, calls: int) -> dict:
    """``procs`` gateway processes, each with its own Store, writing one database at once
    (the replicas of a fleet): commits per second in total, and each commit's wall time."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_writer_process, args=(location, f"{name}-p{procs}-{i}", calls, out))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    got = []
    while len(got) < len(workers):  # a writer that died is named, not waited for
        try:
            got.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if dead:
                for w in workers:
                    w.kill()
                raise SystemExit(
                    f"FAILED: a writer process exited {dead[0]} (its error above)"
                ) from None
    for w in workers:
        w.join()
    lat = [x for _, _, ls in got for x in ls]
    wall = max(g[1] for g in got) - min(g[0] for g in got)  # from the first write to the last
    return {
        "store": name,
        "writer processes": procs,
        "calls": len(lat),
        "p50 ms": statistics.median(lat) * 1000,
        "p99 ms": _report.pct(lat, 99) * 1000,
        "commits/s (all)": len(lat) / wall,
    }


class WithDatabase:
    """A gateway server whose CPU counts with its database server's (for overhead.Target)."""

    def __init__(self, server: _machine.Server, pg_pid: int):
        self.server, self.pg_pid = server, pg_pid
        self.db_cpu = 0.0

    def cpu_pair(self) -> tuple[float, float]:
        own = self.server.cpu_pair()
        db = _server_cpu(self.pg_pid)
        return own[0] + db, own[1] + db

    def stop(self) -> None:
        self.server.stop()


def end_to_end(pg_url: str, pg_pid: int, quick: bool, wd: Path) -> list[dict]:
    import json

    import overhead as o

    spec = wd / "spec.json"
    spec.write_text(json.dumps(_workload.reply_spec(64)))
    fake, fake_url = _servers.start_fake(spec, o.LOADGEN_CPU, wd / "fake.log")
    servers: list = [fake]
    try:
        lite, lite_url = _servers.start_turnstile(fake_url, wd / "data", o.PROXY_CPU, wd / "ts.log")
        pg, pg_gw = _servers.start_turnstile(fake_url, pg_url, o.PROXY_CPU, wd / "ts-pg.log")
        servers += [lite, pg]
        targets = [
            o.Target("turnstile-sqlite", lite_url, lite, _servers.TOKEN),
            o.Target("turnstile-pg", pg_gw, pg, _servers.TOKEN),
            o.Target("turnstile-pg+db", pg_gw, WithDatabase(pg, pg_pid), _servers.TOKEN),
        ]
        concs = [2] if quick else [1, 32]
        base = _workload.base_messages(pad_to=3500)
        rows = asyncio.run(o.measure(targets, ["plain"], concs, quick, base, fake_url, 0.0))
        errors = sum(r["errors"] for r in rows)
        problems = [f"{errors} calls failed"] if errors else o.check_records(targets, fake_url, wd)
        if problems:
            raise SystemExit("FAILED:\n  " + "\n  ".join(problems[:20]))
        return rows
    finally:
        for s in reversed(servers):
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    from turnstile_testbed.postgres import PostgresServer

    print("# The record store per call: SQLite file vs PostgreSQL (loopback, fsync on)")
    print(f"machine: {_machine.machine()}")
    server = PostgresServer().start()
    try:
        with _machine.workdir("store-backends") as wd:
            calls = 200 if args.quick else 4000
            rows = []
            for threads in (1, 8):
                lite = str(wd / f"lite{threads}")
                rows.append(store_alone("sqlite", lite, None, calls, threads))
                pg = server.database()
                rows.append(store_alone("postgres", pg, server.proc.pid, calls, threads))
            print(
                _report.table(
                    list(rows[0]), [list(r.values()) for r in rows], "## 1. The store alone"
                )
            )
            fleet = []
            for procs in (1, 4):
                n = (100 if args.quick else 1000) // procs
                fleet.append(fleet_writes("sqlite", str(wd / f"fleet{procs}"), procs, n))
                fleet.append(fleet_writes("postgres", server.database(), procs, n))
            print(
                _report.table(
                    list(fleet[0]),
                    [list(r.values()) for r in fleet],
                    "## 1b. Gateway processes writing one store at once (a fleet's replicas)",
                )
            )
            e2e = end_to_end(server.database(), server.proc.pid, args.quick, wd)
            head = ["target", "conc", "calls", "CPU ms/call", "p50 ms", "p99 ms", "calls/s"]
            table = [
                [r["target"], r["conc"], r["calls"], r["cpu_ms"], r["p50"], r["p99"], r["rps"]]
                for r in e2e
            ]
            print(
                _report.table(
                    head, table, "## 2. The gateway end to end (non-streaming agent turns)"
                )
            )
            for conc in sorted({r["conc"] for r in e2e}):
                got = {r["target"]: r["cpu_ms"] for r in e2e if r["conc"] == conc}
                lite_ms = got["turnstile-sqlite"]
                print(
                    f"conc {conc}: gateway CPU pg/sqlite {got['turnstile-pg'] / lite_ms:.2f}; "
                    f"gateway+database pg/sqlite {got['turnstile-pg+db'] / lite_ms:.2f}"
                )
    finally:
        server.remove()


if __name__ == "__main__":
    main()
