"""Group commit: the gateway's store writer with one transaction per call vs the calls that
queued behind a commit written in one transaction (``Store.write``), side by side in one
run, on the SQLite file and on PostgreSQL (loopback, fsync on).

The writer is driven as the gateway drives it: N agents on one event loop, each awaiting
``record.commit`` for its session's next call (the records of ``store_backends.py``: a
~500-token delta, 100 sampled tokens with logprobs), so a call is acknowledged only after
its transaction committed. ``per call`` is the same writer limited to one call per
transaction (``Writer.BATCH = 1``). Per call: this process's CPU (the loop and the writer
thread), the database server's CPU, commit latency p50/p99, calls/s, and the transactions
each database counted (SQLite: WAL commit frames; PostgreSQL: ``xact_commit``).

    python benchmarks/group_commit.py            # ~2 minutes
    python benchmarks/group_commit.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import _machine
import _report
import store_backends as sb

from turnstile.gateway import record
from turnstile.store.store import Store
from turnstile.store.writer import Writer

HERE = Path(__file__).resolve().parent


def _sessions(store: Store, n_agents: int, calls: int) -> list[list]:
    """Each agent's session and its calls' records, made before the clock starts."""
    out = []
    for k in range(n_agents):
        sid, parent, reused, recs = f"a{k}", None, 0, []
        store.create_session({}, sid)
        for seq in range(calls):
            recs.append(sb._record(sid, seq, parent, reused))
            parent, reused = recs[-1].id, reused + 600
        out.append(recs)
    return out


async def _agents(store: Store, sessions: list[list], lat: list[float]) -> None:
    async def agent(recs: list) -> None:
        for rec in recs:
            t0 = time.perf_counter()
            await record.committed(record.commit(store, rec), rec.session_id)
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(agent(recs) for recs in sessions))


def run(name: str, location: str, pg_pid: int | None, mode: str, agents: int, calls: int) -> dict:
    Writer.BATCH = 1 if mode == "per call" else 64
    store = Store(location)
    if store.path is not None:
        for db in (store._db, store._wdb):
            db.execute("PRAGMA wal_autocheckpoint=0")
        store._wdb.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = store._wdb.execute("PRAGMA page_size").fetchone()[0]
    else:  # the statistics reader commits too: its own share is read from a run of nothing
        noop0 = sb._pg_stats(location)[0]
        commits0 = sb._pg_stats(location)[0]
        noop = commits0 - noop0
    sessions = _sessions(store, agents, calls)
    lat: list[float] = []
    srv0, cpu0, t0 = sb._server_cpu(pg_pid), time.process_time(), time.perf_counter()
    asyncio.run(_agents(store, sessions, lat))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    srv = sb._server_cpu(pg_pid) - srv0
    n = len(lat)
    if store.path is not None:
        commits, _ = sb._wal_commits(Path(str(store.path) + "-wal"), page)
        commits -= agents  # the sessions' rows
        store.close()
    else:
        store.close()
        time.sleep(0.5)
        commits = sb._pg_stats(location)[0] - commits0 - noop - agents  # (and the sessions)
    return {
        "store": name,
        "writer": mode,
        "agents": agents,
        "calls": n,
        "CPU ms/call": cpu / n * 1000,
        "db server CPU ms": srv / n * 1000,
        "p50 ms": statistics.median(lat) * 1000,
        "p99 ms": _report.pct(lat, 99) * 1000,
        "calls/s": n / wall,
        "commits/call": commits / n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    from turnstile_testbed.postgres import PostgresServer

    print("# Group commit vs one transaction per call (the gateway's store writer)")
    print(f"machine: {_machine.machine()}")
    server = PostgresServer().start()
    rows = []
    try:
        with _machine.workdir("group-commit") as wd:
            for agents in (1, 4) if args.quick else (1, 8, 32, 256):
                calls = max(2, (40 if args.quick else 2000) // agents)
                for mode in ("per call", "group"):
                    where = wd / f"{agents}-{mode.replace(' ', '')}"
                    rows.append(run("sqlite", str(where), None, mode, agents, calls))
                    rows.append(
                        run("postgres", server.database(), server.proc.pid, mode, agents, calls)
                    )
    finally:
        server.remove()
    print(_report.table(list(rows[0]), [list(r.values()) for r in rows]))
    for store in ("sqlite", "postgres"):
        for agents in sorted({r["agents"] for r in rows}):
            got = {r["writer"]: r for r in rows if r["store"] == store and r["agents"] == agents}
            one, group = got["per call"], got["group"]
            print(
                f"{store} {agents} agents: group / per call: CPU "
                f"{group['CPU ms/call'] / one['CPU ms/call']:.2f}, commits "
                f"{group['commits/call'] / one['commits/call']:.2f}, calls/s "
                f"{group['calls/s'] / one['calls/s']:.2f}"
            )


if __name__ == "__main__":
    main()
