"""``./run demo`` (``python -m turnstile_testbed demo``): the whole path on the embedded
default, on a CPU.

llama-server runs SmolLM2-135M-Instruct, served with the Qwen2.5 chat template (SmolLM2's own
never renders ``tools``); Turnstile sits in front of it with a local SQLite store; the official
``openai`` client drives a few multi-turn sessions (one streamed) and one tool round (a forced
call, its result sent back, the model's answer) through each session's base URL. Then, per
session, what was recorded, and how many turns would have drifted had the returned text been
re-tokenized instead.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import orjson
import uvicorn
from starlette.applications import Starlette

import turnstile_testbed as testbed
from turnstile.app.wiring import build_gateway
from turnstile.auth import load_or_create_token
from turnstile.chat.loaded_tokenizer import LoadedTokenizer
from turnstile.gateway.token_in.gateway import Gateway
from turnstile.server.app import create_app
from turnstile.store.trajectories import trajectories

if TYPE_CHECKING:  # the client is imported when the demo runs
    import openai
    from openai.types.chat import (
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageParam,
        ChatCompletionNamedToolChoiceParam,
    )

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"  # a real template that renders tools

# The tool round: the call is forced (a named function, enforced with a grammar; the city an
# enum), so it is whole within its token cap on any machine.
TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            },
        },
    }
]
TOOL_TASK = [
    {"role": "system", "content": "You are a helpful assistant. Use the tools."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOL_RESULT = "18 C, sunny"

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


class ServedApp:
    """An app served by uvicorn in a thread of this process: the demo's server, and the
    benchmarks', examples' and tests' that run a gateway in their own process.

    ``stop`` waits for uvicorn's shutdown (the app's lifespan closes the engine client and the
    store): a process that exits while that thread still runs native code (tokenizers, SQLite,
    uvloop) can die with a segfault at interpreter teardown, after its work is done."""

    def __init__(self, app: Starlette, port: int) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=port, log_level="error", loop="uvloop", http="httptools"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start on port {port}")
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> ServedApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(app: Starlette, port: int) -> ServedApp:
    """``app`` served on ``127.0.0.1:port`` once it listens; ``.stop()`` ends it."""
    return ServedApp(app, port)


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
        gateway = build_gateway(
            engine_url,
            str(model),
            data,
            chat_template=str(testbed.templates_dir() / TEMPLATE),
            model_name=MODEL,
        )
        port = testbed.free_port()
        base = f"http://127.0.0.1:{port}"
        token = load_or_create_token(data)[0]  # as `turnstile serve` does: DATA/turnstile.token
        server = serve_in_thread(
            create_app(gateway, base, token=token, tokenizer=gateway.renderer.tok), port
        )

        def session(task: str) -> tuple[str, openai.OpenAI]:
            s = httpx.post(
                base + "/v1/sessions",
                json={"metadata": {"task": task, "group": "demo"}},
                headers={"authorization": f"Bearer {token}"},
            ).json()
            return s["id"], openai.OpenAI(base_url=s["base_url"], api_key="unused")

        try:
            sessions: list[Session] = []
            for i, user_turns in enumerate(CONVERSATIONS[: args.sessions]):
                sid, client = session(f"demo-{i}")
                stream = i == 1
                msgs: list[ChatCompletionMessageParam] = []
                for turn in user_turns:
                    msgs.append({"role": "user", "content": turn})
                    text = _ask(client, msgs, i, stream)
                    msgs.append({"role": "assistant", "content": text})
                sessions.append(Session(sid, "stream" if stream else "plain", msgs))
            sid, client = session("demo-tools")
            msgs = _tool_round(client, _no_markup(gateway.tok))
            sessions.append(Session(sid, "tools", msgs, TOOLS))
            _report(gateway, sessions, data)
        finally:
            server.stop()


@dataclass
class Session:
    id: str
    mode: str  # plain | stream | tools
    msgs: list  # the conversation as the harness ended it
    tools: list[dict] | None = None


def _no_markup(tok: LoadedTokenizer) -> dict[str, int]:
    """A logit bias that keeps the answer plain text (a 135M model imitates the template's
    ``<tool_call>``/``<tool_response>`` tags): -100 on every ordinary token holding a "<"."""
    keep = set(tok.tokenizer.get_added_tokens_decoder()) | set(tok.eog_token_ids)
    return {
        str(i): -100
        for i in range(tok.tokenizer.get_vocab_size())
        if i not in keep and "<" in tok.decode([i])
    }


def _tool_round(client: openai.OpenAI, no_markup: dict[str, int]) -> list:
    """A forced call, its result sent back, the model's answer: two calls, the second
    extending the first's recorded tokens."""
    msgs: list = list(TOOL_TASK)
    tools = cast("list[ChatCompletionFunctionToolParam]", TOOLS)
    named: ChatCompletionNamedToolChoiceParam = {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    forced = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        tools=tools,
        tool_choice=named,
        max_tokens=128,  # the grammar's longest spelling of the call fits
        temperature=1.0,
        seed=7,
        logprobs=True,
    ).choices[0]
    call = forced.message.tool_calls[0] if forced.message.tool_calls else None
    if call is None:
        raise SystemExit(f"demo: the forced call was not parsed ({forced.finish_reason})")
    msgs.append(forced.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT})
    answer = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        tools=tools,
        max_tokens=48,
        temperature=1.0,
        seed=7,
        logit_bias=no_markup,
    ).choices[0]
    msgs.append(answer.message.model_dump(exclude_none=True))
    return msgs


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


