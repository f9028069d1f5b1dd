"""The fake SGLang's ``/generate`` (``input_ids``, cumulative or incremental streams, input
logprobs for a re-feed, routed experts, the sampling mask, images): route functions of
:class:`~turnstile.testing.fake_sglang_core.SGLangCore`. Shapes: see ``fake_sglang``."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import refeed, routing
from .fake_server import SSE_DONE, sse
from .fake_sglang_core import (
    MASK_MAX_TOKENS,
    SAMPLING_FIELDS,
    Invalid,
    json_response,
)
from .toy_model import EOS, Generation, Step, token_text

if TYPE_CHECKING:
    from .fake_sglang_core import SGLangCore


# /generate


def _validate(fake: SGLangCore, body: dict) -> tuple[list[int], dict]:
    sp = body.get("sampling_params") or {}
    ids = body.get("input_ids")
    if isinstance(ids, list) and not ids:  # as a real 0.5.23 answers (tests/fakes/golden)
        raise Invalid("input_ids cannot be empty.")
    if not isinstance(ids, list):
        raise Invalid("Either text, input_ids or input_embeds should be provided.")
    t = sp.get("temperature", 1.0)
    if t < 0:
        raise Invalid(f"temperature must be a non-negative finite number, got {t}.")
    top_p = sp.get("top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise Invalid(f"top_p must be in (0, 1], got {top_p}.")
    top_k = sp.get("top_k", -1)
    if top_k is not None and top_k < 1 and top_k != -1:
        raise Invalid(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    mnt = sp.get("max_new_tokens", 128)
    if mnt is not None and mnt < 0:
        raise Invalid(f"max_new_tokens must be at least 0, got {mnt}.")
    if len(ids) >= fake.context_len:
        raise Invalid(
            f"The input ({len(ids)} tokens) is longer than the model's context "
            f"length ({fake.context_len} tokens)."
        )
    if mnt is not None and mnt + len(ids) > fake.context_len:
        raise Invalid(
            f"Requested token count exceeds the model's maximum context length of "
            f"{fake.context_len} tokens. You requested a total of {mnt + len(ids)} tokens: "
            f"{len(ids)} tokens from the input messages and {mnt} tokens for the "
            f"completion. Please reduce the number of tokens in the input messages or the "
            f"completion to fit within the limit."
        )
    mode = body.get("sampling_logprobs_mode")
    if mode is not None and not body.get("return_sampling_mask"):  # tokenizer manager
        raise Invalid("sampling_logprobs_mode can only be set when return_sampling_mask=true.")
    if mode is not None and mode not in ("selected", "support"):
        raise Invalid(f"sampling_logprobs_mode must be 'selected' or 'support', got {mode!r}.")
    # the scheduler's check (temperature 0 is normalised to top_k 1 first)
    k_eff = 1 if t == 0 else (top_k if top_k is not None and top_k != -1 else 1 << 30)
    if body.get("return_sampling_mask") and k_eff != 1 and not 1 < k_eff <= MASK_MAX_TOKENS:
        raise Invalid(
            "return_sampling_mask requires top_k=1 for greedy sampling or finite "
            f"1 < top_k <= {MASK_MAX_TOKENS}; got top_k={k_eff}. Lower top_k or increase "
            "--sampling-mask-max-tokens."
        )
    start = body.get("routed_experts_start_len") or 0
    if body.get("return_routed_experts") and start < 0:  # the scheduler's checks
        raise Invalid(
            f"recv_req.routed_experts_start_len={start} is lower than 0. "
            "Please use a non-negative routed_experts_start_len."
        )
    if body.get("return_routed_experts") and start > len(ids):
        raise Invalid(
            f"recv_req.routed_experts_start_len={start} is higher than the number of "
            f"input tokens len(req.origin_input_ids)={len(ids)}. Please use a smaller "
            "routed_experts_start_len."
        )
    return ids, sp


def _contract_error(fake: SGLangCore, body: object) -> str | None:
    if not isinstance(body, dict):
        return "invalid type: sequence, expected struct GenerateRequest"
    sp = body.get("sampling_params")
    if isinstance(sp, dict):
        for key in sp:
            if key not in SAMPLING_FIELDS:
                listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
                return f"unknown field `{key}`, expected one of {listed}"
    return None


async def generate(fake: SGLangCore, request: Request) -> Response:
    body = await fake.record(request)
    await fake.while_paused()  # a paused server holds new requests (is_pause_cond)
    if (err := _contract_error(fake, body)) is not None:
        return json_response({"error": err}, 400)
    stream = bool(body.get("stream"))
    try:
        ids, sp = _validate(fake, body)
    except Invalid as exc:
        if stream:
            return StreamingResponse(_error_stream(fake, str(exc)), media_type="text/event-stream")
        return json_response({"error": {"message": str(exc)}}, 400)
    failed = fake.failed_next()
    if failed is not None:
        return failed
    rid = body.get("rid") or "sglang-rid"
    ids = _with_images(fake, rid, body, ids)
    if body.get("return_prompt_token_ids"):
        fake.prompt_echo[rid] = list(ids)
    else:
        fake.prompt_echo.pop(rid, None)
    k = int(body.get("top_logprobs_num") or 0)
    gen = fake.model.generate(
        ids,
        max_tokens=sp.get("max_new_tokens", 128),
        temperature=float(sp.get("temperature", 1.0)),
        top_p=float(sp.get("top_p", 1.0)),
        top_k=max(0, int(sp.get("top_k") or -1)),
        seed=sp.get("sampling_seed"),
        stop=sp.get("stop") or [],
        stop_token_ids=sp.get("stop_token_ids") or [],
        logit_bias=sp.get("logit_bias"),
        ignore_eos=bool(sp.get("ignore_eos")),
        k=k,
        version=fake.version_of,
    )
    fake.rec.sent[rid] = gen
    if not body.get("return_logprob"):
        fake.no_logprobs.add(rid)
    lstart = body.get("logprob_start_len")
    if body.get("return_logprob") and isinstance(lstart, int) and 0 <= lstart < len(ids):
        fake.input_from[rid] = (list(ids), lstart)
    else:
        fake.input_from.pop(rid, None)
    if fake.router is not None and body.get("return_routed_experts"):
        fake.routed_from[rid] = (list(ids), int(body.get("routed_experts_start_len") or 0))
    else:  # a rid reused by a request that does not ask
        fake.routed_from.pop(rid, None)
    if body.get("return_sampling_mask"):
        fake.masked[rid] = body.get("sampling_logprobs_mode") or "selected"
    else:
        fake.masked.pop(rid, None)
    started = time.time()
    if stream:
        return StreamingResponse(
            _stream(fake, rid, gen, len(ids), k, started), media_type="text/event-stream"
        )
    done = await fake.until_disconnect_or(request, rid, _wait(fake, rid, gen))
    if done is None:
        fake.rec.sent[rid] = Generation([], "abort")
        return Response(status_code=499)
    out = _out(fake, rid, done, done.steps, len(ids), k, finished=True, first=True, started=started)
    raw = orjson.dumps(out)
    fake.rec.raw[rid] = [raw]
    if done.reason != "abort":
        fake.rec.finished.append(rid)
    return Response(raw, media_type="application/json")


def _with_images(fake: SGLangCore, rid: str, body: dict, ids: list[int]) -> list[int]:
    """``input_ids`` as the multimodal processor leaves them (see the module's text)."""
    data = body.get("image_data")
    if not data:
        return ids
    images = data if isinstance(data, list) else [data]
    ph = fake.image_token_id
    if fake.image_tokens is None or ph is None:  # a text model: the images go unused
        return ids
    counts = [fake.image_tokens(_image_bytes(d)) for d in images]
    if sum(1 for t in ids if t == ph) != len(counts):
        fake.fell_back.append(rid)  # "falling back to decode+retokenize"
    out: list[int] = []
    at = 0
    for t in ids:
        if t == ph and at < len(counts):
            out.extend([ph] * counts[at])
            at += 1
        else:
            out.append(t)
    return out


def _input_logprobs(fake: SGLangCore, rid: str, k: int) -> list:
    """The prompt's logprobs from its start (``k`` > 0: each position's top ``k``), the
    first position null as SGLang's scheduler makes it."""
    prompt, start = fake.input_from[rid]
    out: list = [None]
    for p in range(start + 1, len(prompt)):
        lp = refeed.distribution(prompt[:p], fake.weights)
        if k:
            out.append([[lp[i], i, None] for i in refeed.ranked(lp, k)])
        else:
            out.append([refeed.logprob(lp, prompt[p]), prompt[p], None])
    if not k:
        out[0] = [None, prompt[start], None]
    return out


async def _wait(fake: SGLangCore, rid: str, gen: Generation) -> Generation:
    for i in range(len(gen.steps)):
        if not await fake.pace(rid):
            return Generation(gen.steps[:i], "abort")
    return gen


async def _error_stream(fake: SGLangCore, message: str):
    err = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "code": 400,
            "retryable": False,
        }
    }
    yield sse(orjson.dumps(err))
    yield SSE_DONE


