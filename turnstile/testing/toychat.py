"""A toy chat model for the fakes' ``/v1/chat/completions`` routes: the engine renders the
prompt itself, as vLLM and SGLang do in passthrough mode.

- A deterministic tokenizer with merges, so one text has several tokenizations: characters are
  ``1000 + ord(c)``, a few pieces (``"ab"``, ``"reply"``, role names) have ids of their own, and
  ``encode`` is greedy longest-match (the canonical tokenization).
- A ChatML-like template: ``<|im_start|>`` role ``\\n`` content ``<|im_end|>`` ``\\n`` per
  message, then ``<|im_start|>assistant\\n``. ``<|im_end|>`` is the model's stop token.
- Scripted replies: turn ``t`` (the number of user messages) answers ``"reply t: ab ab"``.
  For a turn in ``ChatScript.split_turns`` the model *samples* the first ``"ab"`` as ``"a"`` +
  ``"b"``: same text, non-canonical ids. The next prompt re-tokenizes that reply canonically,
  so it no longer extends the sampled ids: retokenization drift, on demand, at a known index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IM_START = 1
IM_END = 2  # the stop token
SPECIAL = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
PIECES = {"ab": 300, "reply": 301, "user": 302, "assistant": 303, "system": 304, "tool": 305}
TEXT = {v: k for k, v in PIECES.items()}
LONGEST = max(len(p) for p in PIECES)


def char_id(c: str) -> int:
    return 1000 + ord(c)


def encode(text: str) -> list[int]:
    """The canonical tokenization: longest piece first, else one character."""
    out, i = [], 0
    while i < len(text):
        for n in range(min(LONGEST, len(text) - i), 1, -1):
            tid = PIECES.get(text[i : i + n])
            if tid is not None:
                out.append(tid)
                i += n
                break
        else:
            out.append(char_id(text[i]))
            i += 1
    return out


def piece(tid: int) -> str:
    if tid in SPECIAL:
        return SPECIAL[tid]
    if tid in TEXT:
        return TEXT[tid]
    return chr(tid - 1000)


def decode(ids: list[int], skip_special: bool = True) -> str:
    return "".join("" if skip_special and t in SPECIAL else piece(t) for t in ids)


def message_text(m: dict) -> str:
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def render(messages: list[dict]) -> list[int]:
    """The prompt the engine builds from the messages (with the generation prompt)."""
    out: list[int] = []
    for m in messages:
        out += [IM_START, *encode(f"{m['role']}\n{message_text(m)}"), IM_END, *encode("\n")]
    return out + [IM_START, *encode("assistant\n")]


def logprob(tid: int, position: int) -> float:
    """A deterministic logprob for a sampled token."""
    return -round(((tid * 31 + position * 7) % 97) / 10 + 0.05, 4)


@dataclass
class Reply:
    ids: list[int]  # sampled, the stop token included when it was sampled
    finish_reason: str  # "stop" | "length"

    @property
    def text(self) -> str:
        return decode(self.ids)


@dataclass
class ChatScript:
    """What the toy model answers. ``split_turns``: turns whose first "ab" is sampled as two
    tokens (the drift of the *next* prompt starts there)."""

    split_turns: set[int] = field(default_factory=set)

    @staticmethod
    def turn(messages: list[dict]) -> int:
        return sum(1 for m in messages if m.get("role") == "user")

    def text(self, messages: list[dict], choice: int = 0) -> str:
        t = self.turn(messages)
        return f"reply {t}: ab ab" if choice == 0 else f"reply {t}.{choice}: ab ab"

    def reply(self, messages: list[dict], max_tokens: int, choice: int = 0) -> Reply:
        text = self.text(messages, choice)
        ids = encode(text)
        if self.turn(messages) in self.split_turns:
            at = ids.index(PIECES["ab"])
            ids[at : at + 1] = [char_id("a"), char_id("b")]
        ids.append(IM_END)
        if len(ids) > max_tokens:
            return Reply(ids[:max_tokens], "length")
        return Reply(ids, "stop")

    def split_index(self, messages: list[dict]) -> int:
        """Where, in this turn's sampled ids, the non-canonical "a" + "b" starts."""
        return encode(self.text(messages)).index(PIECES["ab"])
