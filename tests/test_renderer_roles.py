"""A developer message (Codex sends its whole instructions as one) reaches the model under a
template that knows no developer role: the Qwen2.5 template drops it without a word, so the
renderer shows it as the system message it stands for; a template that names the role
(gpt-oss's Harmony) gets it as is. Truth: the templates' own renders (transformers')."""

from __future__ import annotations

import pytest

import turnstile_testbed as testbed
from turnstile.chat.render import Renderer
from turnstile.chat.template import ChatTemplate
from turnstile.chat.tokenizer import load_tokenizer

pytestmark = pytest.mark.unit

DEV = {"role": "developer", "content": "Follow the repository's style."}
USER = {"role": "user", "content": "Fix the bug."}


def _renderer(template: str) -> Renderer:
    tok = load_tokenizer(str(testbed.models_dir() / "ggml-vocab-qwen2.gguf"))
    source = (testbed.templates_dir() / f"{template}.jinja").read_text()
    return Renderer(tok, ChatTemplate(source, tok.special_tokens))


def test_a_template_without_the_role_shows_developer_messages_as_system():
    r = _renderer("Qwen-Qwen2.5-7B-Instruct")
    dropped = r.template.render([DEV, USER], None)
    assert DEV["content"] not in dropped  # what the template does with the role itself
    system = r.template.render([{**DEV, "role": "system"}, USER], None)
    assert r.render([DEV, USER], None) == system
    assert r.render_full([DEV, USER], None) == r.encoder.encode(system)


def test_a_template_that_renders_any_role_gets_developer_messages_as_they_are():
    """No "developer" in its source, but it writes each message's role as it comes: the
    message is rendered under its own role, as vLLM renders it."""
    r = _renderer("ByteDance-Seed-OSS")
    assert "developer" not in r.template.source and not r.drops_developer
    assert r.render([DEV, USER], None) == r.template.render([DEV, USER], None)


@pytest.mark.parametrize("template", ["openai-gpt-oss-120b"])
def test_a_template_that_names_the_role_gets_it_as_is(template):
    r = _renderer(template)
    assert not r.drops_developer
    assert r.render([DEV, USER], None) == r.template.render([DEV, USER], None)
