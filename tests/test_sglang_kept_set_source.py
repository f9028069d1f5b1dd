"""The fake SGLang's sampling-mask lists against SGLang 0.5.23's own code: the pinned package's
``SamplingMaskChunk.to_lists`` (``srt/sampling/sampling_mask.py``, run from its source with its
annotations dropped) turns the fake sampler's kept sets and logprobs (int32 / float32, as the
scheduler holds them) into exactly the ``output_token_sampling_mask`` and
``output_token_sampling_logprobs`` the fake answers, in both modes."""

from __future__ import annotations

import ast
import types

import httpx
import numpy as np
import pytest

from turnstile.testing.fake_sglang import SGLangFake
from turnstile_testbed.sglang import sglang_package

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _to_lists() -> types.FunctionType:
    path = sglang_package() / "srt/sampling/sampling_mask.py"
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "to_lists":
            node.decorator_list, node.returns = [], None
            for a in [*node.args.args, *node.args.kwonlyargs]:
                a.annotation = None
            for n in ast.walk(node):  # local annotations (List[...]) name typing
                if isinstance(n, ast.AnnAssign):
                    n.annotation = ast.Name("object", ast.Load())
            ns: dict = {"np": np}
            exec(compile(ast.fix_missing_locations(ast.Module([node], [])), str(path), "exec"), ns)
            return ns["to_lists"]
    raise AssertionError(f"{path} has no to_lists")


@pytest.mark.parametrize("mode", ["selected", "support"])
def test_the_fakes_lists_are_sglangs(mode) -> None:
    to_lists = _to_lists()
    with SGLangFake() as fake:
        body = {
            "input_ids": [3, 1, 4, 1, 5],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.7, "top_k": 5},
            "return_logprob": True,
            "return_sampling_mask": True,
            "sampling_logprobs_mode": mode,
        }
        meta = httpx.post(fake.url + "/generate", json=body).json()["meta_info"]
        steps = next(iter(fake.rec.sent.values())).steps
    chunk = types.SimpleNamespace(
        lengths=np.array([len(s.kept) for s in steps], dtype=np.int32),
        token_ids=np.array([t for s in steps for t in s.kept], dtype=np.int32),
        logprobs=np.array(
            [v for s in steps for v in s.kept_logprobs]
            if mode == "support"
            else [s.sampling_logprob for s in steps],
            dtype=np.float32,
        ),
    )
    masks, values = to_lists(chunk, support_logprobs=mode == "support")
    assert meta["output_token_sampling_mask"] == masks
    assert meta["output_token_sampling_logprobs"] == values
    assert meta["output_token_sampling_mask_length"] == len(steps)
    for s, mask in zip(steps, masks, strict=True):
        assert s.token_id in mask and len(mask) <= 5
