"""Routed experts on the wire: the requests the fakes' routing is held to, and what an answer's
routing says (its rows decoded, and the positions they must cover).

- SGLang 0.5.23: recorded from a real SGLang on this CPU serving the tiny random Qwen3-MoE
  (``turnstile_testbed.moe.tiny_moe``) with ``--enable-return-routed-experts`` (and the test
  bed's CPU shim, ``testbed_sglang.cpu_routing_shim``) by ``record_routed_golden.py sglang``
  into ``golden/sglang-0.5.23-routed.json``.
- vLLM 0.32: its CPU build refuses routing at start (``--enable-return-routed-experts``:
  "AuxOutput Connector requires Model Runner V2"; with ``VLLM_USE_V2_MODEL_RUNNER=1``: "Model
  Runner V2 requires Triton"), so nothing can be recorded; ``record_routed_golden.py vllm``
  writes ``golden/vllm-0.32.0-routed.json`` from the real recorded answers of the same
  requests without routing (``golden/vllm-0.32.0.json``) with ``routed_experts`` filled in by
  vLLM's own ``numpy2base64`` (run in its venv) on rows of the documented shape, where vLLM's
  code puts them (the finished choice; a stream's final chunk). Marked ``synthesized``.

The structure is compared as ``vllm_golden`` compares it; the routing itself by
:func:`routing_facts`: rows, dtype and the ``[start, prompt + completion - 1)`` they cover.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from .vllm_golden import NO_END, PROMPT, Case

GOLDEN = Path(__file__).parent / "golden"
SGLANG = GOLDEN / "sglang-0.5.23-routed.json"
VLLM = GOLDEN / "vllm-0.32.0-routed.json"
LAYERS, TOP_K, EXPERTS = 2, 2, 8  # testbed_moe.MOE_SHAPE
STOP = 33  # forced by logit bias (in both vocabularies)


def sglang_cases() -> list[Case]:
    def generate(name: str, stream: bool = False, sp: dict | None = None, **kw: Any) -> Case:
        body = {
            "rid": f"golden-{name}",
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "logit_bias": NO_END}
            | (sp or {}),
            "return_logprob": True,
            "logprob_start_len": -1,
            "return_routed_experts": True,
            **kw,
            "stream": stream,
        }
        return Case(name, "POST", "/generate", body, stream=stream)

    stop = {"max_new_tokens": 40, "stop_token_ids": [STOP], "logit_bias": {**NO_END, "33": 100}}
    return [
        generate("routed"),
        generate("routed_stream", True),
        generate("routed_start", routed_experts_start_len=2),
        generate("routed_start_at_prompt_end", routed_experts_start_len=len(PROMPT)),
        generate("routed_stop_token", sp=stop),
        generate("routed_not_asked", return_routed_experts=False),
        generate("routed_start_past_prompt", routed_experts_start_len=len(PROMPT) + 1),
    ]


def vllm_cases() -> list[Case]:
    gen = "/inference/v1/generate"

    def sp(**kw: Any) -> dict:
        return {"max_tokens": 4, "temperature": 0.0, "logit_bias": NO_END, **kw}

    def generate(name: str, stream: bool = False, **body: Any) -> Case:
        body = {"request_id": f"golden-{name}", "token_ids": PROMPT, **body, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return Case(name, "POST", gen, body, stream=stream)

    return [
        generate("routed", sampling_params=sp(logprobs=1)),
        generate("routed_stream", True, sampling_params=sp(logprobs=1)),
        generate("routed_start", sampling_params=sp(routed_experts_prompt_start=2)),
        generate("routed_stream_start", True, sampling_params=sp(routed_experts_prompt_start=3)),
        generate("routed_start_past_prompt", sampling_params=sp(routed_experts_prompt_start=5)),
    ]


# the real recorded answer (vllm-0.32.0.json) each synthesized one is made from
VLLM_FROM = {
    "routed": "generate_logprobs",
    "routed_stream": "generate_stream_logprobs",
    "routed_start": "generate_plain",
    "routed_stream_start": "generate_stream_plain",
    "routed_start_past_prompt": "generate_bad_temperature",
}


def _objects(raw: str, stream: bool) -> list[dict]:
    if not stream:
        return [json.loads(raw)] if raw.strip() else []
    out = []
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def routing_facts(engine: str, case: Case, raw: str) -> dict:
    """What one answer says about routing: every place it carries ``routed_experts`` (the
    event's index, non-null or not), the rows decoded from the one that does, the token counts
    they must match (prompt, completion) and the start asked."""
    body = case.body or {}
    objs = _objects(raw, case.stream)
    places: list[tuple[int, bool]] = []
    rows: np.ndarray | None = None
    completion: list[int] = []
    for i, obj in enumerate(objs):
        if engine == "vllm":
            for c in obj.get("choices") or []:
                completion += c.get("token_ids") or []
                if "routed_experts" in c:
                    places.append((i, c["routed_experts"] is not None))
                    if c["routed_experts"] is not None:
                        got = np.load(io.BytesIO(base64.b64decode(c["routed_experts"])))
                        rows = got
        else:
            meta = obj.get("meta_info") or {}
            if obj.get("output_ids") is not None:
                completion = (
                    list(obj["output_ids"])
                    if len(obj["output_ids"]) == meta.get("completion_tokens")
                    else completion + list(obj["output_ids"])
                )
            if "routed_experts" in meta:
                places.append((i, meta["routed_experts"] is not None))
                if meta["routed_experts"] is not None:
                    raw_rows = base64.b64decode(meta["routed_experts"])
                    rows = np.frombuffer(raw_rows, dtype=np.int32).reshape(-1, LAYERS, TOP_K)
    if engine == "vllm":
        start = (body.get("sampling_params") or {}).get("routed_experts_prompt_start", 0)
        prompt = body.get("token_ids") or []
    else:
        start = body.get("routed_experts_start_len", 0)
        prompt = body.get("input_ids") or []
    return {
        "events": len(objs),
        "places": places,
        "rows": rows,
        "prompt": list(prompt),
        "completion": completion,
        "start": start,
    }


def routing_problems(f: dict, experts: int = EXPERTS) -> list[str]:
    """Where an answer's routing breaks the engines' contract (empty: none)."""
    rows = f["rows"]
    if rows is None:
        return []
    out = []
    want = len(f["prompt"]) + len(f["completion"]) - 1 - f["start"]
    if rows.shape != (want, LAYERS, TOP_K):
        out.append(f"rows {rows.shape}, want ({want}, {LAYERS}, {TOP_K})")
    if rows.size and (rows.min() < 0 or rows.max() >= experts):
        out.append(f"expert ids outside [0, {experts})")
    if rows.size and any(len(set(r)) != TOP_K for r in rows.reshape(-1, TOP_K).tolist()):
        out.append("an expert picked twice for one token and layer")
    return out
