"""How far the trainer's gradient is from the definition's: `CEGPPOTrainer._compute_loss` (TRL's loss plus CE-GPPO's
term) against autograd through `cegppo_trl.loss.cegppo_objective` aggregated by TRL's rule, on one off-policy batch
of a tiny Llama whose tokens are clipped on both sides, for every loss type, with and without `delta`, fp32 and fp64.

Prints the largest absolute difference over all parameter gradients and the largest gradient (for scale).
Run from the repository root: ``python benchmarks/gradient_vs_definition.py``.
"""

from __future__ import annotations

import datetime
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from datasets import Dataset  # noqa: E402
from helpers.batches import base_config_kwargs, loss_and_grads, make_offpolicy_batch  # noqa: E402
from trl import __version__ as trl_version  # noqa: E402

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer  # noqa: E402
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402
from cegppo_trl.loss import cegppo_objective  # noqa: E402


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _weights(loss_type: str, mask: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """d loss / d per-token loss of each loss type's definition (TRL's docs), one process, no accumulation."""
    if loss_type == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1) / mask.size(0)
    if loss_type in ("bnpo", "dapo"):
        return mask / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        return mask / (mask.size(0) * max_completion_length)
    return mask / mask.size(0)  # luspo


def largest_difference(loss_type: str, delta: float | None, dtype: torch.dtype) -> tuple[float, float]:
    tokenizer = build_char_tokenizer()
    kwargs = base_config_kwargs(tempfile.mkdtemp(), loss_type=loss_type, gppo_beta1=0.5, gppo_beta2=1.0, delta=delta)
    trainer = CEGPPOTrainer(
        model=build_tiny_llama(tokenizer, seed=0), reward_funcs=reward, args=CEGPPOConfig(**kwargs),
        train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 8}), processing_class=tokenizer,
    )  # fmt: skip
    trainer.model.to(dtype)
    batch = make_offpolicy_batch(trainer)
    _, grads = loss_and_grads(trainer, batch)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = batch["completion_mask"]
    logp, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, torch.cat([batch["prompt_mask"], mask], 1), mask.size(1)
    )
    per_token = cegppo_objective(
        logp, batch["old_per_token_logps"], batch["advantages"], epsilon_low=0.2, epsilon_high=0.2, beta1=0.5,
        beta2=1.0, delta=delta,
    )  # fmt: skip
    weights = _weights(loss_type, mask, trainer.max_completion_length)
    reference = torch.autograd.grad((per_token * weights).sum(), [p for p in trainer.model.parameters()])
    diff = max((a - b).abs().max().item() for a, b in zip(grads, reference, strict=True))
    scale = max(b.abs().max().item() for b in reference)
    return diff, scale


def main() -> None:
    torch.set_num_threads(1)
    print(f"# gradient vs definition: {datetime.date.today()} | {platform.machine()} | torch {torch.__version__} | "
          f"trl {trl_version}")  # fmt: skip
    print("| loss_type | delta | dtype | max abs difference | max abs gradient |")
    print("|---|---|---|---|---|")
    for dtype in (torch.float32, torch.float64):
        for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            for delta in (None, 1.3):
                diff, scale = largest_difference(loss_type, delta, dtype)
                print(f"| {loss_type} | {delta} | {str(dtype).removeprefix('torch.')} | {diff:.2e} | {scale:.2e} |")


if __name__ == "__main__":
    main()
