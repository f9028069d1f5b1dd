"""A scripted policy in a real vocabulary: the vLLM fake, sampling what a script says.

A coding agent's default run cannot be steered with a grammar or a logit bias (the harness
sends its own requests), and a 135M model does not call tools on its own. So the engine is
scripted: it decodes the prompt it receives with the real tokenizer, asks :class:`Script` what
the policy says next (a tool call in the template's own syntax, or a final answer), and sends
those tokens, encoded with the same tokenizer, as vLLM would send sampled tokens. Everything
else is real: the harness, its requests and tool runs, Turnstile, the template, the tokenizer.
The fake's recorder keeps every prompt it received and every token it sent: the truth a test
compares the records with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from turnstile.chat.loaded_tokenizer import LoadedTokenizer

from .fake_vllm import VLLMFake
from .toy_model import Generation, Step

LOGPROB = -0.125  # every scripted token's logprob (exact in binary: compared with ==)


@dataclass(frozen=True)
class Script:
    """Hermes-style turns (the Qwen2.5 template's syntax): call ``tool`` with ``arguments``
    when the prompt offers that tool and holds no tool result yet; answer ``final`` once it
    does; answer ``plain`` where no tools are offered (a harness's side requests: titles)."""

    tool: str
    arguments: dict
    final: str
    plain: str = '{"title": "Scripted run"}'

    def reply(self, prompt: str) -> str:
        if "<tools>" not in prompt or f'"name": "{self.tool}"' not in prompt:
            return self.plain
        if "<tool_response>" in prompt:
            return self.final
        call = json.dumps({"name": self.tool, "arguments": self.arguments})
        return f"<tool_call>\n{call}\n</tool_call>"


class ScriptedModel:
    """What :class:`~turnstile.testing.toy_model.ToyModel` is to the vLLM fake, with a
    script's text in a real tokenizer's IDs, ended by the template's end-of-turn token."""

    def __init__(self, tok: LoadedTokenizer, reply: Callable[[str], str], end_id: int):
        self.tok, self.reply, self.end_id = tok, reply, end_id
        self.exchanges: list[tuple[list[int], list[int]]] = []  # (prompt, sampled), in order

    def generate(
        self, prompt: list[int], *, max_tokens: int, k: int = 0, **_: object
    ) -> Generation:
        ids = [*self.tok.encode(self.reply(self.tok.decode(prompt))), self.end_id]
        steps = [
            Step(t, LOGPROB, 1, [(t, LOGPROB)] + [((t + j) % 1000, -9.0 - j) for j in range(1, k)])
            for t in ids[:max_tokens]
        ]
        self.exchanges.append((list(prompt), [s.token_id for s in steps]))
        if len(ids) > max_tokens:
            return Generation(steps, "length")
        return Generation(steps, "stop", stop_token=self.end_id)


def scripted_vllm(tok: LoadedTokenizer, reply: Callable[[str], str], end: str) -> VLLMFake:
    """A vLLM fake (its default version, token-in route served) whose model is ``reply``, with
    a context long enough for a coding agent's prompts."""
    fake = VLLMFake(max_model_len=131072)
    [end_id] = tok.encode(end)
    fake.model = ScriptedModel(tok, reply, end_id)  # type: ignore[assignment]
    return fake


class FixedReply:
    """A reply spec as the fake's model: the same token IDs and logprobs on every call (what
    the benchmarks' workload needs: a known reply of a known length in a real vocabulary).
    The last ID ends the turn like the model's own end token (``stop_reason`` null)."""

    def __init__(self, token_ids: list[int], logprobs: list[float]):
        if len(token_ids) != len(logprobs) or not token_ids:
            raise ValueError("a reply needs one logprob per token id, and at least one")
        self.ids, self.lps = list(token_ids), list(logprobs)

    @classmethod
    def from_spec(cls, spec: dict) -> FixedReply:
        return cls(spec["token_ids"], spec["logprobs"])

    def generate(
        self, prompt: list[int], *, max_tokens: int | None = None, **_: object
    ) -> Generation:
        """The reply (its ``k`` alternatives: the sampled token alone), cut at ``max_tokens``."""
        n = len(self.ids) if max_tokens is None else min(max_tokens, len(self.ids))
        steps = [
            Step(t, lp, 1, [(t, lp)]) for t, lp in zip(self.ids[:n], self.lps[:n], strict=True)
        ]
        return Generation(steps, "stop" if n == len(self.ids) else "length")


@contextmanager
def first_token_delay(fake: VLLMFake, seconds: float) -> Iterator[None]:
    """Silence before each request's first token, as a long prefill keeps an engine silent
    (``token_delay`` would slow every token): to see a harness's idle timer wait it out."""
    paced: set[str] = set()
    plain = fake.pace

    async def pace(rid: str) -> bool:
        if rid not in paced:
            paced.add(rid)
            await asyncio.sleep(seconds)
        return await plain(rid)

    fake.pace = pace  # type: ignore[method-assign]
    try:
        yield
    finally:
        del fake.pace
