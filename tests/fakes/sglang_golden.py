"""The requests the SGLang fake is checked with against a real SGLang 0.5.23, recorded by
``record_sglang_golden.py`` into ``golden/sglang-0.5.23.json`` and compared, in structure only,
by ``tests/test_sglang_golden.py`` (the fake) and ``tests/test_sglang_real.py`` (a live
server). The structure and its comparison are ``vllm_golden``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .vllm_golden import PROMPT, Case

GOLDEN = Path(__file__).parent / "golden" / "sglang-0.5.23.json"
CONTEXT = 2048  # the server's --context-length (the fake's context_len)
NEAR_FULL = PROMPT * 510
TOO_LONG = PROMPT * 513
NO_END = {"0": -100.0, "2": -100.0, "95": -100.0}


def cases(model: str) -> list[Case]:
    """Every shape of the SGLang fake's token-in side and metadata, in the order they run."""

    def generate(name: str, stream: bool = False, sp: dict | None = None, **kw: Any) -> Case:
        body = {
            "rid": f"golden-{name}",
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "logit_bias": NO_END}
            | (sp or {}),
            "return_logprob": True,
            "logprob_start_len": -1,
            **kw,
            "stream": stream,
        }
        return Case(name, "POST", "/generate", body, stream=stream)

    return [
        Case("models", "GET", "/v1/models"),
        Case("health", "GET", "/health"),
        Case("model_info", "GET", "/model_info", only=("weight_version", "model_path")),
        Case(
            "server_info",
            "GET",
            "/server_info",
            only=("version", "incremental_streaming_output", "context_length"),
        ),
        generate("generate_logprobs"),
        generate("generate_top_logprobs", top_logprobs_num=2),
        generate("generate_no_logprobs", return_logprob=False),
        generate("generate_stream", True),
        generate("generate_stream_top_logprobs", True, top_logprobs_num=2),
        generate(  # token 33 forced: both vocabularies have it
            "generate_stop_token",
            sp={
                "max_new_tokens": 40,
                "stop_token_ids": [33],
                "logit_bias": {**NO_END, "33": 100.0},
            },
        ),
        generate("generate_unknown_sampling_key", sp={"bogus": 1}),
        generate("generate_bad_temperature", sp={"temperature": -1.0}),
        generate("generate_stream_bad_temperature", True, sp={"temperature": -1.0}),
        generate("generate_no_input", input_ids=[]),
        generate("generate_to_the_context_end", input_ids=NEAR_FULL, sp={"max_new_tokens": 20}),
        generate("generate_prompt_past_the_context", input_ids=TOO_LONG),
        Case("abort_request", "POST", "/abort_request", {"rid": "x"}),
        Case("detokenize", "POST", "/v1/detokenize", {"model": model, "tokens": PROMPT}),
    ]
