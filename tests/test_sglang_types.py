"""The SGLang adapter's requests and the SGLang fake's answers against the ``sglang`` package's
own types (the pinned 0.5.23, ``turnstile_testbed.sglang``): every field the adapter sends is
a ``GenerateReqInput`` field, every sampling key a ``SamplingParams`` field; every
``meta_info`` key the fake writes is one SGLang's tokenizer manager writes; each finish
reason has the keys its ``to_json`` gives. The classes are read from the package's source
(importing them needs torch and the scheduler), so a renamed or removed field fails here.
"""

from __future__ import annotations

import ast
import asyncio
import json
from functools import cache
from pathlib import Path

import httpx
import pytest

from turnstile.engines import SamplingParams, SGLangEngine
from turnstile.testing.fake_sglang import SAMPLING_FIELDS, SGLangFake
from turnstile_testbed.sglang import sglang_package

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@cache
def _tree(relative: str) -> ast.Module:
    path: Path = sglang_package() / relative
    return ast.parse(path.read_text(), str(path))


def _class(relative: str, name: str) -> ast.ClassDef:
    for node in ast.walk(_tree(relative)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"sglang/{relative} has no class {name}")


def _fields(relative: str, name: str) -> set[str]:
    """A dataclass's / msgspec Struct's annotated fields."""
    body = _class(relative, name).body
    return {
        n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def _is_meta(node: ast.expr) -> bool:
    """``meta_info``, ``x.meta_info`` or ``x["meta_info"]``."""
    return (
        (isinstance(node, ast.Name) and node.id == "meta_info")
        or (isinstance(node, ast.Attribute) and node.attr == "meta_info")
        or (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == "meta_info"
        )
    )


def _meta_info_keys() -> set[str]:
    """Every key SGLang's output path puts in ``meta_info``: dict literals assigned to it,
    ``meta_info["k"] = ...``, ``meta_info.update({...})`` / ``update(k=...)``."""
    keys: set[str] = set()
    for rel in (
        "srt/managers/tokenizer_manager.py",
        "srt/utils/weight_versions.py",
        "srt/observability/req_time_stats.py",
    ):
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if _is_meta(t) and isinstance(node.value, ast.Dict):
                        keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                    if isinstance(t, ast.Subscript) and _is_meta(t.value):
                        if isinstance(t.slice, ast.Constant):
                            keys.add(t.slice.value)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
                and _is_meta(node.func.value)
            ):
                for arg in node.args:
                    if isinstance(arg, ast.Dict):
                        keys |= {k.value for k in arg.keys if isinstance(k, ast.Constant)}
                keys |= {kw.arg for kw in node.keywords if kw.arg}
    return keys


