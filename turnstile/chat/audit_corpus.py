"""Auditing a corpus of templates without their models: stand-in tokenizers, the corpus table.

Used by ``audit-template`` (a template given without its model, ``--corpus`` for
docs/templates.md) and the conformance tests; the server's startup audit does not use it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from tokenizers import AddedToken

from .audit import audit
from .audit_battery import TOOLS, USER1, USER2, assistant, battery_kinds, tool_call
from .render import Renderer
from .template import ChatTemplate, TemplateError
from .tokenizer import LoadedTokenizer, load_tokenizer

# Stand-in tokenizers for templates without a matching vocabulary in the corpus.

_MARKER = re.compile(
    r"<\|[^|<>\s'\"{}]{1,40}\|>"  # <|im_start|>
    r"|<\uff5c[^\uff5c]{1,40}\uff5c>"  # <｜tool▁calls▁begin｜>
    r"|\[/?[A-Z][A-Z_]{2,30}\]"  # [INST], [TOOL_CALLS]
    r"|<\|?[a-z_]{2,30}\|>|<\|[a-z_]{2,30}>"  # <turn|>, <|turn>
    r"|<(?:start|end)_of_[a-z_]+>"  # <start_of_turn>
    r"|<[A-Z_]{3,30}>"  # <SPECIAL_12>-like
)


def template_markers(source: str) -> list[str]:
    """Special-looking markers a template writes, in order of first appearance."""
    seen: dict[str, None] = {}
    for m in _MARKER.finditer(source):
        seen.setdefault(m.group(0))
    return list(seen)


def stand_in(base: LoadedTokenizer, source: str) -> tuple[LoadedTokenizer, list[str]]:
    """``base`` with the template's markers that it lacks added as special tokens, and an
    end-of-turn set read off a render (the first marker after an assistant turn's text)."""
    markers = template_markers(source)
    added = [m for m in markers if len(base.encode(m)) != 1]
    tok = base.tokenizer.__class__.from_str(base.tokenizer.to_str())
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in added])
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    for t in special.values():
        if len(base.encode(t)) != 1:
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False)])
    loaded = replace(
        base,
        tokenizer=tok,
        chat_template=source,
        special_tokens=special,
        bos_token="<s>",
        eos_token="</s>",
        source=f"stand-in({base.source.rsplit('/', 1)[-1]})",
    )
    eog = set(base.eog_token_ids) | {tok.token_to_id("</s>")}
    for close in _derive_turn_close(ChatTemplate(source, special), markers):
        if tok.token_to_id(close) is None:
            tok.add_special_tokens([AddedToken(close, special=True, normalized=False)])
            added.append(close)
        eog.add(tok.token_to_id(close))
    return replace(loaded, eog_token_ids=frozenset(i for i in eog if i is not None)), added


def _derive_turn_close(template: ChatTemplate, markers: list[str]) -> list[str]:
    """The marker that closes an assistant turn; for templates without one (GLM), the
    markers that open the next message, which such models sample as their stop token."""
    probe = "XQZPROBE"
    call = assistant("", [tool_call("call00001", "get_weather", '{"city": "XQZPROBE"}')])
    tool = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18"}
    probes = [  # (conversation, may the close be a bare string rather than a marker?)
        ([USER1, assistant(probe)], True),
        ([USER1, call], False),
        ([USER1, assistant(probe), USER2], False),
        ([USER1, call, tool], False),
    ]
    found: list[str] = []
    for i, (conv, bare) in enumerate(probes):
        try:
            full = template.render(conv, TOOLS, add_generation_prompt=False)
        except TemplateError:
            continue
        at = full.rfind(probe)
        if at < 0:
            continue
        tail = full[at + len(probe) :]
        hits = sorted((tail.find(m), m) for m in markers if m in tail)
        if not hits and bare and tail.strip() and len(tail.strip()) <= 24:
            hits = [(0, tail.strip())]  # a close in no marker syntax we know: "[e~[", ...
        if hits and hits[0][1] not in found:
            found.append(hits[0][1])
        if found and i == 1:
            return found  # turns have their own close (plain and tool-call turns)
    return found


# Which corpus vocabulary matches which corpus template (by model family); others get a
# stand-in built on the Qwen2 vocabulary.
MATCHING_VOCAB = {
    "Qwen-Qwen2.5-7B-Instruct": "qwen2",
    "Qwen-QwQ-32B": "qwen2",
    "Qwen-Qwen3-0.6B": "qwen2",
    "Qwen3-Coder": "qwen2",
    "Qwen3.5-4B": "qwen35",
    "meta-llama-Llama-3.1-8B-Instruct": "llama-bpe",
    "meta-llama-Llama-3.2-3B-Instruct": "llama-bpe",
    "meta-llama-Llama-3.3-70B-Instruct": "llama-bpe",
    "CohereForAI-c4ai-command-r-plus-tool_use": "command-r",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r",
    "google-gemma-4-31B-it": "gemma-4",
    "google-gemma-4-31B-it-interleaved": "gemma-4",
    "microsoft-Phi-3.5-mini-instruct": "phi-3",
}


def corpus_renderer(
    template_path: str, models_dir: str, cache: dict[str, LoadedTokenizer] | None = None
) -> tuple[Renderer, list[str]]:
    """A renderer for a corpus template: its matching tokenizer, or a stand-in."""
    path = Path(template_path)
    source = path.read_text()
    vocab = MATCHING_VOCAB.get(path.stem)
    cache = cache if cache is not None else {}
    key = vocab or "qwen2"
    if key not in cache:
        cache[key] = load_tokenizer(str(Path(models_dir) / f"ggml-vocab-{key}.gguf"))
    base = cache[key]
    if vocab is not None:
        tok = replace(base, chat_template=source)
        added: list[str] = []
    else:
        tok, added = stand_in(base, source)
    return Renderer(tok, ChatTemplate(source, tok.special_tokens)), added


def corpus_table(templates_dir: str, models_dir: str) -> str:
    """Markdown table of the audit over every template in a corpus directory: per append
    kind, the worst step without/with reasoning (plain/think)."""

    from .patches import apply_patches

    cache: dict[str, LoadedTokenizer] = {}
    kinds = battery_kinds()
    rows = [
        "| template | tokenizer | patches | "
        + " | ".join(kinds)
        + " | one-by-one tool results | gateway policy |",
        "|" + "---|" * (len(kinds) + 5),
    ]
    for path in sorted(Path(templates_dir).glob("*.jinja")):
        renderer, added = corpus_renderer(str(path), models_dir, cache)
        source, applied = apply_patches(renderer.template.source)
        if applied:
            renderer = Renderer(renderer.tok, ChatTemplate(source, renderer.tok.special_tokens))
        report = audit(renderer, path.stem, added)
        summary = report.summary()
        policy = report.policy()
        segs = [f"{k}/{v}" for k in kinds for v in ("plain", "think") if not policy.allows(k, v)]
        # the tokenizer's file name, not the machine path it was loaded from
        tok = Path(report.tokenizer.removeprefix("stand-in(").rstrip(")")).name
        tok = (f"stand-in({tok})" if report.tokenizer.startswith("stand-in(") else tok) + (
            f" + {', '.join(added)}" if added else ""
        )
        rows.append(
            f"| {path.stem} | {tok.replace('|', '&#124;')} | {', '.join(applied)} | "
            + " | ".join(summary.get(k, "-") for k in kinds)
            + f" | {report.tool_incremental} | "
            + ("new segment on " + ", ".join(segs) if segs else "extend")
            + " |"
        )
    return "\n".join(rows)
