"""Each engine's way of scoring a sequence again (:class:`Scorer`): vLLM returns
``prompt_logprobs``, SGLang input-token logprobs, and llama-server, which has neither, samples
each sampled token again by force after its prefix (its ``completion_probabilities`` are the
raw distribution, bias not applied), one short call per token on its prompt cache. One scorer
per engine kind (``engines.kinds``); ``tests/test_verify.py`` fails on a kind without one."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Protocol

import httpx

from ..engines.base import RAW_LOGPROBS
from ..engines.kinds import engine_kind
from .sampling import BOUND, Sampling, output_counts, recompute

TOLERANCE = 1e-3  # |Δ logprob| past which a token parts, for an f32 engine (llama-server)
# The same for a bf16 engine (vLLM, SGLang): its sampling (decode) and its recompute (prefill)
# round differently; measured on the test bed's vLLM (docs/verification.md)
BF16_TOLERANCE = 0.5
# alternatives asked per position where the sampler's cut must be recomputed: vLLM refuses
# more than its --max-logprobs (20 unless raised); the scorer then asks for that many
TOP_N = 128


class Scorer(Protocol):
    """An engine that gives, for each ``p``, the logprob of ``ids[p]`` after ``ids[:p]`` as the
    recorded call's ``sampling[i]`` should have given it (NaN: undecided)."""

    name: str
    tolerance: float  # |Δ| past which a token parts: this engine's numerical noise
    # routing: a scorer whose engine re-feeds routed experts sets ``routes`` True; ``verify``
    # sets ``want_routing`` before a score and reads the answer's raw ``routed_experts``
    # field (rows from position 0) from ``last_routing``; ``routing_npy``: vLLM's .npy base64
    # (else SGLang's raw int32). A scorer without these attributes returns no routing.

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]: ...

    def refusal(self, s: Sampling) -> str | None:
        """Why a call sampled so cannot be scored by this engine (None: it can)."""
        ...


class NotSupported(Exception):
    """This engine cannot score a given sequence."""


def _from_top(
    ids: Sequence[int],
    positions: Sequence[int],
    sampling: Sequence[Sampling],
    rows: Sequence[dict[int, float]],
    floors: Sequence[float],
) -> list[float]:
    out = []
    for p, s, known, floor in zip(positions, sampling, rows, floors, strict=True):
        value, half = recompute(known, floor, ids[p], s, output_counts(ids, s, p))
        out.append(value if half <= BOUND else math.nan)
    return out


def _max_logprobs(said: str) -> int | None:
    """vLLM's ``--max-logprobs`` from its refusal of more ("... greater than max allowed:
    20"), or None when the refusal is about something else."""
    m = re.search(r"max allowed: ?(-?[0-9]+)", said)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


class VLLMScorer:
    """vLLM's ``/v1/completions`` with ``prompt_logprobs``: one call per trajectory. Prompt
    logprobs are the model's raw ones (vLLM computes them before any sampler step, whatever
    ``--logprobs-mode``); where the recorded mode includes the sampler's work, the top N of
    each position are asked for too (vLLM refuses N above its ``--max-logprobs``, 20 by
    default: the scorer falls back to it, leaving more tokens undecided) and the processed
    value is computed from them (:func:`recompute`)."""

    name = "vllm"
    tolerance = BF16_TOLERANCE
    routes = True  # with --enable-return-routed-experts: the prompt's rows on the same call
    routing_npy = True

    def __init__(self, client: httpx.AsyncClient, url: str, top_n: int = TOP_N):
        self.client, self.url, self.top_n = client, url.rstrip("/"), top_n
        self.model: str | None = None
        self.want_routing = False
        self.last_routing: object = None

    def refusal(self, s: Sampling) -> str | None:
        return s.refusal()

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]:
        if self.model is None:
            models = (await self.client.get(self.url + "/v1/models")).json()
            self.model = models["data"][0]["id"]
        n = self.top_n if any(s.needs_distribution for s in sampling) else 0
        body = {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": n,
        }
        if self.want_routing:  # every prompt row: [0, prompt + 1 - 1)
            body["routed_experts_prompt_start"] = 0
        self.last_routing = None
        r = await self.client.post(self.url + "/v1/completions", json=body)
        if r.status_code == 400 and n and (most := _max_logprobs(r.text)) is not None:
            self.top_n = n = body["prompt_logprobs"] = most  # its --max-logprobs, from now on
            r = await self.client.post(self.url + "/v1/completions", json=body)
        if r.status_code != 200:
            raise NotSupported(f"vLLM answered {r.status_code}: {r.text[:300]}")
        choice = r.json()["choices"][0]
        per_position = choice["prompt_logprobs"]
        self.last_routing = choice.get("routed_experts") if self.want_routing else None
        rows, floors = [], []
        for p in positions:
            entries = per_position[p]
            rows.append({int(k): float(v["logprob"]) for k, v in entries.items()})
            ranked = [float(v["logprob"]) for v in entries.values() if (v.get("rank") or 0) <= n]
            floors.append(min(ranked) if n and ranked else -math.inf)
        return _from_top(ids, positions, sampling, rows, floors)


