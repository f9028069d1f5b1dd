"""Memory and disk per recorded token: 1,000 concurrent sessions of 32k tokens.

Set-up (printed with the results): the real Gateway in this process (Qwen2 tokenizer, Qwen2.5
template, SQLite store, the per-session call trees it keeps in memory), driven call by call
through ``Gateway.complete`` against an in-process engine that samples 64 tokens (a thought +
a tool call) per call; each turn the harness appends the reply and a tool output, so every
call records ~500 new tokens (the prompt delta + the completion). Sessions advance round-robin,
so all of them are open at once, as in a rollout batch.

Measured: live bytes the gateway holds per recorded token (tracemalloc over the whole build,
after a full garbage collection; the store's own page cache is outside Python and bounded by
SQLite's cache size), the RSS growth per token for comparison, and the SQLite file size (after
a WAL checkpoint) per recorded token. Tool outputs are 64 distinct texts shared across sessions
and their token IDs are computed once (memoized here: this benchmark measures memory, not
tokenizer CPU; what the gateway stores is the same).

    python benchmarks/memory.py            # 1,000 sessions x 32k tokens (a few minutes)
    python benchmarks/memory.py --quick    # 20 sessions x 4k tokens
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import time
import tracemalloc

import _inprocess
import _machine
import _report
import _workload


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def build(
    gw,
    sessions: int,
    tokens: int,
    outputs: list[str],  # noqa: ANN001
    prefix: str = "mem",
) -> int:
    from long_session import as_sent

    from turnstile.dialects.chat.answer import completion
    from turnstile.dialects.chat.request import parse_chat_request

    histories = {f"{prefix}-{i:05d}": _workload.base_messages() for i in range(sessions)}
    recorded = {sid: 0 for sid in histories}
    turn = 0
    while any(n < tokens for n in recorded.values()):
        for sid, msgs in histories.items():
            if recorded[sid] >= tokens:
                continue
            # parsed from JSON, as a server gets it: what the gateway keeps of the request (the
            # session's previous request) is counted, not shared with the harness's history
            req = parse_chat_request(
                {
                    "model": _workload.MODEL_NAME,
                    "messages": as_sent(msgs),
                    "tools": _workload.TOOLS,
                    "max_tokens": 64,
                }
            )
            resp = completion(await gw.complete(sid, req))  # as the Chat dialect answers
            m = resp["choices"][0]["message"]
            u = resp["usage"]
            # recorded tokens of this call: the prompt delta + the completion
            recorded[sid] = u["prompt_tokens"] + u["completion_tokens"]
            msgs.append(_workload.echo(m))
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": m["tool_calls"][0]["id"],
                    "content": outputs[turn % len(outputs)],
                }
            )
        turn += 1
        if turn % 8 == 0:
            # the harness would send these; the gateway keeps only its own copies
            print(f"  turn {turn}: {sum(recorded.values()) / 1e6:.1f}M tokens recorded", flush=True)
    return sum(recorded.values())


def db_size(gw) -> int:  # noqa: ANN001
    """The store's files after a WAL checkpoint (from a connection of its own: the store's
    are its private business)."""
    import sqlite3

    db = gw.store.path
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return sum(f.stat().st_size for f in db.parent.glob(db.name + "*"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sessions", type=int)
    p.add_argument("--tokens", type=int, help="tokens per session")
    p.add_argument(
        "--tool-tokens",
        type=int,
        default=436,
        help="tool-output tokens per turn (+64 sampled = recorded tokens per call)",
    )
    args = p.parse_args()
    sessions = args.sessions or (20 if args.quick else 1000)
    tokens = args.tokens or (4000 if args.quick else 32000)
    import long_session

    spec = _workload.reply_spec(64)
    print("# Memory and disk per recorded token")
    print(f"machine: {_machine.machine()}")
    print(
        f"set-up: {sessions} concurrent sessions x {tokens} tokens, ~{args.tool_tokens + 64} "
        f"recorded tokens per call (64 sampled), in-process Gateway + SQLite store"
    )
    with _machine.workdir("memory") as wd:
        gw = _inprocess.make_gateway(wd / "data", spec)
        outputs = [long_session.tool_output(t, args.tool_tokens, gw.tok) for t in range(64)]
        gw.renderer.encode_fragment = functools.lru_cache(maxsize=None)(gw.renderer.encode_fragment)
        # warm everything that is allocated once (template compile, caches, the memo of the
        # tool outputs' token IDs): one session through all 64 tool outputs, then forgotten
        asyncio.run(build(gw, 1, 64 * (args.tool_tokens + 64), outputs, "warm"))
        gw.trees.entries.pop("warm-00000", None)
        gc.collect()
        disk0 = db_size(gw)
        tracemalloc.start()
        gc.collect()
        base_py = sum(st.size for st in tracemalloc.take_snapshot().statistics("filename"))
        base_rss = rss()
        t0 = time.time()
        total = asyncio.run(build(gw, sessions, tokens, outputs))
        elapsed = time.time() - t0
        gc.collect()
        # The harness's own message lists live in this process too: leave out what was
        # allocated here (memory.py, the benchmarks' helper modules), keep what the gateway
        # allocated.
        snap = tracemalloc.take_snapshot().filter_traces(
            [
                tracemalloc.Filter(False, "*/benchmarks/memory.py"),
                tracemalloc.Filter(False, "*/benchmarks/_*.py"),
            ]
        )
        live = sum(st.size for st in snap.statistics("filename")) - base_py
        tracemalloc.stop()
        grown = rss() - base_rss
        disk = db_size(gw) - disk0
        calls = sum(len(e.tree.nodes) for e in gw.trees.entries.values())
        print(f"\nbuilt in {elapsed:.0f} s: {calls} calls, {total / 1e6:.2f}M recorded tokens")
        rows = [
            ["live Python bytes held by the gateway (tracemalloc)", live, live / total, 12],
            ["RSS growth (incl. the harness's histories)", grown, grown / total, "-"],
            ["SQLite file growth (after checkpoint)", disk, disk / total, 8],
        ]
        print(_report.table(["what", "bytes", "bytes / recorded token", "target"], rows))
        print("\ntop allocation sites (tracemalloc, by line):")
        for st in snap.statistics("lineno")[:8]:
            f = st.traceback[0]
            print(
                f"  {st.size / total:6.2f} B/token  {st.count:>8} blocks  "
                f"{f.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{f.lineno}"
            )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
