"""Where a Turnstile call's CPU goes: py-spy on the server process under the overhead.py
workload (or the long session's late turns), samples folded into the parts of a call.

Set-up: the fast fake engine on core 0 with the load generator, Turnstile alone on core 1
(as in overhead.py); py-spy (from the bench venv, ``setup_bench_venv.sh``) samples the server
at 500 Hz while the cell runs; the server's own CPU per call (/proc) scales the shares. Each
sample goes to the part named by its innermost frame that names one (the first in the order
below where a frame names two), so a part's figure is what that work costs including what it
calls, less the named parts it calls. py-spy counts a thread that waits for the
GIL as running, which inflates the store thread's parts; ``--gil`` samples only the thread
holding the GIL (and so leaves out C code that drops it, such as SQLite's own work).

    python benchmarks/profile_call.py                       # non-streaming, concurrency 1
    python benchmarks/profile_call.py --mode stream --conc 32
    python benchmarks/profile_call.py --long 200            # turns 150-200 of the long session
    python benchmarks/profile_call.py --quick               # a few calls (no py-spy needed)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _machine
import _records
import _report
import _servers
import _workload

PARTS = [  # (part, frame substrings), first match wins; the floor's (_floor.py) parts too
    (
        "store thread: the commit (SQLite, fdatasync)",
        ["Writer._run", "SqliteDatabase.transaction", "Store.write", "write_batch", "Rows.write"],
    ),
    (
        "record: built on the loop, handed to the writer",
        ["TokenCall._commit", "TokenCall.record", "token_in/recording.py", "gateway/record.py"]
        + ["Writer.submit", "row (_floor", "commit (_floor"],
    ),
    ("session row on first use", ["SessionIndex.ensure", "session_index.py"]),
    (
        "detokenize + parse the completion",
        ["parsing/", "LoadedTokenizer.decode", "detokenize", "_text_ids"]
        + ["<lambda> (turnstile/chat/tiktoken_encode", "reply (_floor", "decode (_floor"],
    ),
    (
        "tokenize the new text",
        ["LoadedTokenizer.encode", "PromptEncoder", "_with_added", "encode (_floor"],
    ),
    (
        "render the delta / a first prompt",
        ["Renderer.", "chat/render.py", "chat/template.py", "jinja2", "render (_floor"],
    ),
    (
        "match the history + assemble the context",
        ["SessionTree", "chat/history.py", "session_trees", "build_prompt", "root_hash"]
        + ["prefix_hashes", "lineage"],
    ),
    (
        "engine client: request body, response -> token events",
        ["engines/", "aiohttp", "post (_floor", "gen_body (_floor", "sampled (_floor"],
    ),
    ("streaming: chunks, SSE out", ["streaming.py", "streamed", "chunk (_floor"]),
    (
        "request: body, JSON, limits, validation -> ChatRequest",
        ["read_json", "limits.py", "dialects/chat/request", "dialects/", "resent.py", "asgi_body"],
    ),
    ("answer: the chat.completion", ["answers.py", "whole (_floor"]),
    ("gateway: admission, sampling, the call's flow", ["gateway/", "wiring.py"]),
    ("the floor's request handler (its inline JSON and dicts)", ["app (_floor"]),
    (
        "HTTP edge: uvicorn, Starlette, routes, auth, metrics (and the handler's rest)",
        ["httptools_impl", "starlette/", "turnstile/server/"],
    ),
]


def fold(raw: Path) -> tuple[int, collections.Counter]:
    """py-spy's raw (collapsed) output -> samples per part."""
    total, parts = 0, collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        total += int(n)
        frames = stack.split(";")
        # the innermost frame that names a part decides (a send inside the floor's handler
        # is the HTTP edge's, as it is in Turnstile's)
        part = next(
            (name for f in reversed(frames) for name, keys in PARTS if any(k in f for k in keys)),
            None,
        )
        if part is not None:
            parts[part] += int(n)
        else:
            loop = any(k in frames[-1] for k in ("Runner.run", "asyncio", "base_events"))
            parts["event loop (uvloop's C code: sockets, scheduling)" if loop else "other"] += int(
                n
            )
    return total, parts


