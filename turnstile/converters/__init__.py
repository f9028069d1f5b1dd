"""Turnstile trajectories → each RL stack's own rollout format.

Every converter takes canonical :class:`~turnstile.store.trajectories.Trajectory` objects
(what ``turnstile.Client.trajectories`` returns) and gives plain dicts, lists and numpy arrays
shaped, named, padded and shifted the way that stack documents. No trainer package is
imported: they are heavy and GPU-bound, and a data path should not need them to be tested.
Wrap the arrays yourself where the stack wants tensors (``torch.from_numpy``).

==========  =========================================================================
module      output
==========  =========================================================================
verl        padded batch (``input_ids``/``attention_mask``/``position_ids``/``prompts``/
            ``responses``/``response_mask``/``rollout_log_probs``/``rm_scores`` + non-tensor
            ``uid``...) and agent-loop outputs
trl         ``rollout_func`` dict (``prompt_ids``/``completion_ids``/``logprobs``/``env_mask``)
skyrl       ``GeneratorOutput`` (merged or step-wise)
slime       ``Sample`` dicts and the ``train_data`` dict
areal       tensor dicts (``input_ids``/``loss_mask``/``logprobs``/``versions``/...) and their
            padded concatenation
openrlhf    agent-executor outputs (``observation_tokens``/``action_ranges``) and the
            shifted experience tensors
prime_rl    prime-rl ``TrainingSample`` and verifiers ``TrajectoryStep`` token dicts
tinker      Tinker-style ``Datum`` dicts (inputs ``tokens[:-1]``, targets ``tokens[1:]``)
==========  =========================================================================

Logprobs: the canonical array holds NaN where the engine sampled a token but reported no
logprob (llama-server does this for tokens that end mid-UTF-8 character). Converters keep NaN
unless ``fill_logprob`` is given, so a trainer never silently treats "unknown" as a value.
"""

from ._common import grpo_advantages

__all__ = ["grpo_advantages"]
