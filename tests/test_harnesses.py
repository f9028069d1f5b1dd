"""Real agent harnesses, unchanged, against Turnstile on llama-server with SmolLM2-135M-Instruct
served with the Qwen2.5 chat template (SmolLM2's own never renders tools).

Each harness runs with its own defaults plus what makes a 135M model's run bounded on any CPU:
a forced tool call where the harness lets us ask for one (``tool_choice``), a logit bias, a
token cap, a step/turn limit. Only machine-independent properties are asserted: the harness
raised nothing, every request it sent was answered 200 and recorded, and every call either
extended a recorded call or started a new segment with a reason (and, past the first, a
detail). Each test prints its tally (``-s``) for the README table. A harness whose pins cannot
sit beside requirements.lock's (strands-agents) runs in a venv of its own
(``tests/harnesses/venv.py``), driven as a subprocess."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Literal

import httpx
import httpx2
import openai
import pytest

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import load_tokenizer
from turnstile.testing.relay import Relay, start_relay

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
SYSTEM = "You are a helpful assistant. Use the tools."
TASK = "What is the weather in Paris?"
WEATHER = [
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


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return testbed.smollm2_gguf()


# What llama-server received and sampled, for every call of this module (the recording relay
# between Turnstile and the engine): each test's records are checked against it.
WIRE = Relay("")


@pytest.fixture(scope="module")
def engine(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("smollm2") / "llama-server.log"
    with testbed.llama_server(smollm2, ctx=16384, parallel=2, log=log) as url:
        _, server = start_relay(url, WIRE)
        yield WIRE.url
        server.shutdown()
        server.server_close()


# The trainer's token, given to the servers below through $TURNSTILE_TOKEN; harnesses only
# get their sessions' base URLs.
TOKEN = "tst-harness-" + secrets.token_urlsafe(16)
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _serve(engine: str, model: Path, data: Path, log: Path, *extra: str) -> tuple:
    port = testbed.free_port()
    cmd = [
        sys.executable,
        "-m",
        "turnstile.app.cli",
        "serve",
        "--engine-url",
        engine,
        "--model",
        str(model),
        "--port",
        str(port),
        "--data",
        str(data),
        *extra,
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "TURNSTILE_TOKEN": TOKEN}
        )
    url = f"http://127.0.0.1:{port}"
    testbed.wait_healthy(url + "/v1/models", proc, timeout=120, headers=AUTH)
    return url, proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def gateway(engine: str, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("turnstile-harnesses")
    url, proc = _serve(
        engine,
        smollm2,
        tmp / "data",
        tmp / "turnstile.log",
        "--chat-template",
        str(testbed.templates_dir() / QWEN25),
    )
    yield url
    _stop(proc)


@pytest.fixture(scope="module")
def no_markup(smollm2: Path) -> dict[str, int]:
    """A bias that keeps the model from writing "<" (so from starting a ``<tool_call>`` on its
    own): every ordinary token whose text holds one, at -100. A forced call's grammar still
    admits them (they are then the only tokens allowed); end-of-turn tokens are left alone."""
    tok = load_tokenizer(str(smollm2))
    keep = set(tok.tokenizer.get_added_tokens_decoder()) | set(tok.eog_token_ids)
    return {
        str(i): -100
        for i in range(tok.tokenizer.get_vocab_size())
        if i not in keep and "<" in tok.decode([i])
    }


class Requests:
    """Counts the chat completion requests a harness sends, by the status it got back, and
    how many of the answers were event streams."""

    def __init__(self) -> None:
        self.status: collections.Counter = collections.Counter()
        self.streamed = 0

    def _see(self, response: httpx.Response) -> None:
        if response.request.url.path.endswith(("/chat/completions", "/responses")):
            self.status[response.status_code] += 1
            self.streamed += response.headers.get("content-type", "").startswith(
                "text/event-stream"
            )

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"response": [self._see]}, timeout=300)

    def async_client(self, http=httpx) -> httpx.AsyncClient:
        """An ``http.AsyncClient``: httpx's, or httpx2's where a harness wants that."""

        async def see(response: httpx.Response) -> None:
            self._see(response)

        return http.AsyncClient(event_hooks={"response": [see]}, timeout=300)

    @property
    def total(self) -> int:
        return sum(self.status.values())


def _session(gateway: str, harness: str) -> dict:
    r = httpx.post(gateway + "/v1/sessions", json={"metadata": {"harness": harness}}, headers=AUTH)
    r.raise_for_status()
    return r.json()


def _tally(gateway: str, session: dict, harness: str, sent: int | None, **extra: object) -> dict:
    """Check the session's records and count chaining; print one line for the README (with
    ``extra``: the version, whether it streamed)."""
    calls = httpx.get(
        f"{gateway}/v1/sessions/{session['id']}/calls", timeout=30, headers=AUTH
    ).json()["data"]
    assert calls, f"{harness}: nothing recorded"
    if sent is not None:
        assert len(calls) == sent, f"{harness}: {sent} requests answered, {len(calls)} recorded"
    assert all(c["status"] == "ok" for c in calls), [c["error"] for c in calls]
    # each call's prompt and completion as llama-server received and sampled them
    wire = [e.request["prompt"] + e.response["tokens"] for e in WIRE.completions()]
    per_call = httpx.get(
        f"{gateway}/v1/sessions/{session['id']}/trajectories?mode=per_call",
        timeout=30,
        headers=AUTH,
    ).json()["data"]
    assert len(per_call) == len(calls)
    for t in per_call:
        assert t["token_ids"] in wire, f"{harness}: a recorded call is not what the engine saw"
    chained = [c for c in calls if c["parent_id"] is not None]
    new = [c for c in calls if c["parent_id"] is None]
    assert all(c["segment_reason"] for c in new)
    assert calls[0]["segment_reason"] == "first_call"
    reasons = collections.Counter(c["segment_reason"] for c in new)
    details = [c["segment_detail"] for c in new if c["segment_reason"] != "first_call"]
    out = {
        "harness": harness,
        "calls": len(calls),
        "chained": len(chained),
        "new_segments": dict(reasons),
        "details": details,
        "finish": dict(collections.Counter(c["finish_reason"] for c in calls)),
        **extra,
    }
    print("\nHARNESS " + json.dumps(out))
    return out


# ---- the openai client ------------------------------------------------------------------


def _turns(create, msgs: list[dict]) -> None:
    """A forced call, its result, a free answer, a user follow-up: three calls."""
    msg = create(msgs, tool_choice="required", parallel_tool_calls=False)
    assert msg["tool_calls"] and len(msg["tool_calls"]) == 1
    call = msg["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) in ({"city": "Paris"}, {"city": "Oslo"})
    msgs += [msg, {"role": "tool", "tool_call_id": call["id"], "content": "18 C, sunny"}]
    msgs.append(create(msgs))
    msgs.append({"role": "user", "content": "And tomorrow?"})
    create(msgs)


def _start() -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]


def test_openai_client_sync(gateway, no_markup):
    session, seen = _session(gateway, "openai-sync"), Requests()
    client = openai.OpenAI(
        base_url=session["base_url"], api_key="x", max_retries=0, http_client=seen.client()
    )

    def create(msgs: list[dict], **kw: object) -> dict:
        r = client.chat.completions.create(
            model="smollm2",
            messages=msgs,
            tools=WEATHER,
            max_tokens=64,
            seed=1,
            logit_bias=no_markup,
            **kw,
        )
        return r.choices[0].message.model_dump(exclude_none=True)

    _turns(create, _start())
    t = _tally(gateway, session, "openai sync", seen.total)
    assert (t["chained"], t["new_segments"]) == (2, {"first_call": 1})


def test_openai_client_async(gateway, no_markup):
    session, seen = _session(gateway, "openai-async"), Requests()

    async def run() -> None:
        client = openai.AsyncOpenAI(
            base_url=session["base_url"],
            api_key="x",
            max_retries=0,
            http_client=seen.async_client(),
        )
        msgs = _start()
        r = await client.chat.completions.create(
            model="smollm2",
            messages=msgs,
            tools=WEATHER,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=64,
            seed=2,
        )
        msg = r.choices[0].message
        msgs += [
            msg.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 C"},
        ]
        # two concurrent continuations of the same history: siblings, both chained
        await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="smollm2",
                    messages=msgs,
                    tools=WEATHER,
                    max_tokens=16,
                    seed=s,
                    logit_bias=no_markup,
                )
                for s in (3, 4)
            )
        )

    asyncio.run(run())
    t = _tally(gateway, session, "openai async", seen.total)
    assert (t["chained"], t["new_segments"]) == (2, {"first_call": 1})


def test_openai_client_stream(gateway, no_markup):
    session, seen = _session(gateway, "openai-stream"), Requests()
    client = openai.OpenAI(
        base_url=session["base_url"], api_key="x", max_retries=0, http_client=seen.client()
    )

    def create(msgs: list[dict], **kw: object) -> dict:
        content, calls = "", {}
        for chunk in client.chat.completions.create(
            model="smollm2",
            messages=msgs,
            tools=WEATHER,
            max_tokens=64,
            seed=1,
            logit_bias=no_markup,
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        ):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for d in choice.delta.tool_calls or ():
                    c = calls.setdefault(
                        d.index,
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    c["id"] += d.id or ""
                    c["function"]["name"] += d.function.name or ""
                    c["function"]["arguments"] += d.function.arguments or ""
        msg = {"role": "assistant", "content": content or None}
        if calls:
            msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        return msg

    _turns(create, _start())
    t = _tally(gateway, session, "openai stream", seen.total)
    assert (t["chained"], t["new_segments"]) == (2, {"first_call": 1})


# ---- OpenAI Agents SDK -------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk(gateway, no_markup, smollm2, streamed, api):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    session, seen = _session(gateway, "agents"), Requests()
    ran = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"18 C in {city}"

    bias = dict(no_markup)
    if api == "responses":
        # The SDK's Responses model treats a reply cut at max_output_tokens (status
        # "incomplete", as OpenAI sends it) as an error: the answer must end within the cap
        # on any CPU, so end-of-turn tokens are favoured (a forced call's grammar still rules).
        bias.update({str(t): 15 for t in load_tokenizer(str(smollm2)).eog_token_ids})

    async def run() -> object:
        client = openai.AsyncOpenAI(
            base_url=session["base_url"],
            api_key="x",
            max_retries=0,
            http_client=seen.async_client(),
        )
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(
            name="weather",
            instructions=SYSTEM,
            tools=[get_weather],
            model=kind(model="smollm2", openai_client=client),
            # forced on the first turn; the SDK resets tool_choice after a tool ran
            model_settings=ModelSettings(
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=64,
                extra_body={"logit_bias": bias, "seed": 1},
            ),
        )
        if not streamed:
            return await Runner.run(agent, TASK, max_turns=3)
        result = Runner.run_streamed(agent, TASK, max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert ran and isinstance(result.final_output, str)
    label = "Agents SDK run_streamed" if streamed else "Agents SDK Runner.run"
    label += " (Responses)" if api == "responses" else ""
    t = _tally(gateway, session, label, seen.total)
    assert (t["chained"], t["new_segments"]) == (1, {"first_call": 1})


# ---- LangChain ---------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_langchain_create_agent(gateway, no_markup, streamed):
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    session, seen = _session(gateway, "langchain"), Requests()
    ran = []

    @tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"18 C in {city}"

    @wrap_model_call
    def force_first_call(request, handler):  # a tool call on the first turn only
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            request = request.override(
                tool_choice="required", model_settings={"parallel_tool_calls": False}
            )
        return handler(request)

    model = ChatOpenAI(
        model="smollm2",
        base_url=session["base_url"],
        api_key="x",
        max_tokens=64,
        seed=1,
        logit_bias=no_markup,
        max_retries=0,
        http_client=seen.client(),
        streaming=streamed,
    )
    agent = create_agent(
        model, tools=[get_weather], system_prompt=SYSTEM, middleware=[force_first_call]
    )
    out = agent.invoke({"messages": [{"role": "user", "content": TASK}]}, {"recursion_limit": 8})
    assert ran and out["messages"][-1].type == "ai"
    label = "LangChain create_agent" + (" (streaming=True)" if streamed else "")
    t = _tally(gateway, session, label, seen.total)
    assert (t["chained"], t["new_segments"]) == (1, {"first_call": 1})


# ---- inspect-ai --------------------------------------------------------------------------


def test_inspect_ai_react(gateway, no_markup, tmp_path, monkeypatch):
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.tool import tool

    session = _session(gateway, "inspect")
    monkeypatch.setenv("TURNSTILE_API_KEY", "x")
    monkeypatch.setenv("INSPECT_LOG_DIR", str(tmp_path / "logs"))

    @tool
    def get_weather():
        async def execute(city: str) -> str:
            """Current weather for a city.

            Args:
                city: The city.
            """
            return f"18 C in {city}"

        return execute

    # The model is kept from calling tools (bias): react() asks it to continue until the
    # message limit ends the sample; every turn appends a user message to a recorded reply.
    task = Task(
        dataset=[Sample(input=TASK, target="18")],
        solver=react(tools=[get_weather()]),
        message_limit=7,
    )
    [log] = inspect_eval(
        task,
        model="openai-api/turnstile/smollm2",
        model_base_url=session["base_url"],
        display="none",
        log_dir=str(tmp_path / "logs"),
        max_tokens=24,
        seed=1,
        logit_bias={int(k): v for k, v in no_markup.items()},
        max_retries=0,
        fail_on_error=True,
    )
    assert log.status == "success", log.error
    [sample] = log.samples
    assert sample.error is None
    model_calls = [e for e in sample.events if e.event == "model"]
    assert all(e.error is None for e in model_calls)
    t = _tally(gateway, session, "inspect-ai react()", len(model_calls))
    assert t["chained"] == len(model_calls) - 1


# ---- smolagents --------------------------------------------------------------------------


def _smol_model(session: dict, seen: Requests, **kw: object):
    from smolagents import OpenAIServerModel

    return OpenAIServerModel(
        model_id="smollm2",
        api_base=session["base_url"],
        api_key="x",
        client_kwargs={"http_client": seen.client(), "max_retries": 0},
        max_tokens=48,
        seed=1,
        **kw,
    )


def test_smolagents_tool_calling_agent(gateway, smollm2):
    from smolagents import Tool, ToolCallingAgent

    class Weather(Tool):
        name = "get_weather"
        description = "Current weather for a city."
        inputs = {"city": {"type": "string", "description": "The city.", "enum": ["Paris", "Oslo"]}}
        output_type = "string"

        def forward(self, city: str) -> str:
            return f"18 C in {city}"

    # ToolCallingAgent always asks for tool_choice "required"; a bias on "get" makes the
    # grammar-forced call get_weather, never final_answer, so the run lasts max_steps.
    tok = load_tokenizer(str(smollm2))
    get = tok.encode('"get')[-1]
    assert tok.decode([get]).strip('"') == "get"
    session, seen = _session(gateway, "smolagents-tools"), Requests()
    agent = ToolCallingAgent(
        tools=[Weather()],
        model=_smol_model(session, seen, logit_bias={str(get): 100}),
        max_steps=2,
        verbosity_level=0,
    )
    agent.run(TASK)
    steps = [s for s in agent.memory.steps if getattr(s, "error", None) is not None]
    assert not [s for s in steps if "Error in generating model output" in str(s.error)]
    _tally(gateway, session, "smolagents ToolCallingAgent", seen.total)
    assert seen.status.keys() == {200}


def test_smolagents_code_agent(gateway):
    from smolagents import CodeAgent

    session, seen = _session(gateway, "smolagents-code"), Requests()
    agent = CodeAgent(tools=[], model=_smol_model(session, seen), max_steps=2, verbosity_level=0)
    agent.run(TASK)
    assert seen.status.keys() == {200}
    _tally(gateway, session, "smolagents CodeAgent", seen.total)


# ---- pydantic-ai -------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_pydantic_ai_agent(gateway, no_markup, streamed):
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    session, seen = _session(gateway, "pydantic-ai"), Requests()
    ran = []

    class ForceFirstCall(AbstractCapability):
        """tool_choice "required" until a tool has returned: pydantic-ai refuses it in static
        settings (no final answer could follow) and takes it per step from a capability."""

        def get_model_settings(self):
            def settings(ctx):
                parts = [p for m in ctx.messages for p in getattr(m, "parts", ())]
                if any(isinstance(p, ToolReturnPart) for p in parts):
                    return {}
                return {"tool_choice": "required"}

            return settings

    # pydantic-ai deprecates an httpx client here for httpx2's (what openai 3 uses)
    provider = OpenAIProvider(
        base_url=session["base_url"], api_key="x", http_client=seen.async_client(httpx2)
    )
    agent = Agent(
        OpenAIChatModel("smollm2", provider=provider),
        instructions=SYSTEM,
        capabilities=[ForceFirstCall()],
        model_settings={
            "max_tokens": 64,
            "seed": 1,
            "logit_bias": no_markup,
            "parallel_tool_calls": False,
        },
    )

    @agent.tool_plain
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"18 C in {city}"

    # a run with one tool round, then a follow-up turn on its history
    if streamed:
        first = agent.run_stream_sync(TASK)
        first.get_output()
        second = agent.run_stream_sync("And tomorrow?", message_history=first.all_messages())
        output = second.get_output()
    else:
        first = agent.run_sync(TASK)
        second = agent.run_sync("And tomorrow?", message_history=first.all_messages())
        output = second.output
    assert len(ran) == 1 and isinstance(output, str)
    assert seen.streamed == (seen.total if streamed else 0)
    label = "pydantic-ai Agent" + (".run_stream_sync" if streamed else ".run_sync")
    t = _tally(
        gateway, session, label, seen.total, version=version("pydantic-ai-slim"), stream=streamed
    )
    assert (t["chained"], t["new_segments"]) == (2, {"first_call": 1})


# ---- Strands Agents (a venv of its own) ----------------------------------------------------

STRANDS = Path(__file__).resolve().parent / "harnesses" / "strands_agent.py"


@pytest.fixture(scope="module")
def strands_python() -> Path:
    from tests.harnesses import venv

    return venv.ensure("strands")


def test_strands_agent(gateway, no_markup, smollm2, strands_python, tmp_path):
    session = _session(gateway, "strands")
    # Strands raises MaxTokensReachedException on a reply cut at max_tokens: the answers must
    # end within the cap on any CPU, so end-of-turn tokens are favoured (as for the Agents
    # SDK's Responses model); the forced call's grammar still rules the first turn.
    bias = dict(no_markup) | {str(t): 15 for t in load_tokenizer(str(smollm2)).eog_token_ids}
    args = tmp_path / "args.json"
    args.write_text(
        json.dumps(
            {
                "base_url": session["base_url"],
                "model": "smollm2",
                "system": SYSTEM,
                "task": TASK,
                "follow_up": "And tomorrow?",
                "params": {"max_tokens": 64, "seed": 1, "logit_bias": bias},
            }
        )
    )
    res = subprocess.run(
        [str(strands_python), str(STRANDS), str(args)], capture_output=True, text=True, timeout=300
    )
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"strands script failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    out = json.loads(line[len("RESULT ") :])
    assert len(out["ran"]) == 1 and out["stop_reasons"] == ["end_turn", "end_turn"], out
    assert not any(out["answered"]), out["answered"]
    t = _tally(
        gateway,
        session,
        "Strands Agent (OpenAIModel)",
        len(out["answered"]),
        version=out["version"],
        stream=out["stream"],
    )
    assert (t["chained"], t["new_segments"]) == (2, {"first_call": 1})


# ---- mini-swe-agent ----------------------------------------------------------------------


def test_mini_swe_agent(gateway, tmp_path, monkeypatch):
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mini-swe-agent"))
    monkeypatch.setenv("MSWEA_SILENT_STARTUP", "1")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's prices
    import litellm
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models import get_model

    session, seen = _session(gateway, "mini-swe-agent"), Requests()
    monkeypatch.setattr(litellm, "client_session", seen.client())  # litellm's OpenAI client
    monkeypatch.setattr(litellm, "suppress_debug_info", True)  # its banner on the price lookup
    commands = []

    class NotRun(LocalEnvironment):
        """The default local environment, except that commands are shown, not run: a 135M
        model's shell commands (``rm -r`` among them) must not reach this machine."""

        def execute(self, action, cwd="", *, timeout=None):
            commands.append(action["command"])
            return {"output": "18 C, sunny\n", "returncode": 0, "exception_info": ""}

    # `mini`'s own config (mini.yaml: the bash tool, litellm); as its error and local-model
    # guide say, a model litellm has no price for needs cost_tracking "ignore_errors".
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    config["model"]["cost_tracking"] = "ignore_errors"
    config["model"]["model_kwargs"] |= {
        "api_base": session["base_url"],
        "api_key": "x",
        "max_tokens": 256,
        "seed": 1,
        "tool_choice": "required",  # every step is one bash call; step_limit ends the run
        "parallel_tool_calls": False,
    }
    model = get_model("openai/smollm2", config["model"])
    agent = DefaultAgent(
        model, NotRun(**config["environment"]), **(config["agent"] | {"step_limit": 2})
    )
    out = agent.run(TASK)
    assert out["exit_status"] == "LimitsExceeded" and len(commands) == 2, (out, commands)
    assert seen.status.keys() == {200}
    t = _tally(
        gateway,
        session,
        "mini-swe-agent DefaultAgent",
        seen.total,
        version=version("mini-swe-agent"),
        stream=bool(seen.streamed),
    )
    assert (t["chained"], t["new_segments"]) == (1, {"first_call": 1})


