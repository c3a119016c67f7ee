"""Per-completion masks for the two parts of the authors' recipe the paper leaves out (docs/algorithm.md §3): the SFT
term on correct completions and dynamic sampling. Rewards are the total reward per completion over the rollout batch
of all processes, `num_generations` consecutive completions per prompt, NaN where no reward function could score it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _grouped(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % num_generations != 0:
        shape, n = tuple(rewards.shape), num_generations
        raise ValueError(f"rewards must be 1-D with a multiple of num_generations={n} entries, got shape {shape}")
    return rewards.view(-1, num_generations)  # [G, n]


def correct_completions(rewards: torch.Tensor, num_generations: int, threshold: float | None = None) -> torch.Tensor:
    """Which completions ``(N,)`` the SFT term treats as correct: with `threshold`, ``reward >= threshold``; without,
    the reward is positive and the best of its group (for the authors' +1/-1 reward "verified correct", for a graded
    reward "the best answer found, if any good"). Unscorable (NaN) completions never are."""
    if threshold is not None:
        return rewards >= threshold  # NaN compares False
    grouped = _grouped(rewards, num_generations)
    group_max = torch.nan_to_num(grouped, nan=-torch.inf).amax(dim=1, keepdim=True)  # [G, 1]
    return ((grouped == group_max) & (grouped > 0)).view(-1)


def informative_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Dynamic sampling (DAPO): True ``(N,)`` for the completions of groups whose scorable (non-NaN) rewards are not
    all equal; the others have zero advantage everywhere, so no policy gradient, and only dilute the normaliser."""
    grouped = _grouped(rewards, num_generations)
    high = torch.nan_to_num(grouped, nan=-torch.inf).amax(dim=1)
    low = torch.nan_to_num(grouped, nan=torch.inf).amin(dim=1)
    keep = (high - low) > 0  # False for all-equal and for groups with < 2 scorable completions
    return keep.repeat_interleave(num_generations)


def total_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's ``(N, num_reward_funcs)`` rewards (NaN where a function gave None) to the weighted total ``(N,)`` over the
    scorable functions, NaN where none scored (as TRL sums them), and the mask ``(N,)`` of those unscorable ones."""
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    rewards[unscorable] = torch.nan  # as in TRL
    return rewards, unscorable


def rollout_batch_masks(
    rewards: torch.Tensor,
    advantages: torch.Tensor | None,
    loss_mask: torch.Tensor,
    *,
    process_index: int,
    num_generations: int,
    dynamic_sampling: bool,
    sft_loss_coef: float,
    sft_reward_threshold: float | None,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """What a rollout batch adds to TRL's output for the CE-GPPO loss, and its metrics: dynamic sampling's `keep_mask`
    and `num_items_in_batch` (the kept tokens), the SFT term's `sft_mask` and `num_sft_items_in_batch`.

    `rewards` (`total_rewards`) and `advantages` (TRL's, NaN where unscorable; read with `dynamic_sampling`) are
    ``(N,)`` over all processes; `loss_mask` is this process's ``(B, T)``, rows ``[rank * B, (rank + 1) * B)`` of them;
    `gather` concatenates a tensor over the processes (`accelerator.gather`).
    """
    outputs, metrics = {}, {}
    process_slice = slice(process_index * len(loss_mask), (process_index + 1) * len(loss_mask))
    keep = None
    if dynamic_sampling:
        # From TRL's advantages, whatever its `scale_rewards` or `multi_objective_aggregation`: TRL centres each group,
        # so equal advantages in a group are zero ones (unscorable completions, NaN here, are ignored).
        keep = informative_groups(advantages, num_generations)
        kept_groups = int(keep.view(-1, num_generations)[:, 0].sum())
        metrics["cegppo/dynamic_sampling/kept_groups"] = kept_groups
        metrics["cegppo/dynamic_sampling/dropped_groups"] = keep.numel() // num_generations - kept_groups
        outputs["keep_mask"] = keep[process_slice].float()
        loss_mask = loss_mask * outputs["keep_mask"].unsqueeze(1)
        # TRL's `dapo` normaliser counts only the kept groups' tokens (the other loss types normalise per micro-batch)
        outputs["num_items_in_batch"] = gather(loss_mask.sum()).sum()
    if sft_loss_coef > 0:
        correct = correct_completions(rewards, num_generations, sft_reward_threshold)
        if keep is not None:  # as in the authors' recipe, the SFT term sees only the groups that survive
            correct = correct & keep
        metrics["cegppo/sft_frac"] = correct.float().mean().item()
        outputs["sft_mask"] = correct = correct[process_slice].float()
        outputs["num_sft_items_in_batch"] = gather((loss_mask * correct.unsqueeze(1)).sum()).sum()
    return outputs, metrics
