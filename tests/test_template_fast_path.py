"""``ChatTemplate`` renders without transformers' per-call deep copy of the inputs; the text
must be exactly what ``render_jinja_template`` (what vLLM and SGLang call) gives. Every
template in the corpus, every prefix of the audit battery with and without reasoning, with and
without the generation prompt, with and without ``enable_thinking``."""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

import turnstile_testbed as testbed
from turnstile.chat.audit_battery import TOOLS, battery
from turnstile.chat.content import ContentFormat, detect_content_format, normalise
from turnstile.chat.template import ChatTemplate, TemplateError

pytestmark = pytest.mark.integration

TEMPLATES = sorted(testbed.templates_dir().glob("*.jinja"))
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def _reference(
    source: str,
    fmt: ContentFormat,
    messages: list[dict],
    tools: list[dict] | None,
    gen: bool,
    kwargs: dict,
) -> str:
    rendered, _ = render_jinja_template(
        conversations=[normalise(messages, fmt)],
        tools=tools,
        chat_template=source,
        add_generation_prompt=gen,
        **SPECIAL,
        **kwargs,
    )
    return rendered[0]


def test_corpus_is_there() -> None:
    assert len(TEMPLATES) >= 70


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_fast_render_is_transformers_render(path) -> None:  # noqa: ANN001
    source = path.read_text()
    ours = ChatTemplate(source, SPECIAL)
    fmt = detect_content_format(source)  # once per template (it parses the source: ~35 ms)
    variants: list[tuple[list[dict] | None, bool, dict]] = [(TOOLS, True, {}), (None, False, {})]
    if "enable_thinking" in source:  # elsewhere the kwarg is never read: the same render
        variants.append((TOOLS, True, {"enable_thinking": False}))
    for reasoning in (False, True):
        for conv in battery(reasoning):
            for end in range(1, len(conv.messages) + 1):
                msgs = conv.messages[:end]
                for tools, gen, kwargs in variants:
                    try:
                        want = _reference(source, fmt, msgs, tools, gen, kwargs)
                    except Exception:  # noqa: BLE001 - the template refuses: so must we
                        with pytest.raises(TemplateError):
                            ours.render(msgs, tools, add_generation_prompt=gen, **kwargs)
                        continue
                    got = ours.render(msgs, tools, add_generation_prompt=gen, **kwargs)
                    assert got == want, (path.stem, conv.name, end, gen, kwargs)
