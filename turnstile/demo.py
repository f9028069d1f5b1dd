"""``turnstile demo``: the whole path on the embedded default, on a CPU.

llama-server runs SmolLM2-135M-Instruct; Turnstile sits in front of it with a local SQLite
store; the official ``openai`` client drives a few multi-turn sessions (one streamed) through
each session's base URL. Then, per session, what was recorded, and how many turns would have
drifted had the returned text been re-tokenized instead.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import uvicorn
from starlette.applications import Starlette

from . import testbed
from .auth import load_or_create_token
from .server.app import create_app
from .server.gateway import Gateway
from .store.trajectories import trajectories
from .wiring import build_gateway

if TYPE_CHECKING:  # the client is imported when the demo runs
    import openai
    from openai.types.chat import ChatCompletionMessageParam

MODEL = "SmolLM2-135M-Instruct"

CONVERSATIONS = [
    [
        "What is the capital of France?",
        "And what river runs through it?",
        "Name one famous museum there.",
    ],
    ["Write a haiku about the sea.", "Now one about mountains.", "Which one do you prefer?"],
    [
        "I have 3 apples and buy 5 more. How many do I have?",
        "I eat two. How many now?",
        "Explain your arithmetic step by step.",
    ],
    [
        "Give me a Python one-liner that reverses a string.",
        "Now make it uppercase too.",
        "Spell the word 'unbelievable' backwards, letter by letter.",
    ],
]


def _serve(app: Starlette, port: int) -> uvicorn.Server:
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="error", loop="uvloop", http="httptools"
        )
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server


def run(args: argparse.Namespace) -> None:
    import httpx
    import openai

    print(
        f"Preparing the test bed (built once, then cached in {testbed.cache_dir()}) ...", flush=True
    )
    model = testbed.smollm2_gguf()
    testbed.llama_server_binary()
    data = Path(args.data or tempfile.mkdtemp(prefix="turnstile-demo-"))
    with testbed.llama_server(model, ctx=8192, parallel=2) as engine_url:
        gateway = build_gateway(engine_url, str(model), data, model_name=MODEL)
        port = testbed.free_port()
        base = f"http://127.0.0.1:{port}"
        token = load_or_create_token(data)[0]  # as `turnstile serve` does: DATA/turnstile.token
        server = _serve(
            create_app(gateway, base, token=token, tokenizer=gateway.renderer.tok), port
        )
        try:
            sessions = []
            for i, user_turns in enumerate(CONVERSATIONS[: args.sessions]):
                s = httpx.post(
                    base + "/v1/sessions",
                    json={"metadata": {"task": f"demo-{i}", "group": "demo"}},
                    headers={"authorization": f"Bearer {token}"},
                ).json()
                client = openai.OpenAI(base_url=s["base_url"], api_key="unused")
                stream = i == 1
                msgs: list[ChatCompletionMessageParam] = []
                for turn in user_turns:
                    msgs.append({"role": "user", "content": turn})
                    text = _ask(client, msgs, i, stream)
                    msgs.append({"role": "assistant", "content": text})
                sessions.append((s["id"], stream, msgs))
            _report(gateway, sessions, data)
        finally:
            server.should_exit = True
            time.sleep(0.3)


def _ask(
    client: openai.OpenAI, msgs: list[ChatCompletionMessageParam], seed: int, stream: bool
) -> str | None:
    """The reply's text, asked for whole or streamed."""
    if stream:
        return "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model=MODEL,
                messages=msgs,
                max_tokens=96,
                temperature=1.0,
                seed=seed,
                logprobs=True,
                stream=True,
            )
            if c.choices
        )
    return (
        client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=96, temperature=1.0, seed=seed, logprobs=True
        )
        .choices[0]
        .message.content
    )


def _report(gateway: Gateway, sessions: list, data: Path) -> None:
    tok = gateway.tok
    template = gateway.renderer.template
    eog = tok.eog_token_ids
    print(f"\nRecords in {data / 'turnstile.sqlite3'}")
    print(f"Template audit at start ({gateway.renderer.fingerprint}):")
    for line in gateway.policy.describe():
        print(f"  {line}")
    print()
    header = (
        f"{'session':<30} {'mode':<9} {'calls':>5} {'tokens':>6} {'sampled':>7} "
        f"{'reused':>6} {'segments':>8} {'drifted turns':>13} {'naive = exact':>13}"
    )
    print(header)
    print("-" * len(header))
    for sid, stream, msgs in sessions:
        calls = gateway.store.calls(sid)
        trajs = trajectories(calls)
        traj = trajs[0]
        drifted = 0
        for c in calls:
            sampled = [t for t in c.completion_ids.tolist() if t not in eog]
            drifted += tok.encode(tok.decode(sampled)) != sampled
        naive = tok.encode(template.render(msgs, add_generation_prompt=False))
        exact = traj["token_ids"]
        same = naive[: len(exact)] == exact
        reused = sum(c.reused_prefix_len for c in calls)
        print(
            f"{sid:<30} {'stream' if stream else 'plain':<9} {len(calls):>5} "
            f"{len(exact):>6} {sum(traj['loss_mask']):>7} {reused:>6} {len(trajs):>8} "
            f"{drifted:>8} of {len(calls):<2} {'yes' if same else 'NO':>13}"
        )
    sid = sessions[0][0]
    last = gateway.store.calls(sid)[-1].to_json()
    print("\nThe last call of the first session, as recorded (GET /v1/sessions/<id>/calls):")
    shown = {
        k: (v[:12] + ["..."] if isinstance(v, list) and len(v) > 12 else v) for k, v in last.items()
    }
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    print(
        "\n'drifted turns': sampled completions whose text re-encodes to different IDs.\n"
        "'naive = exact': whether re-rendering and re-tokenizing the final conversation gives\n"
        "the tokens the model actually saw and sampled."
    )
