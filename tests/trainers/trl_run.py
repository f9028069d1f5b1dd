"""Runs in the trainers venv: ``examples/trl_grpo.py``'s trainer, with TRL's own batch written
out as TRL holds it, for ``tests/test_trl_grpo.py`` to compare with what the engine saw.

A ``GRPOTrainer`` subclass records, at each ``_compute_loss`` (TRL's loss on one batch), the
padded tensors TRL built from ``rollout_func``'s output (``prompt_ids``/``prompt_mask``,
``completion_ids``/``completion_mask``, ``tool_mask``, ``sampling_per_token_logps``,
``advantages``), the per-token logprobs of TRL's own forward inside that loss, and the loss;
the reward function records the extra fields TRL handed it (``session_id``, ``versions``).
Arguments: the example's, plus ``--dump FILE`` (JSON).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import trl_grpo  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

STEPS: list[dict] = []
REWARDED: list[dict] = []


class Recording(GRPOTrainer):
    def _compute_loss(self, model, inputs):  # type: ignore[no-untyped-def]
        forward = self._get_per_token_logps_and_entropies
        seen: list = []

        def spy(*a, **kw):  # type: ignore[no-untyped-def]
            out = forward(*a, **kw)
            seen.append(out[0].detach())
            return out

        self._get_per_token_logps_and_entropies = spy  # type: ignore[method-assign]
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            del self._get_per_token_logps_and_entropies
        rows = []
        for b in range(inputs["prompt_ids"].shape[0]):
            pm = inputs["prompt_mask"][b].bool()
            cm = inputs["completion_mask"][b].bool()
            tm = inputs["tool_mask"][b][cm]
            rows.append(
                {
                    "prompt_ids": inputs["prompt_ids"][b][pm].tolist(),
                    "completion_ids": inputs["completion_ids"][b][cm].tolist(),
                    "tool_mask": tm.tolist(),
                    "loss_mask": (inputs["completion_mask"][b] * inputs["tool_mask"][b])[
                        cm
                    ].tolist(),
                    "sampling_logps": inputs["sampling_per_token_logps"][b][cm].tolist(),
                    "trainer_logps": seen[0][b][cm].tolist(),
                    "advantage": float(inputs["advantages"][b]),
                }
            )
        STEPS.append(
            {"global_step": int(self.state.global_step), "loss": float(loss), "rows": rows}
        )
        return loss


def reward(prompts, completions, reward, session_id, versions, **kw):  # type: ignore[no-untyped-def]
    REWARDED.append({"session_id": list(session_id), "versions": [list(v) for v in versions]})
    return trl_grpo.turnstile_reward(prompts, completions, reward)


def main() -> None:
    ap = trl_grpo.parser()
    ap.add_argument("--dump", type=Path, required=True)
    args = ap.parse_args()
    trainer = trl_grpo.build_trainer(args, trainer_cls=Recording, reward=reward)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    moved = max(
        float((v.detach() - before[k]).abs().max()) for k, v in trainer.model.state_dict().items()
    )
    logged = [h for h in trainer.state.log_history if "loss" in h]
    args.dump.write_text(
        json.dumps(
            {
                "global_step": int(trainer.state.global_step),
                "steps": STEPS,
                "rewarded": REWARDED,
                "logged": logged,
                "moved": moved,
                "finite": all(math.isfinite(s["loss"]) for s in STEPS),
            }
        )
    )


if __name__ == "__main__":
    main()
