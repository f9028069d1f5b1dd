"""``GET /metrics`` (issue 15): scraped and parsed with Prometheus' own parser after real calls
through the official openai client to Turnstile → recording relay → llama-server. The counts
are checked against what the engine received and returned (the relay) and against the
store's records, not against the gateway's own counters."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def scrape(ts) -> dict[str, list]:  # noqa: ANN001
    r = httpx.get(ts.url + "/metrics", headers=ts.headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(r.text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def value(fams: dict, sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels``."""
    return sum(
        s.value
        for ss in fams.values()
        for s in ss
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_count_what_the_engine_and_the_store_saw(turnstile, relay, no_end_bias):
    ts = turnstile
    assert httpx.get(ts.url + "/metrics", timeout=10).status_code == 401  # trainer's route
    before = len(relay.completions())
    sessions = [ts.session(task=str(i)) for i in range(3)]
    bad = 0
    for s in sessions:
        oa = openai.OpenAI(base_url=s["base_url"], api_key="unused", max_retries=0)
        msgs: list[dict] = [{"role": "user", "content": "hello there"}]
        for turn in range(3):
            r = oa.chat.completions.create(
                model="m", messages=msgs, max_tokens=3 + turn, logit_bias=no_end_bias, temperature=0
            )
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": f"turn {turn}"},
            ]
        # a rewritten history: a new segment, with its reason
        oa.chat.completions.create(
            model="m",
            max_tokens=2,
            logit_bias=no_end_bias,
            messages=[{"role": "system", "content": "other"}, *msgs],
        )
        with pytest.raises(openai.BadRequestError):  # refused before any engine call
            oa.chat.completions.create(model="m", messages=msgs, n=2)
        bad += 1
    missing = openai.OpenAI(base_url=ts.url + "/s/cap_nothing_here/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        missing.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    fams = scrape(ts)
    exchanges = relay.completions()[before:]
    records = [c for s in sessions for c in ts.get(f"/v1/sessions/{s['id']}/calls")["data"]]
    assert len(records) == len(exchanges) == 12
    replica = f"{socket.gethostname()}:{ts.proc.pid}"
    labels = {s.labels.get("replica") for ss in fams.values() for s in ss if s.labels}
    assert labels == {replica}

    assert value(fams, "turnstile_calls_total", status="ok") == len(exchanges)
    assert value(fams, "turnstile_calls_total") == len(records)
    # what the engine received and sampled
    assert value(fams, "turnstile_prompt_tokens_total") == sum(
        len(e.request["prompt"]) for e in exchanges
    )
    assert value(fams, "turnstile_sampled_tokens_total") == sum(
        len(e.response["tokens"]) for e in exchanges
    )
    # what the store recorded
    assert value(fams, "turnstile_reused_prompt_tokens_total") == sum(
        c["reused_prefix_len"] for c in records
    )
    reasons = Counter(c["segment_reason"] for c in records if c["segment_reason"])
    assert set(reasons) >= {"first_call"} and sum(reasons.values()) > len(sessions)
    for reason, n in reasons.items():
        assert value(fams, "turnstile_new_segments_total", reason=reason) == n, reason
    assert value(fams, "turnstile_new_segments_total") == sum(reasons.values())
    # one latency sample per call; engine + own time add up to the call's latency
    n = len(records)
    for h in ("call", "engine", "own", "store_write"):
        assert value(fams, f"turnstile_{h}_seconds_count") == n, h
    latency = sum(c["timings"]["latency_s"] for c in records)
    engine = sum(c["timings"]["engine_s"] for c in records)
    assert value(fams, "turnstile_call_seconds_sum") == pytest.approx(latency, rel=1e-6)
    assert value(fams, "turnstile_engine_seconds_sum") == pytest.approx(engine, rel=1e-6)
    assert value(fams, "turnstile_own_seconds_sum") == pytest.approx(
        latency - engine, rel=1e-6, abs=1e-9
    )
    assert 0 < engine < latency
    assert value(fams, "turnstile_store_write_seconds_sum") > 0
    # errors by kind: the 400s and the 404 the harness got
    errors = {
        (s.labels["status"], s.labels["kind"]): s.value
        for s in fams["turnstile_errors"]
        if s.name == "turnstile_errors_total"
    }
    assert sum(v for (st, _), v in errors.items() if st == "400") == bad
    assert errors.get(("404", "session_not_found")) == 1, errors
    assert value(fams, "turnstile_in_flight") == 0


def test_in_flight_counts_a_waiting_call(turnstile, no_end_bias):
    """A call held at the admission door (paused) is in flight until it is answered."""
    ts = turnstile
    s = ts.session()
    assert ts.http.post(ts.url + "/admin/pause", json={"mode": "drain"}).status_code == 200
    oa = openai.OpenAI(base_url=s["base_url"], api_key="unused", max_retries=0)
    done = threading.Event()

    def call() -> None:
        oa.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            logit_bias=no_end_bias,
        )
        done.set()

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 60
    while value(scrape(ts), "turnstile_in_flight") != 1:
        assert time.monotonic() < deadline, "the call never showed in flight"
    assert not done.is_set()
    assert ts.http.post(ts.url + "/admin/resume", json={}).status_code == 200
    t.join(60)
    assert done.is_set()
    fams = scrape(ts)
    assert value(fams, "turnstile_in_flight") == 0
    assert value(fams, "turnstile_calls_total", status="ok") == 1