# ---- DSPy --------------------------------------------------------------------------------

_SHORT = {"type": "string", "maxLength": 40}
# The reply's shape for every step of dspy.ReAct (next_*) and its extract step (reasoning,
# answer): dspy keeps the fields its signature names. The tool is always get_weather (never
# "finish"), so the run lasts max_iters; strings are short, so every reply ends well within
# max_tokens (llama.cpp's JSON grammar bounds whitespace too).
REACT_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "react_step",
        "schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["next_thought", "next_tool_name", "next_tool_args", "reasoning", "answer"],
            "properties": {
                "next_thought": _SHORT,
                "next_tool_name": {"type": "string", "enum": ["get_weather"]},
                "next_tool_args": WEATHER[0]["function"]["parameters"]
                | {"additionalProperties": False},
                "reasoning": _SHORT,
                "answer": _SHORT,
            },
        },
    },
}


def test_dspy_react(gateway, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy

    session = _session(gateway, "dspy")
    ran = []

    def get_weather(city: str) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"18 C in {city}"

    # dspy's default ChatAdapter asks for [[ ## field ## ]] sections, which a 135M model does
    # not write. The JSON schema (a response_format dspy.LM passes on as given) makes every
    # reply one JSON object: ChatAdapter cannot parse it and, as it does on any reply it
    # cannot parse, asks again through the JSONAdapter, which can. cache=False: dspy's disk
    # cache would answer a second run itself, sending nothing.
    lm = dspy.LM(
        "openai/smollm2",
        api_base=session["base_url"],
        api_key="x",
        cache=False,
        max_tokens=512,
        seed=1,
        response_format=REACT_FORMAT,
    )
    react = dspy.ReAct("question -> answer", tools=[get_weather], max_iters=2)
    with dspy.context(lm=lm):
        pred = react(question=TASK)
    assert len(ran) == 2 and isinstance(pred.answer, str)
    # dspy's own stdlib HTTP transport has no hook: its history counts the calls it made
    t = _tally(
        gateway,
        session,
        "DSPy ReAct",
        len(lm.history),
        version=version("dspy"),
        stream=False,
    )
    # each step is a new [system, user] pair (the trajectory in the user message): under a
    # system prompt already recorded, a rewrite of that conversation (history_diverged); and
    # each ChatAdapter reply is asked again by the JSONAdapter under a system prompt of its
    # own (with the step's fields): a new lineage
    assert (t["chained"], t["new_segments"]) == (
        0,
        {"first_call": 1, "new_conversation": 3, "history_diverged": 2},
    )


# ---- SmolLM2's own template --------------------------------------------------------------


def test_a_template_that_ignores_tools_is_warned_about(engine, smollm2, tmp_path):
    log = tmp_path / "turnstile.log"
    url, proc = _serve(engine, smollm2, tmp_path / "data", log)
    try:
        session = _session(url, "own-template")
        client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
        client.chat.completions.create(
            model="smollm2", messages=_start(), tools=WEATHER, max_tokens=2
        )
        client.chat.completions.create(model="smollm2", messages=_start(), max_tokens=2)
        calls = httpx.get(f"{url}/v1/sessions/{session['id']}/calls", headers=AUTH).json()["data"]
    finally:
        _stop(proc)
    assert "does not render 'tools'" in log.read_text()
    assert any("does not render 'tools'" in w for w in calls[0]["warnings"])
    assert "warnings" not in calls[1]
