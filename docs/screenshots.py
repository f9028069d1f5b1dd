"""Take the README's screenshots of the trajectory viewer (docs/viewer-*.png).

SmolLM2-135M-Instruct on llama-server (the test bed's), Turnstile in front of it, the official
openai client as the harness: one group of four rollouts of a task (one retried, one whose
history was edited: a new segment), rewards posted as a trainer would. Then headless Chromium
(Debian's, through Selenium) opens the three views and saves them.

    PYTHONPATH=. python docs/screenshots.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import openai
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import turnstile_testbed as testbed
from turnstile.app.wiring import build_gateway
from turnstile.server.app import create_app
from turnstile.viewer.routes import viewer_routes
from turnstile_testbed.demo import serve_in_thread

OUT = Path(__file__).resolve().parent
MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = [
    "I have 3 apples and buy 5 more. How many apples do I have?",
    "I eat two of them. How many are left?",
]


def rollouts(base: str) -> str:
    """A group of four samples; returns the id of the one with a new segment."""
    edited = ""
    for k in range(4):
        s = httpx.post(
            base + "/v1/sessions",
            json={"group_id": "apples-7", "sample_index": k, "task_id": "apples"},
        ).json()
        client = openai.OpenAI(base_url=s["base_url"], api_key="unused", max_retries=0)
        msgs: list = [{"role": "system", "content": "You are a careful math tutor."}]
        for turn, q in enumerate(QUESTIONS):
            msgs.append({"role": "user", "content": q})
            kw = dict(
                model=MODEL,
                messages=msgs,
                max_tokens=60,
                temperature=1.0,
                seed=10 * k + turn,
                logprobs=True,
            )
            reply = client.chat.completions.create(**kw)  # type: ignore[call-overload]
            if k == 1 and turn == 0:  # the harness retried this call: a sibling
                reply = client.chat.completions.create(**{**kw, "seed": 99})
            msgs.append({"role": "assistant", "content": reply.choices[0].message.content})
        if k == 2:  # the harness compacted its history: a new segment, history_diverged
            msgs[2] = {"role": "assistant", "content": "Eight apples."}
            msgs.append({"role": "user", "content": "Now double it."})
            client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=40, temperature=1.0, seed=7, logprobs=True
            )
            edited = s["id"]
        httpx.post(
            f"{base}/v1/sessions/{s['id']}/rewards",
            json={"rewards": {"correct": float(k % 2 == 0), "format": 0.1 * (k + 2)}},
        )
        httpx.post(f"{base}/v1/sessions/{s['id']}/close", json={})
    return edited


def main() -> None:
    model = testbed.smollm2_gguf()
    data = Path(tempfile.mkdtemp(prefix="turnstile-shots-"))
    with testbed.llama_server(model, ctx=4096, parallel=2) as engine_url:
        gateway = build_gateway(engine_url, str(model), data, model_name=MODEL)
        port = testbed.free_port()
        base = f"http://127.0.0.1:{port}"
        app = create_app(
            gateway,
            base,
            token=None,
            tokenizer=gateway.renderer.tok,
            mounted=viewer_routes(gateway.model_name),
        )
        with serve_in_thread(app, port):
            edited = rollouts(base)
            shoot(base, edited)


def shoot(base: str, edited: str) -> None:
    browser = testbed.headless_chromium(1400, 1000)
    wait = WebDriverWait(browser, 30, 0.05)
    try:
        browser.get(base + "/ui#/")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr.session-row"))
        browser.save_screenshot(str(OUT / "viewer-sessions.png"))
        browser.get(base + "/ui#/group/apples-7")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr.sample-row"))
        browser.save_screenshot(str(OUT / "viewer-group.png"))
        browser.get(f"{base}/ui#/session/{edited}?mode=merged&t=1")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#tokens .chunk.rendered"))
        browser.set_window_size(1400, 1500)
        sampled = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.s")
        target = sampled[len(sampled) // 3]
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", target)
        ActionChains(browser).move_to_element(target).perform()
        wait.until(lambda b: b.find_element(By.ID, "tip").is_displayed())
        browser.execute_script("window.scrollTo(0, 0)")
        ActionChains(browser).move_to_element(target).perform()
        # the viewer names the model as served, never by its file (issue 46)
        shown = browser.find_element(By.TAG_NAME, "body").text
        assert f"text by {MODEL}" in shown and ".gguf" not in shown, shown[:2000]
        browser.save_screenshot(str(OUT / "viewer-session.png"))
    finally:
        browser.quit()
    print("wrote", *sorted(p.name for p in OUT.glob("viewer-*.png")))


if __name__ == "__main__":
    main()
