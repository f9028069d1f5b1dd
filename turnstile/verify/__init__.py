"""Re-feed verification: the engine scores recorded trajectories again, and each sampled
token's recorded logprob is compared with its recompute (``compare.py``), each call under its
own recorded sampler (``sampling.py``), recorded routed experts against the re-feed's
(``routing.py``), by the engine's own scorer (``scorers.py``, one per
engine kind); ``cli.py`` is ``turnstile verify``. docs/verification.md has the figures."""

from .compare import (
    Agreement,
    Verified,
    naive_ids,
    rerendered,
    samplings,
    summary,
    verify,
    verify_sessions,
)
from .routing import ROUTING_AGREE, RoutingAgreement, diagnosis
from .sampling import BOUND, MASKED, Sampling, recompute
from .scorers import (
    BF16_TOLERANCE,
    SCORERS,
    TOLERANCE,
    TOP_N,
    LlamaCppScorer,
    NotSupported,
    Scorer,
    SGLangScorer,
    VLLMScorer,
    scorer,
)

__all__ = [
    "BF16_TOLERANCE",
    "BOUND",
    "MASKED",
    "ROUTING_AGREE",
    "SCORERS",
    "TOLERANCE",
    "TOP_N",
    "Agreement",
    "LlamaCppScorer",
    "NotSupported",
    "RoutingAgreement",
    "SGLangScorer",
    "Sampling",
    "Scorer",
    "VLLMScorer",
    "Verified",
    "diagnosis",
    "naive_ids",
    "recompute",
    "rerendered",
    "samplings",
    "scorer",
    "summary",
    "verify",
    "verify_sessions",
]
