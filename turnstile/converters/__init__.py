"""Turnstile trajectories → each RL stack's own rollout format.

Every converter takes canonical :class:`~turnstile.store.trajectories.Trajectory` objects
(what ``turnstile.Client.trajectories`` returns) and gives plain dicts, lists and numpy arrays
shaped, named, padded and shifted the way that stack consumes them. No trainer package is
imported (Tinker's SDK types are used when it is installed); ``tests/test_trainer_contracts.py``
checks the outputs against the frameworks' own code in a separate virtualenv.
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
logprob (llama-server does this for tokens that end mid-UTF-8 character). NaN would poison a
masked loss (NaN * 0 is NaN), so converters fill those positions with ``fill_logprob``
(default 0.0) and report which ones they filled in the stack's metadata channel (or see
``_common.filled_positions``); ``fill_logprob=None`` keeps NaN.

The logprobs go to each trainer's rollout (behaviour) logprob field. Where a trained call's
record says they are not the sampler's (``behaviour_exact`` False: raw or scaled logprobs under
truncation, a bias or a grammar), every converter warns once per conversion
(``_common.InexactLogprobsWarning``, ``inexact="warn"``, the default) or refuses
(``inexact="refuse"``: ValueError naming the sample and call); the free-form metadata channels
(slime ``metadata``, prime-rl ``extras``, verl ``extra_fields``) carry ``behaviour_exact`` per
sample (None: a record too old to say).

Each module's docstring names the framework version it targets and who computes what from the
rewards (raw rewards where the framework normalises them itself); a sample without a reward
raises ValueError wherever a reward is needed, instead of training as 0.0.
"""

from ._common import grpo_advantages

__all__ = ["grpo_advantages"]
