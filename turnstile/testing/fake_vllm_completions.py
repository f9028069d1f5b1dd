"""The fake vLLM's ``/v1/completions`` (a token-ID prompt, ``return_token_ids``,
``return_tokens_as_token_ids``, ``prompt_logprobs`` for a re-feed) and ``/detokenize``: route
functions of :class:`~turnstile.testing.fake_vllm.VLLMFake`, whose sampling and pacing they
share. Shapes: see that module's docstring."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import refeed, toychat
from .fake_server import SSE_DONE, sse
from .fake_vllm_wire import Invalid, dumps_pydantic, dumps_python, error
from .toy_model import EOS, Step, token_text

if TYPE_CHECKING:
    from .fake_vllm_core import VLLMCore


# /v1/completions (token-ID prompt, return_token_ids, return_tokens_as_token_ids)


def _completion_logprobs(steps: list[Step], k: int | None, as_ids: bool) -> dict | None:
    if k is None:
        return None
    name = (lambda t: f"token_id:{t}") if as_ids else (lambda t: f"<{t}>")
    out: dict = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    offset = 0
    for s in steps:
        cands = [(s.token_id, s.logprob)] + [(t, v) for t, v in s.top if t != s.token_id]
        out["text_offset"].append(offset)
        out["token_logprobs"].append(max(s.logprob, -9999.0))
        out["tokens"].append(name(s.token_id))
        out["top_logprobs"].append({name(t): max(v, -9999.0) for t, v in cands[: k + 1]})
        offset += len(name(s.token_id))
    return out


async def completions(fake: VLLMCore, request: Request) -> Response:
    body = await fake.record(request)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), list):
        return Response(
            dumps_python(
                error("prompt must be a list of token ids", "BadRequestError", 400, "prompt")
            ),
            status_code=400,
            media_type="application/json",
        )
    ids = body["prompt"]
    sp = {
        key: body.get(key)
        for key in (
            "temperature",
            "top_p",
            "seed",
            "stop",
            "stop_token_ids",
            "logit_bias",
            "ignore_eos",
            "logprobs",
            "max_tokens",
            "routed_experts_prompt_start",
        )
        if key in body
    }
    sp.setdefault("max_tokens", 16)
    try:
        fake.check_sampling(sp, len(ids), "completions")
        fake.check_routing_start(sp, len(ids))
    except Invalid as exc:
        return Response(
            dumps_python(exc.body), status_code=exc.status, media_type="application/json"
        )
    rid = f"cmpl-{body.get('request_id') or 'x'}"
    gen = fake.sample(rid, ids, sp)
    k = body.get("logprobs")
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    with_ids = bool(body.get("return_token_ids"))
    wv = bool(body.get("return_weight_versions")) and fake.v >= (0, 33)
    created = int(time.time())
    text = "".join(f"<{s.token_id}>" for s in gen.steps if s.token_id != EOS)

    def choice(steps: list[Step], finish: str | None, first: bool, last: bool) -> dict:
        c = {
            "index": 0,
            "text": "".join(f"<{s.token_id}>" for s in steps),
            "logprobs": _completion_logprobs(steps, k, as_ids),
            "finish_reason": finish,
            "stop_reason": fake.stop_reason(gen) if finish else None,
        }
        if body.get("stream"):
            c["prompt_token_ids"] = ids if (first and with_ids) else None
            c["token_ids"] = [s.token_id for s in steps] if with_ids else None
            if fake.v >= (0, 33):
                c["weight_versions"] = fake.spans(gen) if (wv and last) else None
        return c

    if body.get("stream"):

        async def events():
            ok = False
            try:
                for i, s in enumerate(gen.steps):
                    await fake.pace(rid)
                    last = i == len(gen.steps) - 1
                    c = choice([s], gen.reason if last else None, i == 0, last)
                    obj = {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": fake.served_model,
                        "choices": [c],
                    }
                    if fake.v < (0, 32):
                        obj["kv_transfer_params"] = None
                    yield sse(dumps_pydantic(obj))
                usage = fake.usage_counts(len(ids), len(gen.steps), False)
                final = {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": fake.served_model,
                    "choices": [],
                    "usage": usage,
                }
                if fake.v >= (0, 32):
                    final["system_fingerprint"] = fake.fingerprint
                yield sse(dumps_pydantic(final))
                yield SSE_DONE
                ok = True
                fake.rec.finished.append(rid)
            finally:
                if not ok:
                    fake.rec.disconnects.append(rid)

        return StreamingResponse(events(), media_type="text/event-stream")
    if await fake.until_disconnect_or(request, rid, fake.paced(rid, gen)) is None:
        return Response(status_code=499)
    c = choice(gen.steps, gen.reason, True, True)
    c["text"] = text
    c.update(
        token_ids=gen.ids if with_ids else None,
        prompt_logprobs=_prompt_logprobs(fake, ids, body.get("prompt_logprobs")),
        prompt_token_ids=ids if with_ids else None,
        routed_experts=fake.routed(ids, gen.steps, sp.get("routed_experts_prompt_start") or 0),
    )
    if fake.v >= (0, 33):
        c["weight_versions"] = fake.spans(gen) if wv else None
    resp = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": fake.served_model,
        "choices": [c],
        "service_tier": None,
        "system_fingerprint": fake.fingerprint,
        "usage": fake.usage_counts(len(ids), len(gen.steps), True),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    fake.rec.finished.append(rid)
    return Response(dumps_python(resp), media_type="application/json")


def _prompt_logprobs(fake: VLLMCore, ids: list[int], n: object) -> list | None:
    """vLLM's ``prompt_logprobs``: null first, then per position the prompt's token and
    the top ``n`` (rank 1-based in the raw distribution)."""
    if not isinstance(n, int) or n < 0:
        return None
    out: list = [None]
    for p in range(1, len(ids)):
        lp = refeed.distribution(ids[:p], fake.weights)
        best = refeed.ranked(lp, len(lp))
        own = ids[p]
        entry = {
            own: (
                refeed.logprob(lp, own),
                best.index(own) + 1 if own < len(lp) else len(lp) + 1,
            )
        }
        for r, t in enumerate(best[:n]):
            entry.setdefault(t, (lp[t], r + 1))
        out.append(
            {
                str(t): {"logprob": v, "rank": r, "decoded_token": token_text(t)}
                for t, (v, r) in entry.items()
            }
        )
    return out


async def detokenize(fake: VLLMCore, request: Request) -> Response:
    body = await fake.record(request) or {}
    ids = [int(t) for t in body.get("tokens") or []]
    text = "".join(
        toychat.piece(t)
        if t in toychat.SPECIAL or t in toychat.TEXT or t >= 1000
        # the generation vocabulary's ids (the chat script's are its specials and 300+)
        else token_text(t)
        for t in ids
    )
    return Response(dumps_python({"prompt": text}), media_type="application/json")
