"""Conformance over the whole template corpus: zero silent mismatches.

The gateway's policy comes from the standard audit battery (run at start). These tests play
*other*, longer conversations (multi-step tool chains, parallel calls followed by a user
turn, truncation mid-chain) through the same incremental path and check every step against
the template's full render: a step must be exact, or be refused (new segment) by the
renderer or the policy. A mismatch that nothing refused fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import turnstile_testbed as testbed
from turnstile.chat.audit import VARIANT_KWARGS, audit, play
from turnstile.chat.audit_battery import SYSTEM, TOOLS, USER1, USER2, Conversation
from turnstile.chat.audit_battery import assistant as _assistant
from turnstile.chat.audit_battery import tool_call as _call
from turnstile.chat.audit_battery import tool_result as _tool
from turnstile.chat.audit_corpus import corpus_renderer
from turnstile.chat.patches import apply_patches
from turnstile.chat.render import Renderer
from turnstile.chat.template import ChatTemplate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TEMPLATES = sorted(p.stem for p in testbed.templates_dir().glob("*.jinja"))
_CACHE: dict = {}


def _renderer(name: str, patches: bool = True) -> tuple[Renderer, list[str]]:
    r, added = corpus_renderer(
        str(testbed.templates_dir() / f"{name}.jinja"), str(testbed.models_dir()), _CACHE
    )
    source, applied = apply_patches(r.template.source, patches)
    if applied:
        r = Renderer(r.tok, ChatTemplate(source, r.tok.special_tokens))
    return r, added


def held_out(reasoning: bool) -> list[Conversation]:
    r = (lambda t: t) if reasoning else (lambda t: None)
    c1 = _call("call00011", "get_weather", '{"city": "Zürich"}')
    c2 = _call("call00012", "get_time", '{"city": "Zürich"}')
    c3 = _call("call00013", "get_weather", '{"city": "Oslo \\"Norway\\""}')
    user3 = {"role": "user", "content": "Compare with Oslo, please."}
    return [
        Conversation(
            "chain",
            [
                SYSTEM,
                USER1,
                _assistant("Checking.", [c1], r("Weather first.")),
                _tool("call00011", '{"temp_c": 11, "sky": "☁"}', "get_weather"),
                _assistant(None, [c2], r("Now the time.")),
                _tool("call00012", '{"time": "09:30"}', "get_time"),
                _assistant("11 C and cloudy at 09:30.", None, r("Both known.")),
                user3,
                _assistant("", [c3], r("Oslo now.")),
                _tool("call00013", '{"temp_c": 4}', "get_weather"),
                _assistant("Oslo is colder: 4 C.", None, r("Compare.")),
                USER2,
                _assistant("Take one in Oslo.", None, r("Rain likely.")),
            ],
        ),
        Conversation(
            "parallel-then-user",
            [
                USER1,
                _assistant("", [c1, c2], r("Both at once.")),
                _tool("call00011", '{"temp_c": 11}', "get_weather"),
                _tool("call00012", '{"time": "09:30"}', "get_time"),
                _assistant("Cloudy, 09:30.", None, r("Done.")),
                user3,
                _assistant("Colder.", None, None),
            ],
        ),
        Conversation(
            "truncated-mid-chain",
            [
                SYSTEM,
                USER1,
                _assistant("", [c1], r("Weather.")),
                _tool("call00011", '{"temp_c": 11}', "get_weather"),
                _assistant("It is eleven degrees and the sky over the lake is", None, r("Long.")),
                USER2,
                _assistant("Yes.", None, None),
            ],
            truncated={4},
        ),
    ]


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_silent_mismatch_on_held_out_conversations(name):
    renderer, _ = _renderer(name)
    policy = audit(renderer, name).policy()
    silent = []
    for variant, reasoning in (("plain", False), ("think", True)):
        for conv in held_out(reasoning):
            for step in play(renderer, conv, variant, TOOLS, **VARIANT_KWARGS[variant]):
                refused = not policy.allows(step.kind, variant)
                if step.status == "MISMATCH" and not refused:
                    silent.append(step)
    assert not silent, "\n".join(
        f"{s.conversation}/{s.variant}/{s.kind}: {s.detail}" for s in silent
    )


def test_chatml_family_extends_exactly_everywhere():
    """Qwen2.5 with its own tokenizer: every append extends the recorded tokens exactly."""
    renderer, added = _renderer("Qwen-Qwen2.5-7B-Instruct")
    assert added == []  # the real Qwen2 vocabulary, no stand-in
    report = audit(renderer)
    assert {s.status for s in report.steps} == {"exact"}
    assert {s.detail for s in report.steps} == {"stop", "synthesized_close; after length"}
    assert {s.kind for s in report.steps} == {
        "tool",
        "user",
        "tool+user",
        "tool+system",
        "system+user",
        "system",
        "developer+user",
    }


def test_qwen3_patch_is_why_tool_results_extend():
    stock, _ = _renderer("Qwen-Qwen3-0.6B", patches=False)
    patched, _ = _renderer("Qwen-Qwen3-0.6B", patches=True)
    s_stock = audit(stock).summary()
    s_patched = audit(patched).summary()
    # Stock: an empty <think> block appears only while the turn is last -> tool appends
    # without reasoning re-render the turn, and the gateway must start new segments.
    assert s_stock["tool"] == "fallback/exact"
    assert s_patched["tool"] == "exact/exact"
    # A new user query still drops past reasoning: honest new segment, patched or not.
    assert s_patched["user"].startswith("fallback")
    assert not audit(patched).policy().allows("user", "think")


def test_policy_refuses_what_the_renderer_cannot_see():
    """Gemma 4 drops the reasoning of an *earlier* tool-call turn at a new user query; the
    per-call stand-in cannot see that turn, so the startup audit's policy must refuse it."""
    renderer, _ = _renderer("google-gemma-4-31B-it-interleaved")
    report = audit(renderer)
    assert any(
        s.status == "MISMATCH" and s.kind == "user" and s.variant == "think" for s in report.steps
    )
    policy = report.policy()
    assert not policy.allows("user", "think")
    assert policy.allows("tool", "think")


def test_stand_in_lists_its_added_markers():
    _, added = _renderer("deepseek-ai-DeepSeek-V3.1")
    assert any("tool" in m for m in added)
    assert Path(testbed.templates_dir() / "deepseek-ai-DeepSeek-V3.1.jinja").exists()
