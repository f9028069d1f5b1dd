"""The trajectory viewer (``/ui``) in a real headless Chromium: Debian's ``chromium`` and
``chromium-driver`` driven by Selenium (``testbed.headless_chromium``; nothing downloaded at test
time). Sessions are recorded against a real llama-server through the official openai client;
what the page shows is checked against the trainer's JSON routes and against what the engine
returned (the recording relay), never against the viewer's own routes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

import turnstile_testbed as testbed

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def browser() -> Iterator:
    driver = testbed.headless_chromium()
    yield driver
    driver.quit()


def until(browser, cond, timeout: float = 30):
    """Poll ``cond(browser)`` until it is truthy (WebDriverWait: a deadline, no fixed sleep)."""
    return WebDriverWait(
        browser,
        timeout,
        poll_frequency=0.05,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    ).until(cond)


def open_page(browser, base: str, fragment: str, token: str | None) -> None:
    """Open ``/ui#fragment``; give the trainer's token if the page asks for it."""
    browser.get(f"{base}/ui#{fragment}")
    if token is None:
        return

    def ready(b):
        return b.find_element(By.ID, "login").is_displayed() or b.find_elements(
            By.CSS_SELECTOR, "main h1"
        )

    until(browser, ready)
    if browser.find_element(By.ID, "login").is_displayed():
        browser.find_element(By.ID, "token").send_keys(token, Keys.ENTER)


def rows(browser, css: str = "tr.session-row") -> set[str]:
    """The data-id of every row, read in one step (the page re-renders as filters change)."""
    return set(
        browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.dataset.id)", css
        )
    )


def rows_become(browser, want: set[str], css: str = "tr.session-row") -> None:
    until(browser, lambda b: rows(b, css) == want)


def ask(session: dict, messages: list[dict], no_end: dict, **kw) -> str:
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=6,
        logit_bias=no_end,
        seed=3,
        logprobs=True,
        **kw,
    )
    return out.choices[0].message.content or ""


def test_list_filters_counts_and_group(turnstile, browser, no_end_bias):
    a = turnstile.session(group_id="ga", sample_index=0)
    b = turnstile.session(group_id="ga", sample_index=1)
    c = turnstile.session(group_id="gb", sample_index=0)
    first = [{"role": "user", "content": "Hi."}]
    for s in (a, b, c):
        ask(s, first, no_end_bias)
    # b: an edited history starts a new segment
    reply = turnstile.get(f"/v1/sessions/{b['id']}/calls")["data"][0]["message"]["content"]
    ask(
        b,
        [
            {"role": "user", "content": "Hello (edited)."},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "More."},
        ],
        no_end_bias,
    )
    for s, r in ((a, 1.0), (b, 0.0), (c, 0.5)):
        turnstile.http.post(
            f"{turnstile.url}/v1/sessions/{s['id']}/rewards", json={"reward": r}
        ).raise_for_status()
    turnstile.http.post(f"{turnstile.url}/v1/sessions/{c['id']}/close", json={}).raise_for_status()
    calls_b = turnstile.get(f"/v1/sessions/{b['id']}/calls")["data"]
    assert [x["segment_reason"] for x in calls_b] == ["first_call", "history_diverged"]
    ids = {a["id"], b["id"], c["id"]}

    open_page(browser, turnstile.url, "/", turnstile.token)  # the page asks for the token
    rows_become(browser, ids)
    assert browser.find_element(By.ID, "counts").text.startswith("3 of 3 sessions")

    Select(browser.find_element(By.ID, "f-group")).select_by_value("ga")
    group_a = {s["id"] for s in turnstile.get("/v1/sessions?group=ga")["data"]}
    rows_become(browser, group_a)
    assert group_a == {a["id"], b["id"]}
    Select(browser.find_element(By.ID, "f-new_segments")).select_by_value("true")
    rows_become(browser, {b["id"]})
    assert browser.find_element(By.ID, "counts").text.startswith("1 of 3 sessions")

    browser.find_element(By.CSS_SELECTOR, "a.reset").click()
    rows_become(browser, ids)
    browser.find_element(By.ID, "f-min_reward").send_keys("0.5", Keys.TAB)
    rows_become(browser, {a["id"], c["id"]})
    Select(browser.find_element(By.ID, "f-status")).select_by_value("closed")
    rows_become(browser, {c["id"]})

    # the group view: one row per sample, with its reward
    open_page(browser, turnstile.url, "/group/ga", None)
    rows_become(browser, {a["id"], b["id"]}, "tr.sample-row")
    best = browser.find_element(By.CSS_SELECTOR, "tr.sample-row.best")
    assert best.get_attribute("data-id") == a["id"] and "reward 1.000" in best.text


