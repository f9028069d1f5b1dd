"""``PromptEncoder`` (pieces between added tokens, remembered) must give exactly the IDs of
encoding the whole text, for every vocabulary and template we have; where it cannot be sure
(a tokenizer whose added tokens strip spaces or match normalised text) it encodes whole."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from tokenizers import AddedToken

import turnstile_testbed as testbed
from turnstile.chat.audit_battery import TOOLS, battery
from turnstile.chat.audit_corpus import corpus_renderer
from turnstile.chat.encoding import PromptEncoder
from turnstile.chat.tokenizer import load_tokenizer

pytestmark = pytest.mark.integration  # the template corpus × vocabularies: minutes

MODELS = testbed.models_dir()
VOCABS = sorted(p for p in MODELS.glob("ggml-vocab-*.gguf") if "bert-bge" not in p.name)
TEMPLATES = sorted(testbed.templates_dir().glob("*.jinja"))
_TOKS: dict = {}


def _tok(path):  # noqa: ANN001, ANN202
    if path not in _TOKS:
        _TOKS[path] = load_tokenizer(str(path))
    return _TOKS[path]


def _samples(path) -> list[str]:  # noqa: ANN001
    inp = path.parent / f"{path.name}.inp"
    if inp.is_file():
        return inp.read_bytes().decode("utf-8").split("\n__ggml_vocab_test__\n")
    return ["Hello world", " Hello", "\n\n x", "日本語 🙂", "  ", "1234"]


def _texts(tok, samples: list[str], n: int = 60) -> list[str]:  # noqa: ANN001
    """Texts that mix the vocabulary's test strings with its added tokens at random."""
    added = [a.content for a in tok.tokenizer.get_added_tokens_decoder().values() if a.content]
    rng = random.Random(7)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 8)):
            if added and rng.random() < 0.5:
                parts.append(rng.choice(added))
            parts.append(rng.choice(samples))
        out.append("".join(parts))
    return out


def _anchor(tok):  # noqa: ANN001, ANN202
    a = tok.eos_token
    return a if a and len(tok.encode(a)) == 1 else None


@pytest.mark.parametrize("path", VOCABS, ids=lambda p: p.name.removeprefix("ggml-vocab-"))
def test_pieces_are_the_whole_encoding(path) -> None:  # noqa: ANN001
    tok = _tok(path)
    enc = PromptEncoder(tok, _anchor(tok))
    for text in _texts(tok, _samples(path)):
        want = tok.encode(text)
        assert enc.encode(text) == want, text
        assert enc.encode(text) == want, text  # from the remembered pieces


@pytest.mark.parametrize("name", ["qwen2", "llama-bpe", "llama-spm", "gemma-4", "phi-3"])
def test_common_vocabularies_use_pieces(name: str) -> None:
    tok = _tok(MODELS / f"ggml-vocab-{name}.gguf")
    enc = PromptEncoder(tok, _anchor(tok))
    assert enc.piecewise
    text = "<|im_start|>system\nYou are a helpful assistant." * 3
    enc.encode(text)
    hits = enc.hits
    enc.encode(text)
    assert enc.hits > hits


def test_stripping_added_token_means_whole_encoding() -> None:
    base = _tok(MODELS / "ggml-vocab-qwen2.gguf")
    backend = base.tokenizer.__class__.from_str(base.tokenizer.to_str())
    backend.add_special_tokens([AddedToken("<|strip|>", lstrip=True, rstrip=True)])
    tok = replace(base, tokenizer=backend)
    enc = PromptEncoder(tok, _anchor(tok))
    assert not enc.piecewise
    text = "a  <|strip|>  b<|im_end|> c"
    assert enc.encode(text) == tok.encode(text)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_renders_encode_whole(path) -> None:  # noqa: ANN001
    renderer, _ = corpus_renderer(str(path), str(MODELS), _TOKS)
    for reasoning in (False, True):
        for conv in battery(reasoning):
            try:
                # the text the gateway renders (developer messages as system ones where the
                # template would drop them: tests/test_renderer_roles.py)
                text = renderer.render(conv.messages, TOOLS, add_generation_prompt=True)
            except ValueError:
                continue  # the template refuses this conversation (test_template_fast_path)
            want = renderer.tok.encode(text)
            assert renderer.encoder.encode(text) == want
            assert renderer.render_full(conv.messages, TOOLS) == want
