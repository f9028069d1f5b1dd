"""What recording routed experts (``serve --routed-experts``, issue 42) costs: server CPU per
call and bytes per token on disk with routing on, beside routing off, at coding-agent context
lengths, in one run.

One ``turnstile serve`` per arm (``--engine vllm``; by default two, the second with
``--routed-experts``) in front of one fake vLLM (this script, ``--serve-fake``):
``/inference/v1/generate`` answers a fixed thought + Hermes tool call
(``canary_cost.reply_spec``), and, where the request names ``routed_experts_prompt_start``, the
rows vLLM 0.32 would return: base64 of a ``.npy``
``(prompt + completion - 1 - start, 48, 8)`` uint8 (a Qwen3-30B-A3B-sized router: 48 MoE
layers, 8 of 128 experts), cut from random rows made with numpy (the fake's CPU is not counted).
Per cell, sessions open with a system prompt of the cell's context length (that first call,
the whole context's rows, is a warm-up), then turns that append the reply and a tool result
(each call asks the engine only for the rows after its parent's). Reported: the server
process's CPU per measured call (``/proc`` utime + stime, read once the server is idle after
the warm-up and after the last measured turn, so the store writer's work on the warm-up's rows
is not counted and that on the measured calls' is), the ratio over all ``--rounds`` and each
round's, and from each arm's SQLite file after the run: stored bytes per recorded token (the
file, and the ``arrays`` column alone) against the uint8 size of a token's routing (48 x 8 =
384 bytes).

The arms go turn by turn in lockstep (each turn to every arm's session, the order reversed each
turn), so the load of a shared machine, which drifts over seconds, falls on all alike. Beside
the ticks of ``/proc/PID/stat`` the table gives each arm's minor page faults and its threads'
time on a CPU (the scheduler's nanoseconds: the event loop's thread, the store's writer where
``--timed`` names it, the rest). ``--control`` runs both arms without routing: the ratio's
noise floor on a shared machine. ``--arms`` compares more servers in one run (``ARMS``: the
rows decoded then dropped, the rows never decoded, a transport-only engine, an older tree with
``--before``, a design prototype: ``segment``, each call's arrays in an ``O_DIRECT`` file
instead of SQLite); ``--timed`` patches every server to add up the CPU of each step between the
engine's answer and the commit; ``--floor`` writes the on arm's stored rows again with sqlite3
alone, with and without their arrays: what storing the rows durably costs before any of
Turnstile runs. ``--profile DIR`` py-spies each server over its measured turns
only and prints where the on arm's extra samples fall (wall samples of busy threads, not CPU:
a guide, not a figure).

    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --turns 150 --rounds 4
    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --rounds 4 --control
    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --sessions 1 \
        --turns 150 --rounds 2 --contexts 4000,110000 --arms off,on,drop,unread,aa --timed
    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --turns 150 \
        --rounds 3 --arms off,on,segment --floor
    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

import turnstile_testbed as testbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from canary_cost import OUTPUT, SYSTEM, TOKEN, TOOLS, model, reply_spec, start  # noqa: E402

LAYERS, TOPK, EXPERTS = 48, 8, 128
CONTEXTS = (4_000, 32_000, 110_000)  # tokens of context a session's turns run at


# --- the fake engine ------------------------------------------------------------------------


def serve_fake(port: int, spec_path: Path, always: int = 0) -> None:
    """``always``: answer every request with that many rows, asked or not (the transport
    ablation: the bytes cross HTTP and the JSON parse of a server that records nothing)."""
    from aiohttp import web

    spec = json.loads(spec_path.read_text())
    ids = spec["token_ids"]
    pool = np.random.default_rng(0).integers(0, EXPERTS, (4096, LAYERS, TOPK), dtype=np.uint8)

    def routing(n: int, start: int) -> str:
        rows = pool[np.arange(start, n - 1) % len(pool)]
        buf = io.BytesIO()
        np.save(buf, rows, allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode()

    async def generate(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if not body.get("token_ids"):
            return web.json_response({"error": "token_ids required"}, status=400)
        sp = body.get("sampling_params") or {}
        choice = {
            "index": 0,
            "token_ids": ids,
            "logprobs": {"content": [{"token_id": t, "logprob": -0.1} for t in ids]},
            "finish_reason": "stop",
            "stop_reason": None,
        }
        if always:
            total = len(body["token_ids"]) + len(ids)
            choice["routed_experts"] = routing(total, max(0, total - 1 - always))
        elif "routed_experts_prompt_start" in sp:
            total = len(body["token_ids"]) + len(ids)
            choice["routed_experts"] = routing(total, int(sp["routed_experts_prompt_start"]))
        usage = {"prompt_tokens": len(body["token_ids"]), "completion_tokens": len(ids)}
        answer = {"request_id": body.get("request_id"), "choices": [choice], "usage": usage}
        if not body.get("stream"):
            return web.json_response(answer)
        # streamed: the whole reply in one event, as a burst of tokens arrives
        sse = b"data: " + json.dumps(answer).encode() + b"\n\ndata: [DONE]\n\n"
        return web.Response(body=sse, content_type="text/event-stream")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "bench", "max_model_len": 262_144}]})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/inference/v1/generate", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", ok)
    app.router.add_get("/health", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


# --- the load -------------------------------------------------------------------------------


def system_prompt(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (the canary benchmark's, repeated)."""
    per = max(1, len(SYSTEM) // 4)  # ~4 characters per token on this text
    return SYSTEM * max(1, tokens // per)


# what :func:`usage` reads: user and system CPU (s, the process's ticks, dead threads
# included), minor page faults, and each thread group's time on a CPU (s, the scheduler's
# nanoseconds: the event loop's thread, the store's writer (known with --timed; else among
# the rest), the rest)
USAGE = ("user", "sys", "minflt", "loop", "writer", "others")
BEFORE = [""]  # --before DIR
THREADS: dict[int, dict[str, int]] = {}  # pid: each thread's ns at the last reading
RUNNING: dict[int, np.ndarray] = {}  # pid: loop, writer, others seconds so far
WRITERS: dict[int, set[str]] = {}  # pid: the ids of its store writer threads (--timed)
TIMED_FILES: dict[int, Path] = {}  # a --timed server's pid: the file of its steps' CPU


def usage(pid: int) -> np.ndarray:
    """A process's :data:`USAGE`. The per-thread times count live threads only: the store's
    writer lives on for seconds after its last write, so a cell's start and end both see it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    out = np.array([int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7]), 0, 0, 0.0])
    seen, last = {}, THREADS.setdefault(pid, {})
    run = RUNNING.setdefault(pid, np.zeros(3))
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):  # ended meanwhile
            continue
        seen[task.name] = ns  # each thread's time since the last reading, added up (a thread
        # that ended since then loses only what it ran after it: the writer ends when idle)
        at = 0 if task.name == str(pid) else 1 if task.name in WRITERS.get(pid, ()) else 2
        run[at] += (ns - last.get(task.name, 0)) / 1e9
    THREADS[pid] = seen
    out[3:6] = run
    steps = np.zeros(len(TIMED))
    if pid in TIMED_FILES and TIMED_FILES[pid].exists():
        got = json.loads(TIMED_FILES[pid].read_text())
        steps[:] = got["spent"]
        WRITERS[pid] = {str(t) for t in got["writers"]}
    return np.concatenate([out, steps])


async def settled(pid: int, quiet: float = 0.3, limit: float = 60.0) -> np.ndarray:
    """The process's :func:`usage` once it is idle for ``quiet`` seconds (its store writer
    done with the last record), or after ``limit`` seconds."""
    last, t0 = usage(pid), time.monotonic()
    while time.monotonic() - t0 < limit:
        await asyncio.sleep(quiet)
        now = usage(pid)
        if now[0] + now[1] == last[0] + last[1]:  # not a tick (10 ms) in ``quiet`` seconds
            return now
        last = now
    return last


def run_cell(
    arms: list[tuple[str, str, int]],
    context: int,
    sessions: int,
    turns: int,
    profile: Path | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """Each arm's server :func:`usage` over ``sessions`` sessions' measured turns (their
    first calls excluded). ``arms``: (name, url, pid). The arms go turn by turn in lockstep
    (the same session on each, the order reversed every turn), so that a shared machine's
    load, which drifts over seconds, falls on every arm alike. ``profile``: py-spy each
    server over those turns only (collapsed stacks to ``profile/NAME.*``)."""
    headers = {"authorization": f"Bearer {TOKEN}"}

    async def go() -> dict[str, np.ndarray]:
        async with httpx.AsyncClient(headers=headers, timeout=600) as client:
            cpu = {name: np.zeros(len(USAGE) + len(TIMED)) for name, _, _ in arms}
            for _ in range(sessions):
                base, msgs = {}, {}
                for name, url, _ in arms:
                    r = await client.post(url + "/v1/sessions", json={"metadata": {}})
                    r.raise_for_status()
                    base[name] = r.json()["base_url"]
                    msgs[name] = [
                        {"role": "system", "content": system_prompt(context)},
                        {"role": "user", "content": "The parser test fails; fix it."},
                    ]
                before: dict[str, np.ndarray] = {}
                spying: list[subprocess.Popen] = []
                for turn in range(turns + 1):
                    for name, _, _ in arms if turn % 2 == 0 else arms[::-1]:
                        body = {
                            "model": "bench",
                            "messages": msgs[name],
                            "tools": TOOLS,
                            "max_tokens": 256,
                        }
                        r = await client.post(base[name] + "/chat/completions", json=body)
                        if r.status_code != 200:
                            raise SystemExit(f"{name}: call failed: {r.status_code} {r.text[:300]}")
                        reply = r.json()["choices"][0]["message"]
                        tool_id = reply["tool_calls"][0]["id"]
                        content = OUTPUT + str(turn)
                        msgs[name] += [
                            reply,
                            {"role": "tool", "tool_call_id": tool_id, "content": content},
                        ]
                    if turn == 0:  # the first call (the whole context) is the warm-up:
                        for name, _, pid in arms:  # its record written (the store's writer
                            before[name] = await settled(pid)  # runs after the answer: 42
                            # MB of rows at 110k tokens)
                        if profile:
                            spying = [spy(profile / name, pid) for name, _, pid in arms]
                for name, _, pid in arms:  # the measured turns, their records written
                    cpu[name] += await settled(pid) - before[name]
                for p in spying:
                    p.send_signal(signal.SIGINT)  # it writes its file then
                    p.wait(60)
            return cpu

    return asyncio.run(go()), sessions * turns


def stored(data: Path) -> dict:
    """Tokens recorded, the file's bytes and the arrays column's bytes of one arm's store."""
    db = sqlite3.connect(data / "turnstile.sqlite3")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    tokens, arrays = db.execute(
        "SELECT sum(length(prompt_delta) + length(completion_ids)) / 4, "
        "coalesce(sum(length(arrays)), 0) FROM calls"
    ).fetchone()
    pages = (
        db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    )
    infos = [json.loads(r[0]) for r in db.execute("SELECT info FROM calls")]
    db.close()
    asked = [i.get("arrays_asked", {}).get("routed_experts") for i in infos]
    arrays += sum(i["arrays_at"][1] for i in infos if "arrays_at" in i)  # the segment arm's
    return {"tokens": tokens, "file": pages, "arrays": arrays, "asked": asked}


def floor(data: Path, synchronous: str, tmp: Path, limit: int = 600) -> dict[str, float]:
    """The storage's own floor: the routing arm's measured calls' rows, as stored, written
    again bare (no gateway, no Python beside ``sqlite3``) into fresh files of the store's own
    schema and pragmas (WAL, ``synchronous``), one row a transaction as the server's lockstep
    turns commit them; each row twice, interleaved: with its ``arrays`` and with NULL there.
    CPU (``thread_time``: user + kernel) a commit, us."""
    src = sqlite3.connect(data / "turnstile.sqlite3")
    schema = [
        sql
        for (sql,) in src.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
            "ORDER BY type = 'table' DESC, rowid"
        )
    ]
    names = [r[1] for r in src.execute("PRAGMA table_info(calls)")]
    rows = src.execute(  # the measured turns' (a session's first call, the warm-up, has none)
        f"SELECT * FROM calls WHERE parent_id IS NOT NULL ORDER BY rowid LIMIT {limit}"
    ).fetchall()
    src.close()
    at = names.index("arrays")
    dbs = {}
    for arm in ("with", "without"):
        db = sqlite3.connect(tmp / f"floor-{arm}.sqlite3", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        for sql in schema:
            db.execute(sql)
        dbs[arm] = db
    spent = {"with": 0.0, "without": 0.0}
    insert = f"INSERT INTO calls VALUES ({', '.join('?' * len(names))})"
    for i, row in enumerate(rows):
        for arm in ("with", "without") if i % 2 else ("without", "with"):
            values = row if arm == "with" else (*row[:at], None, *row[at + 1 :])
            t0 = time.thread_time()
            dbs[arm].execute("BEGIN IMMEDIATE")
            dbs[arm].execute(insert, values)
            dbs[arm].execute("COMMIT")
            spent[arm] += time.thread_time() - t0
    for db in dbs.values():
        db.close()
    n = max(1, len(rows))
    arrays = sum(len(r[at] or b"") for r in rows) / n
    return {"with": 1e6 * spent["with"] / n, "without": 1e6 * spent["without"] / n,
            "rows": len(rows), "arrays": arrays}  # fmt: skip


def spy(out: Path, pid: int) -> subprocess.Popen:
    """py-spy (the venv's) on a server until SIGINT; collapsed stacks appended to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("py-spy")
    part = out.with_name(f"{out.name}.{time.monotonic_ns()}")
    return subprocess.Popen(
        [
            str(exe),
            "record",
            "--pid",
            str(pid),
            "--rate",
            "1000",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(part),
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# where a sample's time goes: the first of these (leaf up) its stack passes through
BUCKETS = (
    ("routing: read (base64, .npy header, checks)", ("turnstile/engines/routing.py",)),
    ("store: pack", ("turnstile/token_arrays.py",)),
    ("store: writer thread (SQLite)", ("turnstile/store/writer.py", "turnstile/store/writes.py")),
    ("engine answer: JSON", ("turnstile/engines/vllm_reader.py", "json_object (")),
    ("engine HTTP (connection)", ("turnstile/engines/connection.py",)),
    ("harness request (parse, template)", ("turnstile/dialects/", "turnstile/chat/")),
)


def profile_table(out: Path) -> str:
    """Samples per bucket in each arm (busy samples only), and the on arm's extra."""
    got: dict[str, dict[str, int]] = {}
    for name in ("off", "on"):
        counts: dict[str, int] = {}
        text = "".join(f.read_text() for f in sorted(out.glob(f"{name}.*")))
        (out / f"{name}.txt").write_text(text)
        for line in text.splitlines():
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")[::-1]
            where = "other"
            for f in frames:
                hit = next((label for label, keys in BUCKETS if any(k in f for k in keys)), None)
                if hit is not None:
                    where = hit
                    break
            counts[where] = counts.get(where, 0) + int(n)
        got[name] = counts
    labels = [b[0] for b in BUCKETS] + ["other"]
    rows = [
        "| where (py-spy samples, measured turns) | off | on | on - off |",
        "|---|---|---|---|",
    ]
    for label in labels:
        a, b = got["off"].get(label, 0), got["on"].get(label, 0)
        rows.append(f"| {label} | {a} | {b} | {b - a:+d} |")
    a, b = sum(got["off"].values()), sum(got["on"].values())
    rows.append(f"| all | {a} | {b} | {b - a:+d} ({(b - a) / max(a, 1):+.1%}) |")
    return "\n".join(rows)


# The arms a run may compare (``--arms``): name -> (routing on, what the server leaves out,
# extra environment). Each is its own ``turnstile serve`` on its own store; the first named is
# the base the others are divided by.
# glibc's heap left as it grows: no trim of its top, nothing under 32 MB mmapped (page faults
# and the allocator's returns to the kernel, against the rows' 60-90 KB buffers)
HEAP = {
    "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432"
}
ARMS: dict[str, tuple[bool, str | None, dict]] = {
    "off": (False, None, {}),
    "on": (True, None, {}),
    "aa": (False, None, {}),  # a second off: the A/A control
    # the rows decoded and checked (routing.read), then dropped before the record
    "drop": (True, "drop", {}),
    # the rows asked for and sent, the field parsed with the answer, never decoded or stored
    "unread": (True, "unread", {}),
    # routing off, but its engine (a second fake) sends 160 rows with every answer
    "transport": (False, None, {}),
    # routing on, each call's arrays in an O_DIRECT segment file, not SQLite (``segment``)
    "segment": (True, "segment", {}),
    "off-heap": (False, None, HEAP),
    "on-heap": (True, None, HEAP),
    # routing on, the ``turnstile`` package from ``--before DIR`` (an older tree, e.g. ``git
    # archive REV turnstile | tar -x -C DIR``): a change and what it replaced, in one run
    "before": (True, None, {}),
}


# ``--timed``: each arm's server adds up the CPU (``thread_time``) of these steps, and the
# table shows them per call: where between the answer's bytes and the commit the time goes
TIMED = (
    "engine bytes in (http parse)",
    "answer JSON (feed_whole)",
    "finish (routing.read)",
    "record build",
    "writer: call_rows (pack)",
    "writer: Store.write (SQLite)",
)


def timed(path: str) -> None:
    """Patch this (server) process to time :data:`TIMED`, written to ``path`` after each
    store write (the benchmark reads it once the server is idle)."""
    import threading

    from turnstile.engines import connection, vllm_reader
    from turnstile.gateway.token_in import call
    from turnstile.store import store, writes

    spent = [0.0] * len(TIMED)
    writers: set[int] = set()
    lock = threading.Lock()

    def wrap(owner: object, attr: str, at: int) -> None:
        real = getattr(owner, attr)

        def step(*a: object, **kw: object) -> object:
            t0 = time.thread_time()
            try:
                return real(*a, **kw)
            finally:
                spent[at] += time.thread_time() - t0

        setattr(owner, attr, step)

    wrap(connection._Connection, "data_received", 0)
    wrap(vllm_reader.Reader, "feed_whole", 1)
    wrap(vllm_reader.Reader, "finish", 2)
    wrap(call, "build_record", 3)
    wrap(store, "call_rows", 4)
    wrap(store.Store, "write", 5)
    real_write = store.Store.write

    def write(*a: object, **kw: object) -> object:
        try:
            return real_write(*a, **kw)
        finally:
            with lock:
                writers.add(threading.get_native_id())
                Path(path).write_text(json.dumps({"spent": spent, "writers": sorted(writers)}))

    store.Store.write = write  # type: ignore[method-assign]
    del writes


def segment(path: Path) -> None:
    """A design prototype, not Turnstile's store: each call's arrays blob written to a segment
    file with ``O_DIRECT | O_DSYNC`` (one DMA write, no page-cache copy, durable when the
    write returns, in 4 KB blocks) by the store's writer before the call's row commits, the row
    keeping only where (``info.arrays_at``). What the rows' storage would cost out of SQLite's
    WAL, which writes each page twice (the log, then the checkpoint) through the page cache.
    No read path, no reclaim, one process: a measurement, not a store."""
    import mmap

    from turnstile.store import store
    from turnstile.token_arrays import pack

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o600)
    except OSError:  # a file system without O_DIRECT (tmpfs): the same writes, buffered
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DSYNC, 0o600)
    block = mmap.mmap(-1, 4 << 20)  # page-aligned, as O_DIRECT asks of the buffer
    at = [0]
    real = store.call_rows

    def call_rows(w: object, keep: bool, fields: dict) -> object:
        c = w.record  # type: ignore[attr-defined]
        blob = pack(c.arrays) if c.arrays else None
        if blob and len(blob) <= len(block):
            size = -(-len(blob) // 4096) * 4096
            block[: len(blob)] = blob
            os.pwrite(fd, memoryview(block)[:size], at[0])
            c.info["arrays_at"] = [at[0], len(blob)]
            at[0] += size
            c.arrays = {}
        return real(w, keep, fields)  # type: ignore[arg-type]

    store.call_rows = call_rows  # type: ignore[assignment]


def ablate(what: str) -> None:
    """Patch this (server) process before ``turnstile serve`` starts (``--arm-patch``)."""
    from turnstile.engines import vllm_reader

    if what == "segment":
        segment(Path(os.environ["ROUTED_COST_SEGMENT"]))
    if os.environ.get("ROUTED_COST_TIMED"):
        timed(os.environ["ROUTED_COST_TIMED"])
    if what in ("timed", "segment"):
        return
    real = vllm_reader.read_routing

    def drop(raw: object, **kw: object) -> tuple[None, dict]:
        _, said = real(raw, **kw)  # type: ignore[arg-type]
        return None, said  # the rows read, then dropped before the record

    def unread(raw: object, **kw: object) -> tuple[None, dict]:
        return None, {"asked": True, "from": kw["start"], "rows": None, "note": "ablation"}

    vllm_reader.read_routing = {"drop": drop, "unread": unread}[what]  # type: ignore[assignment]


def serve_arm(
    name: str, engine: str, tmp: Path, synchronous: str = "full", steps: bool = False
) -> tuple[str, object]:
    routing, patch, extra = ARMS[name]
    if name == "before":
        extra = {
            **extra,
            "PYTHONPATH": os.pathsep.join([BEFORE[0], os.environ.get("PYTHONPATH", "")]),
        }
    if name == "segment":
        extra = {**extra, "ROUTED_COST_SEGMENT": str(tmp / "segment.bin")}
    if steps:
        patch = patch or "timed"
        extra = {**extra, "ROUTED_COST_TIMED": str(tmp / f"timed-{name}.json")}
    port = testbed.free_port()
    url = f"http://127.0.0.1:{port}"
    head = [sys.executable, __file__, "--arm-patch", patch, "--"] if patch else [
        sys.executable, "-m", "turnstile"]  # fmt: skip
    cmd = [
        *head, "serve",
        "--engine", "vllm", "--vllm-api", "generate",
        "--engine-logprobs-mode", "processed_logprobs",
        "--engine-url", engine, "--model", str(model()), "--served-model-name", "bench",
        "--data", str(tmp / f"data-{name}"), "--port", str(port), "--engine-timeout", "120",
        "--synchronous", synchronous,
        *(["--routed-experts"] if routing else []),
    ]  # fmt: skip
    env = {**os.environ, "TURNSTILE_TOKEN": TOKEN, **extra}
    return url, start(cmd, url + "/v1/models", tmp / f"turnstile-{name}.log", env)


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--arm-patch":  # a patched server (ARMS)
        import runpy

        ablate(sys.argv[2])
        sys.argv = ["turnstile", *sys.argv[4:]]
        runpy.run_module("turnstile", run_name="__main__", alter_sys=True)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--quick", action="store_true", help="1 session of 10 turns per cell")
    p.add_argument("--rounds", type=int, default=1, help="repeat the cells")
    p.add_argument(
        "--control",
        action="store_true",
        help="A/A: both arms without routing (the ratio's noise floor on this machine)",
    )
    p.add_argument(
        "--arms",
        type=lambda v: v.split(","),
        default=None,
        help=f"the arms to compare, the first the base (default off,on; of {', '.join(ARMS)})",
    )
    p.add_argument(
        "--contexts",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=CONTEXTS,
        help="the cells' context lengths in tokens (default %(default)s)",
    )
    p.add_argument(
        "--synchronous",
        choices=["full", "normal"],
        default="full",
        help="both servers' SQLite durability (serve --synchronous; full: an fsync a commit)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy each arm's server over the measured cells (DIR/off.txt, DIR/on.txt: "
        "collapsed stacks) and print where the on arm's extra samples go",
    )
    p.add_argument(
        "--transport-only",
        action="store_true",
        help="ablation: the on arm records no routing, but its engine (a second fake) sends "
        "160 rows with every answer: what the bytes' way in costs without reading or storing",
    )
    p.add_argument(
        "--timed",
        action="store_true",
        help="each server adds up the CPU of the steps between the engine's answer and the "
        "commit (thread_time; a patched server) and the table shows them per call",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="after the run, write the on arm's stored rows again bare (sqlite3 alone), with "
        "and without their arrays: what storing the rows costs before any of Turnstile runs",
    )
    p.add_argument(
        "--before",
        metavar="DIR",
        default="",
        help="the 'before' arm's turnstile package comes from DIR (DIR/turnstile)",
    )
    p.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--always", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake, args.spec, args.always)
        return
    if args.quick:
        args.sessions, args.turns = 1, 10
    names = args.arms or (
        ["off", "aa"] if args.control else ["off", "transport"] if args.transport_only else
        ["off", "on"]
    )  # fmt: skip
    unknown = [n for n in names if n not in ARMS]
    BEFORE[0] = args.before
    if "before" in names and not Path(args.before, "turnstile").is_dir():
        raise SystemExit("the 'before' arm needs --before DIR (DIR/turnstile)")
    if unknown or len(set(names)) != len(names) or len(names) < 2:
        raise SystemExit(f"--arms: two or more of {', '.join(ARMS)}, each once (not {names})")
    with tempfile.TemporaryDirectory(prefix="routed-cost-") as d:
        tmp = Path(d)
        spec = tmp / "spec.json"
        spec.write_text(json.dumps(reply_spec()))
        eport = testbed.free_port()
        engine = f"http://127.0.0.1:{eport}"
        fake = start(
            [sys.executable, __file__, "--serve-fake", str(eport), "--spec", str(spec)],
            engine + "/health",
            tmp / "engine.log",
        )
        procs = []
        try:
            arms = []
            for name in names:
                where = engine
                if name == "transport":  # a second fake that always sends rows
                    port2 = testbed.free_port()
                    where = f"http://127.0.0.1:{port2}"
                    cmd = [
                        sys.executable,
                        __file__,
                        "--serve-fake",
                        str(port2),
                        "--spec",
                        str(spec),
                    ]
                    procs.append(
                        start([*cmd, "--always", "160"], where + "/health", tmp / "e2.log")
                    )
                url, proc = serve_arm(name, where, tmp, args.synchronous, args.timed)
                procs.append(proc)
                if args.timed:
                    TIMED_FILES[proc.pid] = tmp / f"timed-{name}.json"  # type: ignore[attr-defined]
                arms.append((name, url, proc))
            pids = [(name, url, proc.pid) for name, url, proc in arms]  # type: ignore[attr-defined]
            run_cell(pids, 2_000, 1, 1)  # warm: template, tokenizer
            cells: dict[int, list[dict]] = {c: [] for c in args.contexts}
            for _ in range(args.rounds):
                for context in args.contexts:
                    use, calls = run_cell(pids, context, args.sessions, args.turns, args.profile)
                    cells[context].append({name: u / calls for name, u in use.items()})
        finally:
            for proc in procs:
                proc.terminate()  # type: ignore[attr-defined]
                proc.wait(15)  # type: ignore[attr-defined]
            fake.terminate()
            fake.wait(15)
        disk = {name: stored(tmp / f"data-{name}") for name in names}
        bare = (
            floor(tmp / "data-on", args.synchronous, tmp) if args.floor and "on" in names else None
        )
    base, others = names[0], names[1:]
    print(
        f"\n{args.sessions} session(s) x {args.turns} measured turns per cell; routing "
        f"{LAYERS} layers x top-{TOPK} of {EXPERTS} experts (uint8: {LAYERS * TOPK} bytes a "
        "token); one turnstile serve per arm, same fake vLLM, the arms in lockstep turn by "
        f"turn (ABBA); arms {', '.join(names)}\n"
    )
    print(
        f"| context (tokens) | arm | CPU per call (ms) | / {base} (all {args.rounds} rounds) | "
        "each round | user / sys (ms) | loop / writer / other threads (ms, on a CPU) | "
        f"on a CPU / {base} | minor faults per call |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for context, got in cells.items():
        a = np.mean([g[base] for g in got], axis=0)
        for name in names:
            b = np.mean([g[name] for g in got], axis=0)
            ratio = f"{(b[0] + b[1]) / (a[0] + a[1]):.3f}x" if name != base else "-"
            each = " ".join(
                f"{(g[name][0] + g[name][1]) / (g[base][0] + g[base][1]):.3f}" for g in got
            ) if name != base else ""  # fmt: skip
            sched = f"{b[3:].sum() / a[3:].sum():.3f}x" if name != base else "-"
            print(
                f"| {context:,} | {name} | {1000 * (b[0] + b[1]):.3f} | {ratio} | {each} | "
                f"{1000 * b[0]:.3f} / {1000 * b[1]:.3f} | {1000 * b[3]:.3f} / "
                f"{1000 * b[4]:.3f} / {1000 * b[5]:.3f} | {sched} | {b[2]:.1f} |"
            )
    if args.timed:
        print()
        print(f"| context | step (CPU per call, us) | {' | '.join(names)} |")
        print("|---|---|" + "---|" * len(names))
        for context, got in cells.items():
            for i, step in enumerate(TIMED):
                at = len(USAGE) + i
                each = [1e6 * np.mean([g[n][at] for g in got]) for n in names]
                print(f"| {context:,} | {step} | {' | '.join(f'{v:.0f}' for v in each)} |")
    print()
    print(
        "| arm | tokens recorded | file bytes / token | arrays bytes / token | "
        "arrays / uint8 routing size |"
    )
    print("|---|---|---|---|---|")
    for name, s in disk.items():
        per = s["arrays"] / s["tokens"]
        print(
            f"| {name} | {s['tokens']:,} | {s['file'] / s['tokens']:.1f} | {per:.1f} | "
            f"{per / (LAYERS * TOPK):.4f} |"
        )
    if bare is not None:
        extra = bare["with"] - bare["without"]
        print()
        print(
            f"The storage's floor (`--floor`): the on arm's {bare['rows']} stored rows "
            f"({bare['arrays'] / 1024:.1f} KB of arrays a row) written again bare, one a "
            "transaction, with and without their arrays (us a commit, user + kernel):"
        )
        print()
        print("| without arrays | with | the rows' own write | / the off arm's call, by context |")
        print("|---|---|---|---|")
        share = ", ".join(
            f"{c:,}: +{extra / (1e6 * np.mean([sum(g[base][:2]) for g in got])):.1%}"
            for c, got in cells.items()
        )
        print(f"| {bare['without']:.0f} | {bare['with']:.0f} | +{extra:.0f} | {share} |")
    if args.profile and {"off", "on"} <= set(names):
        print()
        print(profile_table(args.profile))
    for name in others:
        routing, patch, _ = ARMS[name]
        missing = [a for a in disk[name]["asked"] if not a or a.get("rows") is None]
        if routing and patch in (None, "segment") and missing:
            raise SystemExit(f"{name}: {len(missing)} call(s) recorded no routing: {missing[:2]}")


if __name__ == "__main__":
    main()