def _engine_logprobs(exchanges: list) -> dict[int, tuple[int, float]]:
    """Position in the stitched sequence → (token, logprob) as llama-server reported them
    (it omits the logprob of a token that ends inside a UTF-8 character)."""
    out = {}
    for ex in exchanges:
        start, sampled = len(ex.request["prompt"]), ex.response["tokens"]
        probs, j = ex.response["completion_probabilities"], 0
        for k, tok in enumerate(sampled):
            if j < len(probs) and probs[j]["id"] == tok:
                out[start + k] = (tok, probs[j]["logprob"])
                j += 1
    return out


def test_session_tokens_hover_and_segment_break(turnstile, relay, browser, no_end_bias):
    s = turnstile.session()
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi."}]
    msgs.append({"role": "assistant", "content": ask(s, msgs, no_end_bias)})
    msgs.append({"role": "user", "content": "And then?"})
    msgs.append({"role": "assistant", "content": ask(s, msgs, no_end_bias)})
    first_path = relay.completions()[:2]
    edited = [dict(m) for m in msgs]
    edited[1]["content"] = "Hello, edited."
    ask(s, [*edited, {"role": "user", "content": "Go on."}], no_end_bias)

    sid = s["id"]
    calls = turnstile.get(f"/v1/sessions/{sid}/calls")["data"]
    trajs = turnstile.get(f"/v1/sessions/{sid}/trajectories")["data"]
    assert [t["segment_reason"] for t in trajs] == ["first_call", "history_diverged"]
    diverged = calls[-1]
    assert diverged["segment_reason"] == "history_diverged"

    for k, t in enumerate(trajs):
        open_page(browser, turnstile.url, f"/session/{sid}?mode=merged&t={k}", turnstile.token)
        until(
            browser,
            lambda b, t=t: b.find_elements(
                By.CSS_SELECTOR, f'#trajectory[data-id="{t["id"]}"] #tokens .chunk.rendered'
            ),
        )
        # every chunk of a short trajectory is on screen: all its tokens are rendered
        assert len(browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")) == len(t["token_ids"])
        sampled = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.s")
        assert len(sampled) == sum(t["loss_mask"]) > 0
        reason = browser.find_element(By.CSS_SELECTOR, "#trajectory .segment-break .reason")
        assert reason.text == t["segment_reason"]

    # the call tree: the new segment shows its reason and the gateway's detail
    node = browser.find_element(By.CSS_SELECTOR, f'li.call[data-call="{diverged["id"]}"]')
    assert "segment: history_diverged" in node.text
    assert diverged["segment_detail"] in node.text
    # ... and the differing message beside the recorded one, decoded around the first
    # token that differs from what the engine was sent before
    first_prompt = relay.completions()[0].request["prompt"]
    sent = relay.completions()[-1].request["prompt"]
    differ = next(i for i, (x, y) in enumerate(zip(first_prompt, sent, strict=False)) if x != y)
    assert f"prompt token {differ} is the first" in browser.find_element(By.ID, "divergence").text
    assert "Hello, edited." in browser.find_element(By.CSS_SELECTOR, "#divergence .sent").text
    assert "Hi." in browser.find_element(By.CSS_SELECTOR, "#divergence .recorded").text
    mark = browser.find_element(By.CSS_SELECTOR, f'#tokens .tok.drift[data-i="{differ}"]')
    assert mark.get_attribute("data-i") == str(differ)

    # hover: the tooltip shows the token and the logprob llama-server reported for it
    open_page(browser, turnstile.url, f"/session/{sid}?mode=merged&t=0", turnstile.token)
    t = trajs[0]
    assert t["token_ids"] == first_path[-1].request["prompt"] + first_path[-1].response["tokens"]
    engine = _engine_logprobs(first_path)
    assert engine, "llama-server reported no logprob"
    for pos in sorted(engine)[:: max(1, len(engine) // 3)]:
        el = until(
            browser,
            lambda b, pos=pos: b.find_element(By.CSS_SELECTOR, f'#tokens .tok[data-i="{pos}"]'),
        )
        assert "s" in el.get_attribute("class").split()
        ActionChains(browser).move_to_element(el).perform()
        until(
            browser,
            lambda b, pos=pos: (
                b.find_element(By.ID, "tip").is_displayed()
                and b.find_element(By.CSS_SELECTOR, "#tip .tip-id").text == str(engine[pos][0])
                and f"token {pos} of" in b.find_element(By.ID, "tip").text
            ),
        )
        shown = float(browser.find_element(By.CSS_SELECTOR, "#tip .tip-logprob").text)
        assert shown == pytest.approx(engine[pos][1], rel=1e-6, abs=1e-6)
        assert shown == t["logprobs"][pos]


@pytest.mark.parametrize("served", ["policy-v7", None])
def test_the_page_names_the_model_as_its_user_did(
    served, relay, turnstile_factory, tiny_qwen2: Path, browser, no_end_bias
):
    """``--served-model-name`` when given, else the model file's name: never the path the
    tokenizer was loaded from (the name is the test's own argument, or the file's)."""
    extra = ("--served-model-name", served) if served else ()
    t = turnstile_factory(relay.url, tiny_qwen2, extra=extra)
    want = served or tiny_qwen2.name
    s = t.session()
    ask(s, [{"role": "user", "content": "Hi."}], no_end_bias)
    assert [c["model"] for c in t.get(f"/v1/sessions/{s['id']}/calls")["data"]] == [want]
    assert t.get(f"/v1/viewer/sessions/{s['id']}/trajectories")["tokenizer"] == want

    open_page(browser, t.url, f"/session/{s['id']}", t.token)
    legend = until(browser, lambda b: b.find_element(By.CSS_SELECTOR, "#trajectory .legend"))
    assert legend.text.endswith(f"text by {want}")
    assert str(tiny_qwen2.parent) not in browser.find_element(By.TAG_NAME, "body").text


def test_view_serves_a_store_read_only_and_renders_lazily(browser, tmp_path: Path, tiny_qwen2):
    from benchmarks.synthetic import fill
    from turnstile.store.store import Store

    store = Store(tmp_path / "data")
    total = fill(store, sessions=1, calls=2000, delta=20, completion=30, retry_every=10**9)
    store.close()
    assert total >= 100_000
    port = testbed.free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "view.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "view",
            "--data",
            str(tmp_path / "data"),
            "--port",
            str(port),
            "--no-auth",
            "--model",
            str(tiny_qwen2),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        testbed.wait_healthy(base + "/v1/viewer/sessions", proc, timeout=60)
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/sessions"),
            ("GET", "/v1/models"),
            ("POST", "/v1/responses"),
            ("POST", "/admin/pause"),
        ):
            r = httpx.request(method, base + path, json={})
            assert r.status_code == 503, (path, r.text)
            assert "read-only" in r.json()["error"]["message"]
        traj = httpx.get(base + "/v1/sessions/sess_syn00000000/trajectories", timeout=60).json()[
            "data"
        ]
        assert len(traj) == 1
        n = len(traj[0]["token_ids"])
        assert n == total

        open_page(browser, base, "/session/sess_syn00000000", None)  # --no-auth: no form
        # 2000 calls: the call tree starts folded, the tokens are near the top
        until(
            browser,
            lambda b: b.find_elements(By.CSS_SELECTOR, "#tokens .chunk.rendered"),
            timeout=60,
        )
        assert browser.find_element(By.ID, "call-tree").get_attribute("open") is None
        # the tokens' text by --model's file, named as the file is, not by its path
        legend = browser.find_element(By.CSS_SELECTOR, "#trajectory .legend").text
        assert legend.endswith(f"text by {tiny_qwen2.name}")
        assert not browser.find_element(By.ID, "login").is_displayed()
        rendered = len(browser.find_elements(By.CSS_SELECTOR, "#tokens .tok"))
        assert 0 < rendered <= n // 10  # only the chunks near the screen
        browser.execute_script(
            "document.querySelector('#tokens .chunk:last-child').scrollIntoView()"
        )
        last = until(
            browser, lambda b: b.find_element(By.CSS_SELECTOR, f'#tokens .tok[data-i="{n - 1}"]')
        )
        assert last.text  # the text piece of the last token
        assert len(browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")) < n // 2
        # the Parquet download holds the same tokens as the trajectories route
        import io

        import pyarrow.parquet as pq

        blob = httpx.get(
            base + "/v1/viewer/sessions/sess_syn00000000/trajectories.parquet", timeout=60
        ).content
        table = pq.read_table(io.BytesIO(blob))
        assert table.column("token_ids").to_pylist() == [traj[0]["token_ids"]]
        assert json.loads(json.dumps(table.column("loss_mask").to_pylist())) == [
            traj[0]["loss_mask"]
        ]
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