def _report(gateway: Gateway, sessions: list[Session], data: Path) -> None:
    tok = gateway.tok
    template = gateway.renderer.template
    eog = tok.eog_token_ids
    print(f"\nRecords in {data / 'turnstile.sqlite3'}")
    print(f"Template audit at start ({gateway.renderer.fingerprint}):")
    for line in gateway.policy.describe():
        print(f"  {line}")
    print()
    header = (
        f"{'session':<30} {'mode':<9} {'calls':>5} {'chained':>7} {'tool calls':>10} "
        f"{'tokens':>6} {'sampled':>7} {'reused':>6} {'segments':>8} {'drifted turns':>13} "
        f"{'naive = exact':>13}"
    )
    print(header)
    print("-" * len(header))
    for session in sessions:
        calls = gateway.store.calls(session.id)
        trajs = trajectories(calls)
        traj = trajs[0]
        drifted = 0
        for c in calls:
            sampled = [t for t in c.completion_ids.tolist() if t not in eog]
            drifted += tok.encode(tok.decode(sampled)) != sampled
        naive = tok.encode(
            template.render(session.msgs, session.tools, add_generation_prompt=False)
        )
        exact = traj["token_ids"]
        same = naive[: len(exact)] == exact
        reused = sum(c.reused_prefix_len for c in calls)
        chained = sum(c.parent_id is not None for c in calls)
        tool_calls = sum(len((c.message or {}).get("tool_calls") or ()) for c in calls)
        print(
            f"{session.id:<30} {session.mode:<9} {len(calls):>5} {chained:>7} {tool_calls:>10} "
            f"{len(exact):>6} {sum(traj['loss_mask']):>7} {reused:>6} {len(trajs):>8} "
            f"{drifted:>8} of {len(calls):<2} {'yes' if same else 'NO':>13}"
        )
    _report_tool_round(gateway, sessions[-1])
    sid = sessions[0].id
    last = gateway.store.calls(sid)[-1].to_json()
    print("\nThe last call of the first session, as recorded (GET /v1/sessions/<id>/calls):")
    shown = {
        k: (v[:12] + ["..."] if isinstance(v, list) and len(v) > 12 else v) for k, v in last.items()
    }
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    print(
        "\n'chained': calls whose prompt is their parent's recorded tokens + the new messages'\n"
        "delta (the rest started a segment: the first call).\n"
        "'drifted turns': sampled completions whose text re-encodes to different IDs.\n"
        "'naive = exact': whether re-rendering and re-tokenizing the final conversation gives\n"
        "the tokens the model actually saw and sampled."
    )
    _picture(gateway, sessions[-1])
    print(
        f"\nSee every session token by token in the viewer:\n"
        f"  turnstile view --data {data}\n"
        f"  then open http://127.0.0.1:8401/ui"
    )


def _picture(gateway: Gateway, session: Session) -> None:
    """The tool round's trajectory as the trainer gets it: each run of tokens with its loss
    mask (``[...]``: sampled, trained on; the rest: the prompt, mask 0), its token count and
    the mean logprob of the sampled runs."""
    (traj,) = trajectories(gateway.store.calls(session.id))
    ids, mask, lps = traj["token_ids"], traj["loss_mask"], traj["logprobs"]
    print(f"\nOne trajectory as the trainer gets it ({session.id}; [ ] = loss mask 1):")
    start = 0
    for i in range(1, len(ids) + 1):
        if i < len(ids) and mask[i] == mask[start]:
            continue
        text = gateway.tok.decode(ids[start:i]).replace("\n", "\\n")
        shown = text if len(text) <= 70 else text[:40] + " ... " + text[-25:]
        if mask[start]:
            mean = sum(lps[start:i]) / (i - start)
            print(f"  [{shown}]  {i - start} sampled, mean logprob {mean:.2f}")
        else:
            print(f"   {shown}   {i - start} prompt tokens")
        start = i


def _report_tool_round(gateway: Gateway, session: Session) -> None:
    """The tool round's two calls: what was forced, what came back, what extended what."""
    forced, answer = gateway.store.calls(session.id)[:2]
    fn = ((forced.message or {}).get("tool_calls") or [{}])[0].get("function") or {}
    grammar = "grammar" in (forced.info.get("sampling") or {})
    text = " ".join(str((answer.message or {}).get("content") or "").split())
    print(f"\nThe tool round ({session.id}; the template renders the tools):")
    print(
        f"  {forced.id}  forced {fn.get('name')}({fn.get('arguments')})"
        f"{' under a grammar' if grammar else ''}: {len(forced.completion_ids)} sampled tokens"
    )
    print(f"  {'tool':<29}  {TOOL_RESULT!r} sent back")
    print(
        f"  {answer.id}  extends {answer.parent_id}: its {answer.reused_prefix_len} recorded "
        f"tokens + {len(answer.prompt_delta)} new"
    )
    print(f"  {'':<29}  answers {text[:64]!r}{'...' if len(text) > 64 else ''}")