async def drive(args: argparse.Namespace, wd: Path, spy_out: Path) -> float:
    import overhead as o

    (wd / "spec.json").write_text(json.dumps(_workload.reply_spec(64)))
    fake, fake_url = _servers.start_fake(wd / "spec.json", 0, wd / "fake.log")
    if args.target.startswith("floor"):
        (wd / args.target).mkdir()
        ts, url = _servers.start_relay(
            args.target, fake_url, 1, wd / f"{args.target}.log", wd / args.target
        )
    else:
        ts, url = _servers.start_turnstile(fake_url, wd / "data", 1, wd / "ts.log")
    spy = None
    try:

        def start_spy() -> subprocess.Popen | None:
            exe = _machine.bench_venv() / "bin" / "py-spy"
            if not exe.exists():  # the test venv has it too
                exe = Path(sys.executable).parent / "py-spy"
            if args.quick or not exe.exists():
                return None
            p = subprocess.Popen(
                [
                    str(exe),
                    "record",
                    "--pid",
                    str(ts.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "500",
                    "--nonblocking",
                    "-o",
                    str(spy_out),
                    *(["--gil"] if args.gil else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.5)  # attached
            return p

        if args.long:
            return await _long(args, ts, url, start_spy, wd)
        target = o.Target(args.target, url, ts, _servers.TOKEN)
        await o.warm_up([target], args.conc, _workload.base_messages())
        await asyncio.to_thread(_records.start, fake_url)
        for a in target.agents:
            a.answered.clear()
        spy = start_spy()
        cell = await o.run_cell(target, args.mode, args.conc, max(1, args.calls // args.conc))
        if spy is not None:  # the cell only, not the check's reads below
            spy.send_signal(2)
            spy.wait(60)
            spy = None
        print(f"{cell['calls']} calls, {cell['errors']} errors")
        if cell["errors"]:
            raise SystemExit(f"FAILED: {cell['errors']} calls failed")
        answered = [c for a in target.agents for c in a.answered]
        if args.corrupt_record and args.target == "turnstile":
            _records.corrupt(wd / "data")
        where = url if args.target == "turnstile" else str(wd / args.target / "floor.sqlite3")
        kind = "turnstile" if args.target == "turnstile" else "floor"
        problems = await asyncio.to_thread(
            _records.check, fake_url, [(kind, where, answered)], _servers.TOKEN, o.REPLY_TOKENS
        )
        if problems:
            raise SystemExit("FAILED:\n  " + "\n  ".join(problems[:20]))
        print(f"records checked against the engine's own account: {len(answered)} calls")
        return cell["cpu_ms"]
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        ts.stop()
        fake.stop()


async def _long(args, ts, url, start_spy, wd: Path) -> float:  # noqa: ANN001
    import httpx
    import long_session
    import openai

    from turnstile.chat.tokenizer import load_tokenizer

    tok = load_tokenizer(str(_workload.tiny_qwen2()))
    client = openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key=_servers.TOKEN,
        max_retries=0,
        http_client=httpx.AsyncClient(timeout=600),
    )
    msgs, cpu, late = _workload.base_messages(), [], args.long * 3 // 4
    spy = None
    for turn in range(args.long):
        if turn == late:
            spy = start_spy()
        cpu0 = ts.cpu()
        r = await client.chat.completions.create(
            model=_workload.MODEL_NAME,
            messages=msgs,
            tools=_workload.TOOLS,
            max_tokens=64,
            extra_headers={"x-session-id": "long"},
        )
        cpu.append(ts.cpu() - cpu0)
        m = r.choices[0].message
        calls = [tc.model_dump() for tc in m.tool_calls or []]
        msgs += [
            {"role": "assistant", "content": m.content, "tool_calls": calls},
            {
                "role": "tool",
                "tool_call_id": calls[0]["id"],
                "content": long_session.tool_output(turn, 436, tok),
            },
        ]
    if spy is not None:
        spy.send_signal(2)
        spy.wait(60)
    print(f"turns {late + 1}-{args.long}")
    return sum(cpu[late:]) / len(cpu[late:]) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", default="plain", choices=["plain", "stream"])
    p.add_argument("--conc", type=int, default=1)
    p.add_argument("--calls", type=int, default=600)
    p.add_argument(
        "--target",
        default="turnstile",
        choices=["turnstile", "floor", "floor-aiohttp"],
        help="a floor (_floor.py) profiled the same way, to set beside Turnstile's parts",
    )
    p.add_argument("--long", type=int, metavar="TURNS", help="profile a long session instead")
    p.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (py-spy counts a thread "
        "waiting for the GIL as running; C code that drops it is left out)",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--corrupt-record",
        action="store_true",
        help="a negative control: Turnstile's recorded logprobs zeroed before the check, "
        "which must fail the run",
    )
    p.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    args = p.parse_args()
    if args.quick:
        args.calls, args.long = 8, (8 if args.long else None)
    _machine.pin(0)
    print("# Where a Turnstile call's CPU goes (py-spy on the server)")
    print(f"machine: {_machine.machine()}")
    what = (
        f"long session, {args.long} turns"
        if args.long
        else f"overhead.py workload, {args.mode}, concurrency {args.conc}, {args.calls} calls"
    )
    print(
        f"set-up: {what}; fake engine + load generator on core 0, Turnstile on core 1"
        f"{'; py-spy --gil' if args.gil else ''}"
    )
    with _machine.workdir("profile") as wd:
        spy_out = wd / "spy.txt"
        ms = asyncio.run(drive(args, wd, spy_out))
        who = "Turnstile" if args.target == "turnstile" else f"The {args.target}"
        print(f"{who} CPU per call: {ms:.2f} ms")
        if not spy_out.exists():
            print("(no profile: --quick, or py-spy missing from the bench venv)")
            return
        total, parts = fold(spy_out)
        if args.raw:
            shutil.copyfile(spy_out, args.raw)
    rows = [[name, n / total * 100, ms * n / total] for name, n in parts.most_common()]
    print(_report.table(["part of the call", "% of samples", "ms per call"], rows))
    print(f"({total} samples)")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
