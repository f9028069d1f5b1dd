"""llama-server ends a generation on every token whose text it knows as an end (a plain
``</s>`` in the Qwen2 vocabulary, ``<|tool_response>`` in Gemma 4's, ...), whatever the model
file names as its end tokens. The llama.cpp engine declares that rule
(``engines.llamacpp.eog_by_text``), so a gateway built for it counts such a stop as the end of
the turn: its text never reaches the harness as content. Truth: the end tokens llama-server
itself lists when it loads each model (``-lv 4``), and what it sampled."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import llama_end_ids

import turnstile_testbed as testbed
from turnstile.app.wiring import build_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QWEN25 = "Qwen-Qwen2.5-7B-Instruct"
PLAIN_S = 128247  # "</s>" in the Qwen2 vocabulary: an ordinary token, an end to llama-server


def _ends_on(url: str, token: int) -> bool:
    """Whether llama-server ends the generation when it samples ``token`` (forced)."""
    r = httpx.post(
        url + "/completion",
        json={
            "prompt": [1, 2, 3],
            "n_predict": 3,
            "logit_bias": [[token, 100]],
            "return_tokens": True,
            "cache_prompt": False,
        },
        timeout=60,
    ).json()
    assert r["tokens"][0] == token, r
    return r["stop_type"] == "eos" and len(r["tokens"]) == 1


@pytest.mark.parametrize("vocab", ["qwen2", "gemma-4", "phi-3", "llama-bpe"])
def test_the_gateway_ends_where_llama_server_ends(vocab: str, tmp_path: Path):
    """Every token llama-server lists as an end when it loads the model, and every token the
    gateway counts as one, sampled by force: the gateway's ends are the ones that stopped it.
    (Gemma 4's ``</s>`` is listed, then dropped by a later rule: forcing it tells.)"""
    model = testbed.tiny_model(vocab, QWEN25)
    listed = set(llama_end_ids(model, tmp_path / "load.log"))
    gw = build_gateway("http://127.0.0.1:9", str(model), tmp_path / "data", audit_template=False)
    own = gw.tok.eog_token_ids
    with testbed.llama_server(model, ctx=512, parallel=1, log=tmp_path / "llama.log") as url:
        stopping = {t for t in listed | own if _ends_on(url, t)}
    assert own == stopping, (sorted(stopping - own), sorted(own - stopping))
    if vocab == "qwen2":  # the rule is llama-server's: a vLLM gateway has no such end
        assert PLAIN_S in own
        vllm = build_gateway(
            "http://127.0.0.1:9", str(model), tmp_path / "v", audit_template=False, engine="vllm"
        )
        assert PLAIN_S not in vllm.tok.eog_token_ids


def test_a_stop_on_a_plain_end_token_is_a_stop(turnstile, relay):
    """The model forced onto the plain ``</s>``: llama-server stops there; the harness gets
    a stop with no ``</s>`` in the content, and the record keeps the token as the stop."""
    session = turnstile.session()
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "logit_bias": {str(PLAIN_S): 100},
        },
        timeout=60,
    ).json()
    [ex] = relay.completions()
    assert ex.response["tokens"][-1] == PLAIN_S  # what llama-server sampled and stopped on
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "</s>" not in (choice["message"]["content"] or "")
    [call] = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert call["stop_token_id"] == PLAIN_S and call["completion_ids"] == ex.response["tokens"]
