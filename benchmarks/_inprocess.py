"""Turnstile in-process (memory, long-session share): the real Gateway over an engine object
that answers at once, and the live bytes an object graph holds."""

from __future__ import annotations

import sys
from pathlib import Path

from _workload import MODEL_NAME, tiny_qwen2


class InProcessEngine:
    """Token-in engine without HTTP: yields the spec's tokens with logprobs, then a Finish.
    It meets ``turnstile.engines.base.EngineAdapter`` written out (not by subclassing
    ``EngineBase``: this module is also imported against baseline checkouts without it)."""

    name = "fake"
    context_length = 1 << 20
    url = None

    def __init__(self, spec: dict):
        self.ids, self.lps = spec["token_ids"], spec["logprobs"]

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def refresh(self) -> None: ...

    async def health(self) -> bool:
        return True

    def pick(self, session_id: str) -> InProcessEngine:
        return self

    def forget(self, session_id: str) -> None: ...

    def sampling_notes(self, params) -> list[str]:  # noqa: ANN001
        return []

    def sent_sampling(self, params) -> dict:  # noqa: ANN001
        """No wire: what the record's ``sampling_applied`` reads is the params themselves."""
        from turnstile.engines import base

        return {k: base.Sent(k, v) for k, v in params.as_dict().items()}

    async def pause(self, mode: str) -> str:
        return "no pause route"

    async def resume(self) -> str:
        return "no resume route"

    def replica_health(self) -> None:
        return None

    def logprob_warning(self, params=None) -> None:  # noqa: ANN001
        return None

    async def generate(self, prompt_ids, params, stream=True):  # noqa: ANN001
        from turnstile.engines import base

        if hasattr(base, "TokenBatch"):
            yield base.TokenBatch(list(self.ids), list(self.lps))
        else:  # a baseline checkout from before the columns (one object per token)
            yield [base.TokenEvent(t, lp) for t, lp in zip(self.ids, self.lps, strict=True)]
        Finish, PROCESSED_LOGPROBS = base.Finish, base.PROCESSED_LOGPROBS
        yield Finish("stop", prompt_tokens=len(prompt_ids), logprob_kind=PROCESSED_LOGPROBS)


def make_gateway(data: Path, spec: dict):
    """The Gateway ``turnstile serve`` builds (template audit left out: Qwen2.5 extends
    exactly), with the in-process engine."""
    try:
        from turnstile.app.wiring import build_renderer, detect_parser
    except ModuleNotFoundError:  # a baseline checkout from before turnstile/app/ (issue 41)
        from turnstile.wiring import build_renderer, detect_parser  # type: ignore[no-redef]
    from turnstile.chat.audit import Policy
    from turnstile.gateway.token_in.gateway import Gateway
    from turnstile.store.store import Store

    renderer, _ = build_renderer(str(tiny_qwen2()))
    return Gateway(
        renderer,
        InProcessEngine(spec),
        Store(data),
        MODEL_NAME,
        detect_parser(renderer.template),
        Policy.permissive(),
    )


def live_bytes(root: object) -> int:
    """Bytes of every object reachable from ``root`` (``sys.getsizeof``, each object once),
    leaving out what is shared process-wide: classes, modules, functions."""
    import gc
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total
