"""llama.cpp's ``llama-server``, token-in through its native ``/completion`` route.

``/completion`` takes a prompt as an array of token IDs (no BOS is added to an array) and
returns the sampled IDs (``tokens``) with ``completion_probabilities``. Its logprobs are
*pre-sampling*: a softmax over the raw logits, before temperature and truncation. llama.cpp's
own sampler defaults (``top_k=40``, ``min_p=0.05``) differ from OpenAI's, so they are switched
off explicitly: the distribution sampled from is the one the request describes.

Generation is always requested *non-streaming*. llama-server's stream never sends the ID of a
token whose text ends inside a UTF-8 character (``process_token`` in
``tools/server/server-context.cpp`` holds the text back and the next chunk carries only the
next token), so a streamed record would silently lose sampled tokens. The gateway replays the
exact result to a streaming harness instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

import orjson

from .base import (
    RAW_LOGPROBS,
    EngineError,
    Finish,
    SamplingParams,
    Sent,
    TokenBatch,
    logprob_unfitness,
    sent_fields,
)
from .connection import Response
from .http import CONNECT_TIMEOUT_S, ENGINE_FAILURES, ENGINE_TIMEOUT_S, HTTPEngine, timed_out
from .prompt_json import wire_ids

_STOP_REASON = {"eos": "stop", "word": "stop", "limit": "length"}

# The sampler fields of ``/completion`` (wire name → SamplingParams field; None: fixed by
# Turnstile). Every sampler in llama-server's default chain is set, so none runs on its own
# default (top_k 40, top_p 0.95, min_p 0.05; the others are off by default but told so anyway).
SAMPLER_WIRE: dict[str, str | None] = {
    "n_predict": "max_tokens",
    "temperature": "temperature",
    "dynatemp_range": None,
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": None,
    "xtc_probability": None,
    "top_n_sigma": None,
    "mirostat": None,
    "dry_multiplier": None,
    "repeat_penalty": "repetition_penalty",
    "repeat_last_n": None,
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "logit_bias": "logit_bias",
    "grammar": "grammar",
    "json_schema": "json_schema",
}


# llama-server ends a generation on any token with one of these texts, whatever the model file
# says its end tokens are (llama.cpp's vocabulary loader, ``special_eog_ids``): in the Qwen2
# vocabulary a plain ``</s>`` among them. Turnstile must see such a stop as one, or its text
# would reach the harness as content.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "[e~[",
    }
)


def eog_by_text(vocab: Mapping[str, int]) -> frozenset[int]:
    """The tokens of ``vocab`` llama-server ends on by their text, with its two exceptions:
    ``<|end|>`` is not an end beside ``<|call|>`` and ``<|return|>`` or ``<|flush|>``
    (Harmony, Solar Open), nor ``</s>`` beside ``<|tool_response>`` or ``<|plamo:eos|>``."""
    ends = {text: i for text, i in vocab.items() if text in EOG_TEXTS}
    if "<|end|>" in ends and (
        {"<|return|>", "<|call|>"} <= ends.keys()
        or ("<|flush|>" in ends and ends.keys() & {"<|call|>", "<|calls|>"})
    ):
        del ends["<|end|>"]
    if "</s>" in ends and ("<|tool_response>" in ends or "<|plamo:eos|>" in vocab):
        del ends["</s>"]
    return frozenset(ends.values())


class LlamaCppEngine(HTTPEngine):
    name = "llama-cpp"
    label = "llama-server"

    def __init__(
        self,
        url: str,
        timeout: float = ENGINE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ):
        super().__init__(url, timeout, connect_timeout)
        self.model_path = ""

    async def refresh(self) -> None:
        """Read the engine's per-slot context size (what a prompt + completion must fit)."""
        props = await self._get("/props")
        settings = props.get("default_generation_settings") or {}
        self.context_length = int(settings.get("n_ctx") or props.get("n_ctx") or 0)
        self.model_path = props.get("model_path", "")

    async def _get(self, path: str) -> dict:
        status, raw = await self._request("GET", path)
        if status != 200:
            raise EngineError(f"llama-server {path} answered {status}", 503)
        return orjson.loads(raw)

    def end_ids(self, vocab: Mapping[str, int]) -> frozenset[int]:
        return eog_by_text(vocab)

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        """``completion_probabilities`` are pre-sampling: raw logits, no bias or temperature."""
        return logprob_unfitness(RAW_LOGPROBS, params)

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict:
        body = {
            "prompt": wire_ids(prompt_ids),
            "n_predict": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or 0,
            "min_p": params.min_p or 0.0,
            "typical_p": 1.0,
            "dynatemp_range": 0.0,
            "xtc_probability": 0.0,
            "top_n_sigma": -1.0,
            "mirostat": 0,
            "dry_multiplier": 0.0,
            "repeat_penalty": params.repetition_penalty or 1.0,
            "frequency_penalty": params.frequency_penalty or 0.0,
            "presence_penalty": params.presence_penalty or 0.0,
            "n_probs": max(1, params.top_logprobs),
            "return_tokens": True,
            "cache_prompt": True,
            "stream": False,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = params.stop
        if params.logit_bias:
            body["logit_bias"] = [[int(k), float(v)] for k, v in params.logit_bias.items()]
        if params.frequency_penalty or params.presence_penalty or params.repetition_penalty:
            # llama.cpp penalises the last ``repeat_last_n`` tokens of prompt + completion
            # (64 by default); the whole context is the nearest to OpenAI's "so far".
            body["repeat_last_n"] = self.context_length or 4096
        if params.grammar:
            body["grammar"] = params.grammar
        elif params.json_schema is not None:
            body["json_schema"] = params.json_schema
        return body

    def sent_sampling(self, params: SamplingParams) -> dict[str, Sent]:
        return sent_fields(self.request_body((), params), SAMPLER_WIRE)

    def sampling_notes(self, params: SamplingParams) -> list[str]:
        """Where this engine's sampling differs from what the OpenAI request means."""
        if params.frequency_penalty or params.presence_penalty:
            return [
                "llama-server applies frequency/presence penalties to the prompt's tokens "
                "too (OpenAI and vLLM: to the completion's tokens only)"
            ]
        return []

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[TokenBatch | Finish]:
        """Always one non-streamed request (see the module doc). A consumer that stops waiting
        closes the connection, which makes llama-server stop the task."""
        body = self.request_body(prompt_ids, params)
        resp: Response | None = None
        ended = False
        try:
            async with self.post(
                "/completion", orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
            ) as resp:
                if resp.status != 200:
                    ended = True
                    text = (await resp.read()).decode(errors="replace")[:500]
                    status = 400 if resp.status == 400 else 502
                    raise EngineError(f"llama-server answered {resp.status}: {text}", status)
                data = orjson.loads(await resp.read())
                ended = True
            batch = _events(data, params.top_logprobs)
            if batch:
                yield batch
            yield _finish(data, batch)
        except ENGINE_FAILURES as exc:
            # past the adapter's timeout (a non-streamed request sends nothing until it is
            # done) a clean 504, the call recorded as an error, and the connection dropped so
            # that llama-server stops the task; any other failure a 502
            ended = not timed_out(exc)
            raise self._failed(exc) from exc
        finally:
            if not ended:
                self._give_up(resp, None)


def _events(data: dict, k: int = 0) -> TokenBatch:
    """Sampled tokens with their logprobs.

    ``tokens`` lists every sampled ID, but ``completion_probabilities`` skips a token whose text
    ends inside a UTF-8 character, and the tokens of a matched stop string. Entries carry
    their ``id``, so they are matched to tokens in order; a token without one gets NaN
    ("sampled, logprob unknown", null in JSON) rather than a neighbour's number.
    """
    probs = data.get("completion_probabilities") or []
    out = TokenBatch()
    j = 0
    for tid in data.get("tokens") or []:
        if j < len(probs) and probs[j].get("id") == tid:
            p = probs[j]
            j += 1
            top = [(t["id"], t["logprob"]) for t in p.get("top_logprobs") or ()][:k]
            out.add(tid, float(p["logprob"]), top or None)
        else:
            out.add(tid, float("nan"))
    return out


def _finish(data: dict, batch: TokenBatch) -> Finish:
    stop_type = data.get("stop_type", "none")
    timings = data.get("timings") or {}
    # "eos": the last sampled token is the end-of-generation token (kept in ``tokens``).
    stop_token = batch.ids[-1] if stop_type == "eos" and batch else None
    return Finish(
        reason=_STOP_REASON.get(stop_type, "stop"),
        stop_token_id=stop_token,
        stop_string=data.get("stopping_word") or None if stop_type == "word" else None,
        prompt_tokens=int(data.get("tokens_evaluated") or 0),
        cached_tokens=int(timings.get("cache_n") or 0),
        logprob_kind=RAW_LOGPROBS,
        timings={k: timings[k] for k in ("prompt_ms", "predicted_ms") if k in timings},
        engine_sampling=_echoed(data.get("generation_settings")),
    )


def _echoed(settings: object) -> dict | None:
    """The sampler fields of llama-server's ``generation_settings`` (what its slot applied)."""
    if not isinstance(settings, dict):
        return None
    out = {k: settings[k] for k in SAMPLER_WIRE if k in settings}
    return out or None