class SGLangScorer:
    """SGLang's ``/generate`` with ``return_logprob`` from the first token; the top N input
    logprobs too where the recorded kind needs them (the same :func:`recompute`)."""

    name = "sglang"
    tolerance = BF16_TOLERANCE
    routes = True  # return_routed_experts on the same prefill
    routing_npy = False

    def __init__(self, client: httpx.AsyncClient, url: str, top_n: int = TOP_N):
        self.client, self.url, self.top_n = client, url.rstrip("/"), top_n
        self.want_routing = False
        self.last_routing: object = None

    def refusal(self, s: Sampling) -> str | None:
        return s.refusal()

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]:
        n = self.top_n if any(s.needs_distribution for s in sampling) else 0
        body: dict = {
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        if n:
            body["top_logprobs_num"] = n
        if self.want_routing:  # every prompt row: [0, prompt + 1 - 1)
            body.update(return_routed_experts=True, routed_experts_start_len=0)
        self.last_routing = None
        r = await self.client.post(self.url + "/generate", json=body)
        if r.status_code != 200:
            raise NotSupported(f"SGLang answered {r.status_code}: {r.text[:300]}")
        meta = r.json()["meta_info"]
        self.last_routing = meta.get("routed_experts") if self.want_routing else None
        own = meta["input_token_logprobs"]
        tops = meta.get("input_top_logprobs") or [] if n else []
        rows, floors = [], []
        for p in positions:
            known = {int(ids[p]): float(own[p][0])}
            top = (tops[p] or []) if p < len(tops) else []
            known.update({int(t): float(v) for v, t, *_ in top})
            rows.append(known)
            floors.append(min((float(v) for v, *_ in top), default=-math.inf) if n else -math.inf)
        return _from_top(ids, positions, sampling, rows, floors)


class LlamaCppScorer:
    """llama-server: each token sampled again by force after its prefix (a +100 bias), its
    raw logprob read from ``completion_probabilities``; the prefix stays in the slot's cache,
    so each call evaluates one token. Raw logprobs only (what the llama-cpp adapter records)."""

    name = "llama-cpp"
    tolerance = TOLERANCE

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client, self.url = client, url.rstrip("/")

    def refusal(self, s: Sampling) -> str | None:
        if s.kind != RAW_LOGPROBS:
            return f"llama-server gives raw logprobs only; this call recorded {s.kind}"
        return None

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]:
        out = []
        for p in positions:
            body = {
                "prompt": list(ids[:p]),
                "n_predict": 1,
                "n_probs": 1,
                "logit_bias": [[int(ids[p]), 100.0]],
                "temperature": 1.0,
                "top_k": 0,
                "top_p": 1.0,
                "min_p": 0.0,
                "return_tokens": True,
                "cache_prompt": True,
                "id_slot": 0,
            }
            r = await self.client.post(self.url + "/completion", json=body)
            if r.status_code != 200:
                raise NotSupported(f"llama-server answered {r.status_code}: {r.text[:300]}")
            data = r.json()
            [step] = data["completion_probabilities"][:1]
            if step["id"] != ids[p]:
                raise NotSupported(f"llama-server would not sample token {ids[p]} at {p}")
            out.append(float(step["logprob"]))
        return out


SCORERS: dict[str, Callable[[httpx.AsyncClient, str], Scorer]] = {
    "vllm": VLLMScorer,
    "sglang": SGLangScorer,
    "llama-cpp": LlamaCppScorer,
}


def scorer(kind: str, client: httpx.AsyncClient, url: str, top_n: int | None = None) -> Scorer:
    """The scorer of engine ``kind``; ``top_n``: the alternatives a vLLM/SGLang scorer asks
    for per position (default :data:`TOP_N`)."""
    try:
        made = SCORERS[engine_kind(kind).name](client, url)
    except (KeyError, ValueError):
        raise NotSupported(f"no scorer for engine {kind!r}; one of {sorted(SCORERS)}") from None
    if top_n is not None and isinstance(made, VLLMScorer | SGLangScorer):
        made.top_n = top_n
    return made
