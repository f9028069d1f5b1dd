"""Fuzzing every route: schema-driven (schemathesis on Turnstile's own OpenAPI document,
positive and negative cases) plus hypothesis-built hostile chat and session bodies (JSON nested
past 255 levels, integers past 2^63/2^64, template kwargs that collide with the template's own
variables, malformed tool schemas under a forced tool call, ...).

Set-up: a fast fake vLLM engine (``turnstile.testing.fake_vllm_replay``: a fixed 64-token
reply) and Turnstile
(``_servers.py turnstile``: ``turnstile serve``'s app with the vLLM token-in adapter, tiny
Qwen2-vocabulary model, Qwen2.5 template) as separate processes; requests go one at a time over
real HTTP with the trainer's token (harness routes through real session base URLs, and half
of the session-scoped requests name a real session, call or capability). Passes: no response
>= 500, no request without an answer within 30 s, the server's RSS bounded, and afterwards
every session's records and trajectories still load.

    python benchmarks/fuzz.py                   # 10,000 requests
    python benchmarks/fuzz.py --requests 2000   # the CI-sized run (tests/test_fuzz.py)
    python benchmarks/fuzz.py --quick           # 300 requests
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

import _machine
import _report
import _servers
import _workload

TIMEOUT = 30.0
DESTRUCTIVE = {("DELETE", "/v1/sessions/{sid}"), ("POST", "/v1/sessions/{sid}/close")}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def deep(depth: int, leaf: object = 1, kind: str = "list") -> object:
    out = leaf
    for _ in range(depth):
        out = [out] if kind == "list" else {"a": out}
    return out


def hostile_strategies():
    """Hypothesis strategies for bodies the schema alone rarely reaches: (method, path
    template, body) where ``{sid}``/``{capability}`` are filled in by the driver."""
    from hypothesis import strategies as st

    big_ints = st.sampled_from(
        [
            2**31,
            2**32,
            2**53 + 1,
            2**63 - 1,
            2**63,
            2**64,
            2**64 + 1,
            -(2**63) - 1,
            10**30,
            -1,
            -(2**31),
        ]
    )
    depth = st.integers(200, 320)
    nested = st.builds(deep, depth, st.just(1), st.sampled_from(["list", "dict"]))
    json_leaf = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=5), ch, max_size=3),
        max_leaves=8,
    )
    odd = st.one_of(json_leaf, nested, big_ints)
    user = [{"role": "user", "content": "hi"}]

    def tool(params: object, name: str = "f") -> dict:
        return {"type": "function", "function": {"name": name, "parameters": params}}

    schema_kw = st.sampled_from(
        [
            "required",
            "enum",
            "properties",
            "type",
            "items",
            "anyOf",
            "oneOf",
            "allOf",
            "const",
            "additionalProperties",
            "minItems",
            "maxLength",
            "pattern",
            "$ref",
            "format",
            "prefixItems",
            "minimum",
            "default",
            "$defs",
        ]
    )
    tool_params = st.one_of(
        st.dictionaries(schema_kw, odd, max_size=3),
        st.builds(
            lambda k, v: {"type": "object", "properties": {"x": {k: v}}, "required": ["x"]},
            schema_kw,
            odd,
        ),
        st.builds(lambda v: {"type": "object", "properties": v}, odd),
        odd,
    )
    chat = st.one_of(
        # grammars built from whatever the tool schema holds, under a forced call
        st.builds(
            lambda p, tc, n: {
                "messages": user,
                "tools": [tool(p, n)],
                "tool_choice": tc,
                "max_tokens": 4,
            },
            tool_params,
            st.sampled_from(["required", "auto", {"type": "function", "function": {"name": "f"}}]),
            st.sampled_from(["f", "f"]),
        ),
        st.builds(
            lambda s: {
                "messages": user,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": s},
                },
                "max_tokens": 4,
            },
            tool_params,
        ),
        # template variables that collide with the template's own
        st.builds(
            lambda k, v: {"messages": user, "chat_template_kwargs": {k: v}, "max_tokens": 2},
            st.sampled_from(
                [
                    "add_generation_prompt",
                    "tools",
                    "messages",
                    "bos_token",
                    "eos_token",
                    "raise_exception",
                    "tojson",
                    "strftime_now",
                    "enable_thinking",
                    "documents",
                    "builtin_tools",
                    "reasoning_effort",
                    "custom_tools",
                    "date_string",
                ]
            ),
            odd,
        ),
        # deep or huge values in every free-form spot
        st.builds(lambda v: {"messages": user, "metadata": v, "max_tokens": 1}, odd),
        st.builds(
            lambda v: {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": v},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "r"},
                ],
                "max_tokens": 1,
            },
            st.one_of(
                odd, odd.map(lambda v: json.dumps(v)[:200000] if not isinstance(v, int) else str(v))
            ),
        ),
        st.builds(
            lambda k, v: {"messages": user, k: v, "max_tokens": 1},
            st.sampled_from(
                [
                    "seed",
                    "max_tokens",
                    "max_completion_tokens",
                    "top_logprobs",
                    "top_k",
                    "n",
                    "temperature",
                ]
            ),
            big_ints,
        ),
        st.builds(
            lambda k, v: {"messages": user, "logit_bias": {str(k): v}, "max_tokens": 1},
            st.one_of(big_ints, st.integers(0, 200000)),
            st.integers(-100, 100),
        ),
        st.builds(lambda v: {"messages": user, "stop": v, "max_tokens": 1}, odd),
        st.builds(lambda v: {"messages": user, "tools": v, "max_tokens": 1}, odd),
        st.builds(lambda v: {"messages": v, "max_tokens": 1}, odd),
        st.builds(lambda v: {"messages": [{"role": "user", "content": v}], "max_tokens": 1}, odd),
        st.builds(
            lambda v: {"messages": user, "stream": True, "max_tokens": 1, "stream_options": v}, odd
        ),
    )
    session = st.one_of(
        st.builds(
            lambda k, v: {k: v},
            st.sampled_from(["sample_index", "group_id", "task_id", "id", "metadata"]),
            odd,
        ),
        st.builds(lambda v: {"metadata": {"group": v, "sample_index": v}}, odd),
    )
    reward = st.one_of(
        st.builds(lambda v: {"reward": v}, odd),
        st.builds(lambda k, v: {"rewards": {k: v}}, st.text(max_size=300), odd),
        st.builds(lambda v: {"reward": 1.0, "call_id": v}, odd),
    )
    return st.one_of(
        chat.map(lambda b: ("POST", "/s/{capability}/v1/chat/completions", b)),
        session.map(lambda b: ("POST", "/v1/sessions", b)),
        reward.map(lambda b: ("POST", "/v1/sessions/{sid}/rewards", b)),
        odd.map(lambda v: ("POST", "/v1/sessions/{sid}/close", {"termination_reason": v})),
        odd.map(lambda v: ("POST", "/admin/resume", {"weight_version": v})),
        odd.map(lambda v: ("POST", "/admin/pause", {"mode": "drain", "timeout": v})),
    )


class Fuzzer:
    def __init__(self, url: str, token: str, pid: int, seed: int):
        import httpx

        self.url, self.pid = url, pid
        self.auth = {"authorization": f"Bearer {token}"}
        self.http = httpx.Client(timeout=TIMEOUT)
        self.rng = random.Random(seed)
        self.stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.failures: list[dict] = []
        self.resets: list[dict] = []  # connection errors answered on a second attempt
        self.last_label = ""
        self.n = 0
        self.pool: list[dict] = []  # real sessions: id, capability, a call id
        self.rss: list[float] = []

    # real things for path parameters

    def new_session(self, calls: int = 1) -> dict:
        s = self.http.post(
            self.url + "/v1/sessions", headers=self.auth, json={"metadata": {"fuzz": True}}
        ).json()
        cap = s["base_url"].split("/s/", 1)[1].split("/", 1)[0]
        msgs = [{"role": "user", "content": "hello"}]
        for _ in range(calls):
            r = self.http.post(
                s["base_url"] + "/chat/completions", json={"messages": msgs, "max_tokens": 8}
            )
            r.raise_for_status()
            msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        calls_ = self.http.get(f"{self.url}/v1/sessions/{s['id']}/calls", headers=self.auth).json()[
            "data"
        ]
        return {"sid": s["id"], "capability": cap, "cid": calls_[0]["id"] if calls_ else "x"}

    def real(self, destructive: bool) -> dict:
        if destructive or not self.pool:
            fresh = self.new_session(calls=self.rng.choice([0, 1]))
            if not destructive:
                self.pool.append(fresh)
            return fresh
        return self.rng.choice(self.pool)

    # sending

    def send(
        self,
        label: str,
        method: str,
        path: str,
        *,
        body: object = None,
        raw: bytes | None = None,
        query: dict | None = None,
        headers: dict | None = None,
    ) -> int:
        import httpx

        hdr = {**self.auth, **(headers or {})}
        if isinstance(body, (bytes, bytearray)):
            raw, body = bytes(body), None
        if raw is None and body is not None:
            import orjson

            try:
                raw = orjson.dumps(body)
            except TypeError:  # integers orjson cannot write: the stdlib can
                raw = json.dumps(body).encode()
        if raw is not None:
            hdr.setdefault("content-type", "application/json")
        t0 = time.monotonic()
        for attempt in (0, 1):
            try:
                r = self.http.request(
                    method, self.url + path, content=raw, params=query, headers=hdr
                )
                status = r.status_code
                text = r.text[:300] if status >= 500 else ""
            except httpx.TimeoutException:
                status, text = -1, f"no answer in {TIMEOUT}s"
            except httpx.TransportError as exc:
                status, text = -2, f"{type(exc).__name__}: {exc}"
                if attempt == 0:
                    # A kept-alive connection the server had closed: counted, and the request
                    # is sent again once on a new connection (a second failure is a failure).
                    self.resets.append({"route": label, "error": text, "after": self.last_label})
                    self.http.close()
                    self.http = httpx.Client(timeout=TIMEOUT)
                    continue
            break
        self.last_label = label
        self.n += 1
        self.stats[label][status] += 1
        if status >= 500 or status < 0:
            self.failures.append(
                {
                    "route": label,
                    "status": status,
                    "answer": text,
                    "body": (raw or b"")[:100000].decode(errors="replace"),
                    "query": query,
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
        if path == "/admin/pause" and status == 200:  # never leave the door closed
            self.http.post(self.url + "/admin/resume", headers=self.auth, json={})
        if self.n % 250 == 0:
            self.rss.append(rss_mb(self.pid))
        return status

    def send_case(self, case, real: bool) -> None:
        label = f"{case.method.upper()} {case.path}"
        params = dict(case.path_parameters or {})
        if real and params:
            r = self.real((case.method.upper(), case.path) in DESTRUCTIVE)
            params.update({k: r[k] for k in params if k in r})
        path = case.path
        for k, v in params.items():
            path = path.replace("{" + k + "}", _quote(str(v)))
        body = case.body
        raw = None
        from schemathesis.core import NotSet

        if isinstance(body, NotSet):
            body = None
        elif case.media_type and case.media_type != "application/json":
            raw = body if isinstance(body, bytes) else str(body).encode()
        headers = {
            k: str(v)
            for k, v in (case.headers or {}).items()
            if k.lower() not in ("authorization", "content-type")
            and str(v).isascii()
            and str(v).isprintable()
        }
        self.send(
            label,
            case.method.upper(),
            path,
            body=body,
            raw=raw,
            query=case.query or None,
            headers={"content-type": case.media_type, **headers} if raw else headers,
        )

    def send_hostile(self, item: tuple) -> None:
        method, template, body = item
        r = self.real(template.endswith("/close"))
        path = template.replace("{sid}", r["sid"]).replace("{capability}", r["capability"])
        self.send(f"{method} {template} (hostile)", method, path, body=body)


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="") or "x"


def run(requests: int, seed: int = 0, keep: bool = False, quiet: bool = False) -> dict:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    spec = _workload.reply_spec(64)
    with _machine.workdir("fuzz", keep) as wd:
        spec_path = wd / "spec.json"
        spec_path.write_text(json.dumps(spec))
        fake, fake_url = _servers.start_fake(spec_path, None, wd / "fake.log")
        try:
            ts, url = _servers.start_turnstile(fake_url, wd / "data", None, wd / "turnstile.log")
            try:
                return _fuzz(
                    url,
                    ts.pid,
                    requests,
                    seed,
                    schemathesis,
                    GenerationMode,
                    given,
                    settings,
                    HealthCheck,
                    Phase,
                    st,
                    quiet,
                )
            finally:
                ts.stop()
        finally:
            fake.stop()


def _fuzz(
    url,
    pid,
    requests,
    seed,
    schemathesis,
    GenerationMode,
    given,
    settings,
    HealthCheck,
    Phase,
    st,
    quiet,
) -> dict:
    import httpx

    fz = Fuzzer(url, _servers.TOKEN, pid, seed)
    doc = httpx.get(url + "/openapi.json", headers=fz.auth, timeout=30).json()
    for _ in range(4):
        fz.pool.append(fz.new_session(calls=2))
    fz.rss.append(rss_mb(pid))
    t0 = time.monotonic()
    schema = schemathesis.openapi.from_dict(doc)
    ops = [r.ok() for r in schema.get_all_operations()]
    # Each request: a hostile body (40%) or a schema case of a route picked uniformly,
    # positive or negative, with real (60%) or generated path parameters.
    strategies = [
        op.as_strategy(generation_mode=mode)
        for op in ops
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ]
    hostile = hostile_strategies()

    @settings(
        max_examples=requests,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(st.data())
    def one(data):
        if fz.n >= requests:
            return
        if data.draw(st.integers(0, 9), "kind") < 4:
            fz.send_hostile(data.draw(hostile))
        else:
            case = data.draw(strategies[data.draw(st.integers(0, len(strategies) - 1))])
            fz.send_case(case, data.draw(st.integers(0, 9), "real") < 6)
        if not quiet and fz.n % 1000 == 0:
            print(
                f"  {fz.n} requests, {len(fz.failures)} failures, RSS {fz.rss[-1]:.0f} MB",
                file=sys.stderr,
                flush=True,
            )

    while fz.n < requests:
        one()
    wall = time.monotonic() - t0
    # Afterwards: the server is up and every session's records still read back.
    after_failures = []
    page = httpx.get(url + "/v1/sessions", params={"limit": 1000}, headers=fz.auth, timeout=60)
    if page.status_code != 200:
        after_failures.append(("GET /v1/sessions", page.status_code, page.text[:300]))
    else:
        for s in page.json()["data"]:
            for suffix in ("", "/calls", "/trajectories", "/trajectories?mode=per_call"):
                r = httpx.get(
                    f"{url}/v1/sessions/{_quote(s['id'])}{suffix}", headers=fz.auth, timeout=60
                )
                if r.status_code != 200:
                    after_failures.append(
                        (f"GET /v1/sessions/{s['id']!r}{suffix}", r.status_code, r.text[:300])
                    )
    fz.rss.append(rss_mb(pid))
    return {
        "requests": fz.n,
        "wall_s": wall,
        "stats": fz.stats,
        "failures": fz.failures,
        "resets": fz.resets,
        "after": after_failures,
        "rss_mb": fz.rss,
        "sessions_checked": len(page.json()["data"]) if page.status_code == 200 else 0,
    }


def report(res: dict) -> str:
    rows = []
    for label in sorted(res["stats"]):
        cnt = res["stats"][label]
        rows.append(
            [
                label,
                sum(cnt.values()),
                sum(v for k, v in cnt.items() if 200 <= k < 300),
                sum(v for k, v in cnt.items() if 400 <= k < 500),
                ",".join(f"{k}:{v}" for k, v in sorted(cnt.items()) if 400 <= k < 500),
                sum(v for k, v in cnt.items() if k >= 500),
                sum(v for k, v in cnt.items() if k < 0),
            ]
        )
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    rows.append(["total", *total, "", sum(r[5] for r in rows), sum(r[6] for r in rows)])
    rss = res["rss_mb"]
    out = [
        _report.table(
            ["route", "requests", "2xx", "4xx", "4xx codes", ">=500", "hangs"],
            rows,
            f"# Fuzz: {res['requests']} requests in {res['wall_s']:.0f} s",
        )
    ]
    out.append(
        f"server RSS: start {rss[0]:.0f} MB, max {max(rss):.0f} MB, end {rss[-1]:.0f} MB "
        f"({len(rss)} samples)"
    )
    out.append(
        f"connections reset by the server, answered on a new connection: "
        f"{len(res['resets'])}" + "".join(f"\n  {r}" for r in res["resets"][:10])
    )
    out.append(
        f"afterwards: {res['sessions_checked']} sessions re-read (record, calls, both "
        f"trajectory modes): {len(res['after'])} failures"
    )
    for f in res["failures"][:20]:
        out.append(f"FAILURE { ({**f, 'body': f['body'][:300]}) }")
    for f in res["after"][:20]:
        out.append(f"AFTER {f}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--quick", action="store_true", help="300 requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--failures", help="write the failing requests (whole bodies) to this file")
    p.add_argument("--result", help="write the whole result (JSON) to this file (tests read it)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    a = p.parse_args()
    res = run(300 if a.quick else a.requests, a.seed, a.keep, a.quiet)
    print(report(res))
    if a.result:
        Path(a.result).write_text(json.dumps(res))
    if a.failures:
        Path(a.failures).write_text(json.dumps(res["failures"], indent=1))
    ok = not res["failures"] and not res["after"]
    print("fuzz: PASS" if ok else "fuzz: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