def _finish_reason(fake: SGLangCore, gen: Generation, finished: bool) -> dict | None:
    if not finished:
        return None
    if gen.reason == "abort":
        return {
            "type": "abort",
            "message": "Abort before decode.",
            "status_code": None,
            "err_type": None,
        }
    if gen.reason == "length":
        return {"type": "length", "length": len(gen.steps)}
    return {
        "type": "stop",
        "matched": gen.stop_token if gen.stop_token is not None else gen.stop_string,
    }


def _out(
    fake: SGLangCore,
    rid: str,
    gen: Generation,
    steps: list[Step],
    prompt_len: int,
    k: int,
    finished: bool,
    first: bool,
    started: float,
    total: int | None = None,
    text: str | None = None,
) -> dict:
    """One response dict; ``steps`` are what this event carries (all so far when
    cumulative, the delta when incremental); ``total`` counts every output token so far."""
    total = len(steps) if total is None else total
    meta: dict = {
        "id": rid,
        "finish_reason": _finish_reason(fake, gen, finished),
        "prompt_tokens": prompt_len,
        "weight_version": fake.weight_version,
        "num_retractions": 0,
    }
    if rid not in fake.no_logprobs:  # a real 0.5.23 writes them only when asked
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [(s.logprob, s.token_id, None) for s in steps]
        meta["output_token_logprobs_length"] = total
    if rid in fake.input_from and rid not in fake.no_logprobs:
        meta["input_token_logprobs"] = _input_logprobs(fake, rid, 0)
    if k > 0 and rid not in fake.no_logprobs:
        meta["input_top_logprobs"] = _input_logprobs(fake, rid, k) if rid in fake.input_from else []
        meta["output_top_logprobs"] = [[(v, t, None) for t, v in s.top] for s in steps]
    if rid in fake.masked:  # after the logprob lists, as the tokenizer manager adds them
        meta.update(_sampling_mask(steps, fake.masked[rid], total))
    meta.update(reasoning_tokens=0, completion_tokens=total, cached_tokens=0)
    upto = Generation(gen.steps[:total], gen.reason)
    spans = fake.spans(upto)
    if spans and finished:  # a real 0.5.23 writes the spans on the final event only
        meta["weight_versions"] = spans
    if spans:
        meta["weight_version"] = spans[-1]["version"]
    meta["cached_tokens_details"] = {"device": 0, "host": 0}  # as 0.5.23 (null uncached)
    if finished and rid in fake.routed_from and fake.router is not None:
        prompt, start = fake.routed_from[rid]
        ids = prompt + [s.token_id for s in gen.steps[:total]]
        lo, hi = routing.forwarded(len(prompt), total, start)
        meta["routed_experts"] = routing.sglang_b64(fake.router.rows(ids[:hi])[lo:hi])
    meta["dp_rank"] = None
    if finished:
        meta["e2e_latency"] = round(time.time() - started, 6)
    if first:
        meta["response_sent_to_client_ts"] = time.time()
    if text is None:
        stop = gen.stop_token is not None and finished
        shown = steps[:-1] if stop and steps and steps[-1].token_id == gen.stop_token else steps
        text = "".join(token_text(s.token_id) for s in shown if s.token_id != EOS)
    out = {"text": text, "output_ids": [s.token_id for s in steps], "meta_info": meta}
    if rid in fake.prompt_echo:
        out["prompt_token_ids"] = fake.prompt_echo[rid]
    return out


