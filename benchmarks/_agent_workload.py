"""The coding-agent workload of ``agent_sessions.py``, generated deterministically from a seed:
harnesses (a ~25-30k-token system prompt, 20-24 tool schemas, one wire dialect each), session
plans (50-200 turns, contexts past 100k tokens), tool results of 0.5-5k tokens, and the
engine's replies (a thought + 1-3 parallel Hermes tool calls, as Qwen2.5 writes them).

Everything here is a pure function of ``(seed, names)``: the relay and Turnstile are sent the
same sessions, turn for turn. Token counts are the Qwen2 tokenizer's (lines and paragraphs are
counted once each; a text's count is the sum of its lines', within a few percent of the
tokenizer's count of the whole text)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

DIALECTS = ("chat", "responses", "messages")
CORE_TOOLS = ("bash", "read_file", "edit_file", "grep", "glob", "list_dir")
WORDS = (
    "the repository module function class test fixture parser config value error trace "
    "build cache import handler request response session token stream buffer index schema "
    "migration query commit branch patch diff review lint format type check deploy worker "
    "queue retry timeout signal process thread lock file path directory environment variable "
    "argument option flag default return raise yield async await context manager iterator "
    "generator decorator property method attribute instance object string integer float list "
    "dict tuple set boolean none true false always never only must should prefer avoid keep "
    "small minimal correct exact careful verify reproduce inspect read write run edit search"
).split()
MODS = ["parser", "lexer", "escape", "reader", "config", "errors", "cli", "schema", "store"]
MODS += ["server", "client", "cache", "utils", "models", "views", "routes", "tasks", "auth"]


def _sentence(rng: random.Random, lo: int = 8, hi: int = 24) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def _line(rng: random.Random) -> str:
    """One line of tool output: test logs, code with line numbers, listings, tracebacks."""
    m, n, p = rng.choice(MODS), rng.randint(1, 2400), rng.randint(1, 99)
    kind = rng.randrange(7)
    if kind == 0:
        fn = f"_{rng.choice(WORDS)}_{m}"
        return f"src/pkg/{m}.py:{n}: in {fn}\n    value, rest = _split_{m}(raw, pos={p})\n"
    if kind == 1:
        status = rng.choice(["PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED"])
        pad = " " * (8 + p % 20)
        return f"tests/test_{m}.py::test_{rng.choice(WORDS)}_{n} {status}{pad}[{p:>3}%]\n"
    if kind == 2:
        args = ", ".join(
            f"{rng.choice(WORDS)}: {rng.choice(['str', 'int', 'bytes'])}" for _ in range(p % 3 + 1)
        )
        return f"{n:>6}\tdef _{rng.choice(WORDS)}_{m}(self, {args}) -> tuple[str, int]:\n"
    if kind == 3:
        name = f"{m}_{rng.choice(WORDS)}.py"
        return f"-rw-r--r--  1 root root {n * p:>7} Nov {p % 28 + 1:>2} 12:{p % 60:02d} {name}\n"
    if kind == 4:
        w = rng.choice(WORDS)
        note = _sentence(rng, 3, 7)
        return f"{n:>6}\t        if {w} is None or len(self._{m}) > {p}:  # {note}\n"
    if kind == 5:
        code = rng.choice(["E501", "F401", "W291", "B008"])
        return f"src/pkg/{m}.py:{n}:{p}: {code} {_sentence(rng, 4, 9)}\n"
    call = f"self._{m}.{rng.choice(WORDS)}({rng.choice(WORDS)}={p}, strict={rng.random() < 0.5})"
    return f"{n:>6}\t    return {call}\n"


@dataclass(frozen=True)
class Harness:
    """One agent harness: its system prompt, its tools (Chat Completions shape) and dialect."""

    name: str
    dialect: str
    system: str
    tools: list[dict]
    system_tokens: int
    tools_tokens: int


@dataclass
class Reply:
    """One reply the fake engine can sample: the thought and the calls, and their tokens."""

    thought: str
    calls: list[tuple[str, dict]]
    token_ids: list[int] = field(default_factory=list)

    def text(self) -> str:
        body = "\n".join(
            f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
            for n, a in self.calls
        )
        return f"{self.thought}\n{body}"


@dataclass(frozen=True)
class Plan:
    """One session: which harness, whether it streams, how many turns, its context budget."""

    index: int
    harness: int
    stream: bool
    turns: int
    budget: int  # context tokens its tool results aim at by the last turn
    start: int  # the turn the benchmark resumes it at (0 for a session started fresh)


def _schema(rng: random.Random, name: str) -> dict:
    props: dict[str, Any] = {}
    for _ in range(rng.randint(2, 6)):
        key = rng.choice(WORDS) + "_" + rng.choice(WORDS)
        kind = rng.choice(["string", "string", "integer", "boolean", "array"])
        prop: dict[str, Any] = {
            "type": kind,
            "description": " ".join(_sentence(rng) for _ in range(2)),
        }
        if kind == "array":
            prop["items"] = {"type": "string"}
        if kind == "string" and rng.random() < 0.3:
            prop["enum"] = sorted({rng.choice(WORDS) for _ in range(4)})
        props[key] = prop
    required = sorted(props)[: rng.randint(1, len(props))]
    core = {
        "bash": {"command": {"type": "string", "description": "The command line to run."}},
        "read_file": {
            "path": {"type": "string", "description": "Absolute path."},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
        },
        "edit_file": {
            "path": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
        },
        "grep": {"pattern": {"type": "string"}, "path": {"type": "string"}},
        "glob": {"pattern": {"type": "string"}},
        "list_dir": {"path": {"type": "string"}},
    }
    if name in core:
        props = {**core[name], **props}
        required = sorted({*core[name], *required})
    return {"type": "object", "properties": props, "required": required}


def _tools(rng: random.Random) -> list[dict]:
    names = list(CORE_TOOLS)
    while len(names) < rng.randint(20, 24):
        n = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
        if n not in names:
            names.append(n)
    return [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": " ".join(_sentence(rng) for _ in range(rng.randint(3, 12))),
                "parameters": _schema(rng, n),
            },
        }
        for n in names
    ]


class Workload:
    """The generator: harnesses, replies, session plans, tool outputs; all from ``seed``."""

    N_REPLIES = 16
    MAX_TOKENS = 8192  # a call's max_tokens is MAX_TOKENS + the reply the fake should sample

    def __init__(self, seed: int, tok: Any, system_tokens: tuple[int, int] = (25_000, 30_000)):
        self.seed, self.tok = seed, tok
        rng = random.Random(f"{seed}:lines")
        lines = {_line(rng) for _ in range(4000)}
        self.lines = sorted(lines)
        self.line_tokens = [len(tok.encode(x)) for x in self.lines]
        self.harnesses = [self._harness(i, d, system_tokens) for i, d in enumerate(DIALECTS)]
        self.replies = [self._reply(v) for v in range(self.N_REPLIES)]
        self._outputs: dict[tuple[int, int, int], tuple[str, int]] = {}

    def _harness(self, i: int, dialect: str, span: tuple[int, int]) -> Harness:
        rng = random.Random(f"{self.seed}:harness:{i}")
        target = rng.randint(*span)
        paras, n = [], 0
        while n < target:
            p = " ".join(_sentence(rng) for _ in range(rng.randint(3, 9))) + "\n\n"
            paras.append(p)
            n += len(self.tok.encode(p))
        system = f"You are coding agent {i} ({dialect}).\n\n" + "".join(paras)
        tools = _tools(rng)
        return Harness(
            f"agent-{dialect}",
            dialect,
            system,
            tools,
            len(self.tok.encode(system)),
            len(self.tok.encode(json.dumps(tools))),
        )

    def _reply(self, v: int) -> Reply:
        rng = random.Random(f"{self.seed}:reply:{v}")
        thought = " ".join(_sentence(rng) for _ in range(rng.randint(1, 6)))
        k = rng.choices([1, 2, 3], [0.65, 0.25, 0.10])[0]
        calls = []
        for _ in range(k):
            name = rng.choice(CORE_TOOLS)
            m = rng.choice(MODS)
            args: dict[str, Any] = {
                "bash": {
                    "command": f"cd /repo && python -m pytest tests/test_{m}.py -x -q 2>&1 "
                    f"| tail -n {rng.randint(20, 200)}"
                },
                "read_file": {
                    "path": f"/repo/src/pkg/{m}.py",
                    "offset": rng.randint(1, 900),
                    "limit": rng.choice([80, 200, 400]),
                },
                "edit_file": {
                    "path": f"/repo/src/pkg/{m}.py",
                    "old_str": _sentence(rng, 4, 10),
                    "new_str": _sentence(rng, 4, 10),
                },
                "grep": {"pattern": f"def _{rng.choice(WORDS)}", "path": "/repo/src"},
                "glob": {"pattern": f"**/*{m}*.py"},
                "list_dir": {"path": f"/repo/src/pkg/{m}"},
            }[name]
            calls.append((name, args))
        r = Reply(thought, calls)
        r.token_ids = self.tok.encode(r.text())
        return r

    def plan(self, index: int, fresh: bool, dialect_mix: tuple[float, float, float]) -> Plan:
        """Session ``index``: ``fresh`` sessions start at turn 0, the others at a turn drawn
        from their length (the benchmark resumes them there: contexts of every depth at once)."""
        rng = random.Random(f"{self.seed}:session:{index}")
        harness = rng.choices(range(len(DIALECTS)), dialect_mix)[0]
        turns = rng.randint(50, 200)
        budget = rng.randint(110_000, 200_000)
        start = 0 if fresh else rng.randrange(0, turns - 8)
        return Plan(index, harness, rng.random() < 0.5, turns, budget, start)

    def deep_plan(self, index: int, min_context: int) -> Plan:
        """A session resumed at the first turn whose context is at least ``min_context``."""
        rng = random.Random(f"{self.seed}:deep:{index}")
        index += 3_000_000  # its own session ids
        harness = rng.choices(range(len(DIALECTS)), (0.6, 0.2, 0.2))[0]
        turns = rng.randint(120, 200)
        p = Plan(index, harness, rng.random() < 0.5, turns, rng.randint(180_000, 210_000), 0)
        ctx = self.base_tokens(p)
        for t in range(turns):
            if ctx >= min_context:
                return Plan(p.index, p.harness, p.stream, p.turns, p.budget, t)
            ctx += self.turn_tokens(p, t)
        raise ValueError("no turn reaches the context asked for")

    def user(self, plan: Plan) -> str:
        rng = random.Random(f"{self.seed}:user:{plan.index}")
        return (
            "<issue>\n" + " ".join(_sentence(rng) for _ in range(rng.randint(6, 30))) + "\n</issue>"
        )

    def variant(self, plan: Plan, turn: int) -> int:
        return random.Random(f"{self.seed}:v:{plan.index}:{turn}").randrange(self.N_REPLIES)

    def output_target(self, plan: Plan, turn: int, k: int) -> int:
        """Tokens of tool result ``k`` of ``turn``: log-normal around what the budget leaves
        per call, clipped to 0.5-5k."""
        h = self.harnesses[plan.harness]
        per_turn = (plan.budget - h.system_tokens - h.tools_tokens) / plan.turns
        calls = 1.45  # mean calls per reply
        mean_reply = 110
        # 1.65: the log-normal's mean over its median, the 500-token floor and the lines'
        # rounding up (measured: contexts end within ~10% of the budget).
        median = max(500.0, (per_turn - mean_reply) / calls / 1.65)
        rng = random.Random(f"{self.seed}:o:{plan.index}:{turn}:{k}")
        return int(min(5000, max(500, rng.lognormvariate(math.log(median), 0.6))))

    def output(self, plan: Plan, turn: int, k: int) -> tuple[str, int]:
        """Tool result ``k`` of ``turn`` and its tokens (cached: both targets share it)."""
        key = (plan.index, turn, k)
        hit = self._outputs.get(key)
        if hit is None:
            target = self.output_target(plan, turn, k)
            rng = random.Random(f"{self.seed}:lines:{plan.index}:{turn}:{k}")
            parts, n = [], 0
            while n < target:
                j = rng.randrange(len(self.lines))
                parts.append(self.lines[j])
                n += self.line_tokens[j]
            hit = self._outputs[key] = ("".join(parts), n)
        return hit

    def forget(self, plan: Plan, turn: int) -> None:
        for k in range(3):
            self._outputs.pop((plan.index, turn, k), None)

    def base_tokens(self, plan: Plan) -> int:
        h = self.harnesses[plan.harness]
        return h.system_tokens + h.tools_tokens + len(self.tok.encode(self.user(plan))) + 40

    def turn_tokens(self, plan: Plan, turn: int) -> int:
        r = self.replies[self.variant(plan, turn)]
        outs = sum(self.output_target(plan, turn, k) for k in range(len(r.calls)))
        return len(r.token_ids) + 1 + outs + 12 * len(r.calls)
