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

from collections.abc import AsyncIterator

import aiohttp
import orjson

from .base import EngineError, Finish, SamplingParams, TokenEvent

_STOP_REASON = {"eos": "stop", "word": "stop", "limit": "length"}


class LlamaCppEngine:
    name = "llama-cpp"

    def __init__(self, url: str, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.context_length = 0
        self.model_path = ""
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=5)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=self._timeout, json_serialize=lambda o: orjson.dumps(o).decode(),
            connector=aiohttp.TCPConnector(limit=0))
        try:
            await self.refresh()
        except EngineError:
            pass  # not up yet: calls answer 503 until it is, and then pick up its settings

    async def refresh(self) -> None:
        """Read the engine's per-slot context size (what a prompt + completion must fit)."""
        props = await self._get("/props")
        settings = props.get("default_generation_settings") or {}
        self.context_length = int(settings.get("n_ctx") or props.get("n_ctx") or 0)
        self.model_path = props.get("model_path", "")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def health(self) -> bool:
        try:
            await self._get("/health")
            return True
        except EngineError:
            return False

    async def _get(self, path: str) -> dict:
        assert self._session is not None
        try:
            async with self._session.get(self.url + path) as r:
                if r.status != 200:
                    raise EngineError(f"llama-server {path} answered {r.status}", 503)
                return orjson.loads(await r.read())
        except aiohttp.ClientError as exc:
            raise EngineError(f"llama-server at {self.url} is unreachable: {exc}", 503) from exc

    def request_body(self, prompt_ids: list[int], params: SamplingParams) -> dict:
        body = {
            "prompt": prompt_ids,
            "n_predict": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
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
        return body

    async def generate(self, prompt_ids: list[int], params: SamplingParams, stream: bool = True
                       ) -> AsyncIterator[TokenEvent | Finish]:
        assert self._session is not None, "engine not started"
        body = self.request_body(prompt_ids, params)
        try:
            async with self._session.post(self.url + "/completion", json=body) as r:
                if r.status != 200:
                    text = (await r.read()).decode(errors="replace")[:500]
                    status = 400 if r.status == 400 else 502
                    raise EngineError(f"llama-server answered {r.status}: {text}", status)
                data = orjson.loads(await r.read())
            for ev in _events(data):
                yield ev
            yield _finish(data)
        except aiohttp.ClientError as exc:
            raise EngineError(f"llama-server at {self.url} failed: {exc}", 502) from exc


def _events(data: dict) -> list[TokenEvent]:
    """Sampled tokens with their logprobs.

    ``tokens`` lists every sampled ID, but ``completion_probabilities`` skips a token whose text
    ends inside a UTF-8 character, and the tokens of a matched stop string. Entries carry
    their ``id``, so they are matched to tokens in order; a token without one gets NaN
    ("sampled, logprob unknown", null in JSON) rather than a neighbour's number.
    """
    probs = data.get("completion_probabilities") or []
    out = []
    j = 0
    for tid in data.get("tokens") or []:
        if j < len(probs) and probs[j].get("id") == tid:
            p = probs[j]
            j += 1
            top = [(t["id"], t["logprob"]) for t in p.get("top_logprobs") or ()]
            out.append(TokenEvent(tid, float(p["logprob"]), top or None))
        else:
            out.append(TokenEvent(tid, float("nan")))
    return out


def _finish(data: dict) -> Finish:
    stop_type = data.get("stop_type", "none")
    timings = data.get("timings") or {}
    return Finish(
        reason=_STOP_REASON.get(stop_type, "stop"),
        stop_string=data.get("stopping_word") or None if stop_type == "word" else None,
        prompt_tokens=int(data.get("tokens_evaluated") or 0),
        cached_tokens=int(timings.get("cache_n") or 0),
        logprob_kind="raw_logits",
        timings={k: timings[k] for k in ("prompt_ms", "predicted_ms") if k in timings},
    )