async def _stream(
    fake: SGLangCore, rid: str, gen: Generation, prompt_len: int, k: int, started: float
):
    raw: list[bytes] = []
    fake.rec.raw[rid] = raw
    sent, first, ok = 0, True, False
    n = len(gen.steps)
    try:
        i = 0
        skipped = 0
        while i < n:
            step = fake.tokens_per_event if fake.incremental else 1
            for _ in range(min(step, n - i)):
                if not await fake.pace(rid):
                    cut = Generation(gen.steps[:i], "abort")
                    fake.rec.sent[rid] = cut
                    delta = cut.steps[sent:] if fake.incremental else cut.steps
                    out = _out(fake, rid, cut, delta, prompt_len, k, True, first, started, total=i)
                    for data in (sse(orjson.dumps(out)), SSE_DONE):
                        raw.append(data)
                        yield data
                    ok = True
                    return
                i += 1
            if fake.fail_mid_stream is not None:
                status, fake.fail_mid_stream = fake.fail_mid_stream, None
                err = {
                    "error": {
                        "message": "Internal server error",
                        "type": "invalid_request_error",
                        "code": status,
                        "retryable": False,
                    }
                }
                for data in (sse(orjson.dumps(err)), SSE_DONE):
                    raw.append(data)
                    yield data
                ok = True
                return
            last = i == n
            if not fake.incremental and not last and skipped < fake.skip_events:
                skipped += 1  # a slow client only sees the latest cumulative state
                continue
            skipped = 0
            steps = gen.steps[sent:i] if fake.incremental else gen.steps[:i]
            text = None
            if not last:
                shown = steps
                text = "".join(token_text(s.token_id) for s in shown)
            out = _out(
                fake, rid, gen, steps, prompt_len, k, last, first, started, total=i, text=text
            )
            first = False
            sent = i
            data = sse(orjson.dumps(out))
            raw.append(data)
            yield data
        raw.append(SSE_DONE)
        yield SSE_DONE
        ok = True
        fake.rec.finished.append(rid)
    finally:
        if not ok:
            fake.rec.disconnects.append(rid)
            fake.rec.sent[rid] = Generation(gen.steps[:sent], "abort")


