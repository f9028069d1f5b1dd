"""The tokenizer loader, checked against llama.cpp's own tokenizer test vectors.

Each ``ggml-vocab-*.gguf`` in llama.cpp's ``models/`` directory has ``.inp``/``.out`` files: texts
and the ids the model's reference tokenizer gives them, without BOS/EOS (llama.cpp's
``tests/test-tokenizer-0.cpp`` tokenizes with ``add_special=false``). A loader that gets any of
them wrong would make Turnstile record ids the engine never saw, so every vector must match
exactly; the few vocabularies that cannot are listed in ``KNOWN_EXCEPTIONS`` with the reason.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from gguf import GGUFEndian, GGUFWriter, TokenType

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import LoadedTokenizer, load_tokenizer

pytestmark = pytest.mark.unit

SEPARATOR = "\n__ggml_vocab_test__\n"

# Vocabularies whose vectors are expected to fail, and why. xfail(strict=True): when one starts
# passing, the test fails so that this list gets shortened.
KNOWN_EXCEPTIONS: dict[str, str] = {
    "ggml-vocab-bert-bge.gguf": (
        "WordPiece (tokenizer.ggml.model='bert'): transformers' GGUF mapping has no builder for "
        "it, and it is an embedding-model vocabulary Turnstile never serves"
    ),
}

MODELS_DIR = testbed.models_dir()
VOCABS_WITH_VECTORS = sorted(
    p.name
    for p in MODELS_DIR.glob("ggml-vocab-*.gguf")
    if (MODELS_DIR / f"{p.name}.inp").is_file() and (MODELS_DIR / f"{p.name}.out").is_file()
)

LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)


@functools.cache
def _gguf(name: str) -> LoadedTokenizer:
    """Each vocabulary is loaded once per session (a 256k vocabulary takes ~2 s)."""
    return load_tokenizer(str(MODELS_DIR / name))


def read_vectors(gguf_path: Path) -> list[tuple[str, list[int]]]:
    """``(text, ids)`` pairs, split exactly as test-tokenizer-0.cpp splits them.

    Texts are separated by ``SEPARATOR`` (so the newline before and after the marker is not part
    of either text); a separator at the very end does not start another, empty, text. ``.out``
    has one line of space-separated ids per text.
    """
    raw = (gguf_path.parent / f"{gguf_path.name}.inp").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        texts.pop()
    lines = (gguf_path.parent / f"{gguf_path.name}.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{gguf_path.name}: {len(texts)} texts, {len(lines)} ids"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]


def _vocab_params() -> list:
    return [
        pytest.param(
            name,
            id=name,
            marks=[pytest.mark.xfail(reason=KNOWN_EXCEPTIONS[name], strict=True)]
            if name in KNOWN_EXCEPTIONS
            else [],
        )
        for name in VOCABS_WITH_VECTORS
    ]


def test_vectors_are_found() -> None:
    assert len(VOCABS_WITH_VECTORS) >= 10, f"too few vocabularies in {MODELS_DIR}"
    assert set(KNOWN_EXCEPTIONS) <= set(VOCABS_WITH_VECTORS), "stale KNOWN_EXCEPTIONS entry"


@pytest.mark.parametrize("vocab", _vocab_params())
def test_gguf_vocab_matches_llama_cpp_vectors(vocab: str) -> None:
    tok = _gguf(vocab)
    vectors = read_vectors(MODELS_DIR / vocab)
    assert vectors
    mismatches = [(text, want, got) for text, want in vectors if (got := tok.encode(text)) != want]
    report = "\n".join(f"  {text!r}: want {want}, got {got}" for text, want, got in mismatches)
    assert not mismatches, f"{len(mismatches)}/{len(vectors)} vectors differ:\n{report}"


def test_special_tokens_are_parsed_and_end_generation() -> None:
    tok = _gguf("ggml-vocab-qwen2.gguf")
    ids = tok.encode("<|im_start|>user\nHello<|im_end|>\n")
    assert ids[0] == tok.tokenizer.token_to_id("<|im_start|>") == 151644
    assert 151645 in ids
    assert {151643, 151645} <= tok.eog_token_ids  # <|endoftext|> (eos) and <|im_end|>
    assert tok.decode(ids) == "<|im_start|>user\nHello<|im_end|>\n"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHello\n"
    assert tok.token_text(9707) == "Hello"
    assert tok.token_text(10**9) is None
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.add_bos is False
    assert len(tok.fingerprint) == 16 and int(tok.fingerprint, 16) >= 0


def test_added_tokens_are_the_files_own() -> None:
    # DeepSeek's control tokens are stored as raw text, outside the byte-level alphabet.
    deepseek = _gguf("ggml-vocab-deepseek-coder.gguf")
    assert deepseek.bos_token is not None and deepseek.bos_token_id is not None
    assert deepseek.encode(deepseek.bos_token + "x") == [deepseek.bos_token_id, 87]
    assert deepseek.decode([deepseek.bos_token_id]) == deepseek.bos_token
    assert deepseek.add_bos is True
    assert deepseek.tokenizer.encode("x").ids == [deepseek.bos_token_id, 87]
    # No token invented past the end of the vocabulary (GPT-2's default <|endoftext|>).
    llama3 = _gguf("ggml-vocab-llama-bpe.gguf")
    assert llama3.tokenizer.get_vocab_size(with_added_tokens=True) == 128256
    assert {128001, 128009} <= llama3.eog_token_ids  # <|end_of_text|>, <|eot_id|>
    assert llama3.add_bos is True  # no flag in the file; Llama 3 adds <|begin_of_text|>
    # MPT's whitespace tokens are user-defined: matched whole, decoded as spaces.
    mpt = _gguf("ggml-vocab-mpt.gguf")
    assert mpt.encode("  x") == [50276, 89]
    assert mpt.decode([50276, 89]) == "  x"


def test_sentencepiece_bos_and_prefix() -> None:
    tok = _gguf("ggml-vocab-llama-spm.gguf")
    assert (tok.bos_token, tok.bos_token_id) == ("<s>", 1)
    assert (tok.eos_token, tok.eos_token_id) == ("</s>", 2)
    assert tok.add_bos is True
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    # Like sentencepiece and llama.cpp: a space prefix after a special token too.
    assert tok.encode("<s>[INST] Hi [/INST]")[:4] == [1, 518, 25580, 29962]
    assert tok.decode(tok.encode(" Hello world")) == " Hello world"


def _save_as_hf_dir(tok: LoadedTokenizer, directory: Path, template: str) -> None:
    from transformers import PreTrainedTokenizerFast

    copy = tokenizers.Tokenizer.from_str(tok.tokenizer.to_str())
    hf = PreTrainedTokenizerFast(
        tokenizer_object=copy,
        chat_template=template,
        add_bos_token=tok.add_bos,
        **tok.special_tokens,
    )
    hf.save_pretrained(str(directory))


@pytest.mark.parametrize("vocab", ["ggml-vocab-qwen2.gguf", "ggml-vocab-llama-spm.gguf"])
def test_hf_directory_matches_gguf(vocab: str, tmp_path: Path) -> None:
    gguf_tok = _gguf(vocab)
    template = gguf_tok.chat_template or LLAMA2_TEMPLATE
    _save_as_hf_dir(gguf_tok, tmp_path, template)

    hf_tok = load_tokenizer(str(tmp_path))

    assert hf_tok.source == str(tmp_path)
    assert hf_tok.chat_template == template
    texts = [text for text, _ in read_vectors(MODELS_DIR / vocab)]
    texts.append(f"{gguf_tok.bos_token or ''}[INST] Hi [/INST] ok{gguf_tok.eos_token}")
    texts.append("<|im_start|>system\nx<|im_end|>\n<|im_start|>assistant\n")
    for text in texts:
        assert hf_tok.encode(text) == gguf_tok.encode(text), text
    assert hf_tok.special_tokens == gguf_tok.special_tokens
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id) == (
        gguf_tok.bos_token_id,
        gguf_tok.eos_token_id,
    )
    assert hf_tok.add_bos == gguf_tok.add_bos
    assert hf_tok.eog_token_ids == gguf_tok.eog_token_ids
    if gguf_tok.chat_template != template:
        gguf_tok = load_tokenizer(str(MODELS_DIR / vocab), chat_template=template)
    assert hf_tok.fingerprint == gguf_tok.fingerprint


def test_hf_directory_generation_config_adds_stop_ids(tmp_path: Path) -> None:
    tok = _gguf("ggml-vocab-phi-3.gguf")
    _save_as_hf_dir(tok, tmp_path, "{{ messages }}")
    assert load_tokenizer(str(tmp_path)).eog_token_ids == {32000, 32007}  # eos, <|end|>
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [32000, 32001]}))
    assert load_tokenizer(str(tmp_path)).eog_token_ids == {32000, 32001, 32007}


def test_hub_cache_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    revision = "0123456789abcdef0123456789abcdef01234567"

    def cached_repo(repo_id: str) -> Path:
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(revision)
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        return snapshot

    gguf_tok = _gguf("ggml-vocab-phi-3.gguf")
    _save_as_hf_dir(gguf_tok, cached_repo("acme/tiny-chat"), gguf_tok.chat_template or "")
    shutil.copy(MODELS_DIR / "ggml-vocab-phi-3.gguf", cached_repo("acme/tiny-GGUF") / "m.gguf")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    text = "<|user|>\nHello, world! 1234<|end|>\n<|assistant|>\n"
    for repo_id in ("acme/tiny-chat", "acme/tiny-GGUF"):
        tok = load_tokenizer(repo_id)
        assert tok.source == repo_id
        assert tok.encode(text) == gguf_tok.encode(text)
        assert tok.chat_template == gguf_tok.chat_template
    with pytest.raises(ValueError, match="acme/not-cached"):
        load_tokenizer("acme/not-cached")


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["le", "be"])
def test_full_model_gguf(endianess: GGUFEndian, tmp_path: Path) -> None:
    """A file with tensors (the table is skipped) written by gguf's own writer."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    words = ["he", "ll", "hell", "hello"]
    tokens = alphabet + words + ["<|im_start|>", "<|im_end|>", "<think>"]
    kinds = [TokenType.NORMAL] * (len(alphabet) + len(words))
    kinds += [TokenType.CONTROL, TokenType.CONTROL, TokenType.USER_DEFINED]
    path = tmp_path / "model.gguf"
    writer = GGUFWriter(str(path), "qwen2", endianess=endianess)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([int(k) for k in kinds])
    writer.add_token_merges(["h e", "l l", "he ll", "hell o"])
    writer.add_eos_token_id(len(tokens) - 2)
    writer.add_chat_template("{{ messages }}")
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tok = load_tokenizer(str(path))

    hello, im_start, im_end, think = (tokens.index(t) for t in ("hello", *tokens[-3:]))
    assert tok.encode("<|im_start|>hello<think><|im_end|>") == [im_start, hello, think, im_end]
    assert tok.eog_token_ids == {im_end}
    assert (tok.eos_token, tok.bos_token, tok.add_bos) == ("<|im_end|>", None, False)
    assert tok.chat_template == "{{ messages }}"


def test_chat_template_override(tmp_path: Path) -> None:
    model = str(MODELS_DIR / "ggml-vocab-phi-3.gguf")
    path = testbed.templates_dir() / "microsoft-Phi-3.5-mini-instruct.jinja"
    base = _gguf("ggml-vocab-phi-3.gguf")
    from_file = load_tokenizer(model, chat_template=str(path))
    assert from_file.chat_template == path.read_text(encoding="utf-8")
    source = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    from_source = load_tokenizer(model, chat_template=source)
    assert from_source.chat_template == source
    assert len({base.fingerprint, from_file.fingerprint, from_source.fingerprint}) == 3
    assert from_source.encode("<|user|>\nHi<|end|>") == base.encode("<|user|>\nHi<|end|>")
    with pytest.raises(ValueError, match="neither an existing file nor Jinja"):
        load_tokenizer(model, chat_template=str(tmp_path / "no.jinja"))


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.gguf.*no file or directory"):
        load_tokenizer(str(tmp_path / "nope.gguf"))
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_tokenizer(str(not_gguf))
    with pytest.raises(ValueError, match="no .gguf file"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'bert'"):
        load_tokenizer(str(MODELS_DIR / "ggml-vocab-bert-bge.gguf"))