def _finish_reason_keys() -> dict[str, set[str]]:
    """``type`` → the keys of each finish reason's ``to_json`` (schedule_batch.py)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(_tree("srt/managers/schedule_batch.py")):
        if isinstance(node, ast.FunctionDef) and node.name == "to_json":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    d = ret.value
                    keys = {k.value for k in d.keys if isinstance(k, ast.Constant)}
                    kind = next(
                        v.value
                        for k, v in zip(d.keys, d.values, strict=True)
                        if isinstance(k, ast.Constant) and k.value == "type"
                    )
                    out.setdefault(kind, set()).update(keys)
    return out


def test_the_package_is_the_pinned_one():
    assert (sglang_package().parent / "sglang-0.5.23.dist-info").is_dir()


def test_the_adapters_request_fields_are_generate_req_input_fields():
    fields = _fields("srt/managers/io_struct.py", "GenerateReqInput")
    sampling = _fields("srt/sampling/sampling_params.py", "SamplingParams")
    assert {"input_ids", "sampling_params", "rid", "return_logprob"} <= fields  # the reading works
    engine = SGLangEngine("http://127.0.0.1:1")
    params = SamplingParams(
        max_tokens=8, temperature=0.7, top_p=0.9, top_k=5, seed=3, stop=["x"],
        stop_token_ids=[2], logit_bias={5: -1.0}, top_logprobs=2, grammar='root ::= "a"',
    )  # fmt: skip
    for stream in (False, True):
        body = engine.request_body([1, 2, 3], params, stream, "rid-1")
        assert set(body) <= fields, set(body) - fields
        assert set(body["sampling_params"]) <= sampling, set(body["sampling_params"]) - sampling
    schema = engine.request_body(
        [1], SamplingParams(max_tokens=4, json_schema={"type": "object"}), False, "r"
    )
    assert set(schema["sampling_params"]) <= sampling


DERIVED = {  # SamplingParams fields normalize() sets, not a request's
    "stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
    "is_normalized", "ebnf_full_assistant",
}  # fmt: skip


# What a real SGLang 0.5.23 (its CPU build, torch_native attention, SmolLM2; see the README)
# answered to sampling_params {"max_new_tokens": 2, "bogus": 1}: 400 and this body. The list
# is its request contract (in the package's Rust extension, not readable as source); it has
# `choice`, which SamplingParams has not (a request using it is SGLang's 500).
LIVE_CONTRACT_ERROR = {
    "error": "unknown field `bogus`, expected one of `max_new_tokens`, `stop`, "
    "`stop_token_ids`, `stop_regex`, `temperature`, `top_p`, `top_k`, `min_p`, "
    "`frequency_penalty`, `presence_penalty`, `repetition_penalty`, `min_new_tokens`, `n`, "
    "`json_schema`, `regex`, `ebnf`, `structural_tag`, `ignore_eos`, `skip_special_tokens`, "
    "`spaces_between_special_tokens`, `no_stop_trim`, `stream_interval`, `logit_bias`, "
    "`sampling_seed`, `custom_params`, `beam_width`, `watermark`, `choice`"
}


def test_the_fakes_sampling_contract_is_sglangs():
    """The fake refuses a sampling key SGLang does not know as SGLang does (its answer
    recorded from a live server), and its list is SamplingParams' fields plus `choice`."""
    sampling = _fields("srt/sampling/sampling_params.py", "SamplingParams")
    assert set(SAMPLING_FIELDS) == (sampling - DERIVED) | {"choice"}
    assert "choice" not in sampling
    with SGLangFake() as fake:
        body = {"input_ids": [5], "sampling_params": {"max_new_tokens": 2, "bogus": 1}}
        r = httpx.post(fake.url + "/generate", json=body, timeout=30)
    assert (r.status_code, r.json()) == (400, LIVE_CONTRACT_ERROR)


async def _answers(fake: SGLangFake) -> list[dict]:
    async with httpx.AsyncClient(timeout=30) as http:
        base = {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -1}
        out = []
        for extra in (
            {"sampling_params": {"max_new_tokens": 3}},
            {"sampling_params": {"max_new_tokens": 3}, "top_logprobs_num": 2},
            {"sampling_params": {"max_new_tokens": 40, "stop_token_ids": [9]}},
        ):
            r = await http.post(fake.url + "/generate", json={**base, **extra})
            out.append(r.json())
            async with http.stream(
                "POST", fake.url + "/generate", json={**base, **extra, "stream": True}
            ) as s:
                async for line in s.aiter_lines():
                    if line.startswith("data: {"):
                        out.append(json.loads(line[6:]))
        return out


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_the_fakes_answers_have_only_keys_sglang_writes(incremental):
    meta_keys = _meta_info_keys()
    finish = _finish_reason_keys()
    assert {"id", "finish_reason", "output_token_logprobs", "weight_versions"} <= meta_keys
    assert finish["length"] == {"type", "length"} and "matched" in finish["stop"]
    with SGLangFake(incremental=incremental) as fake:
        answers = asyncio.run(_answers(fake))
    for a in answers:
        assert set(a) == {"text", "output_ids", "meta_info"}, a.keys()
        assert set(a["meta_info"]) <= meta_keys, set(a["meta_info"]) - meta_keys
        fr = a["meta_info"]["finish_reason"]
        if fr is not None:
            assert set(fr) <= finish[fr["type"]], fr