def _image_bytes(item: object) -> bytes:
    """An ``image_data`` entry's bytes (a data URL or bare base64, as ``load_image`` takes)."""
    text = str(item.get("url") if isinstance(item, dict) else item)
    if text.startswith("data:"):
        text = text.partition(",")[2]
    return base64.b64decode(text)


def _sampling_mask(steps: list[Step], mode: str, total: int) -> dict:
    """``output_token_sampling_mask`` / ``_logprobs`` / ``_mask_length`` as SGLang 0.5.23's
    tokenizer manager writes them (``SamplingMaskChunk.to_lists``, accumulated per request):
    per output token of this event (all so far when cumulative, the delta when incremental)
    its kept token IDs (int32 → int, most probable first) and, "selected", the sampled
    token's logprob under the sampling distribution, or, "support", one per kept token
    (float32 → float); the length counts every row so far."""
    f32 = np.float32
    masks = [list(s.kept or [s.token_id]) for s in steps]
    if mode == "support":
        values: list = [[float(f32(v)) for v in (s.kept_logprobs or [0.0])] for s in steps]
    else:
        values = [float(f32(s.sampling_logprob or 0.0)) for s in steps]
    return {
        "output_token_sampling_mask": masks,
        "output_token_sampling_logprobs": values,
        "output_token_sampling_mask_length": total,
    }
