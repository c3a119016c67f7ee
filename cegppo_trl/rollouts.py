"""Rollout batches: per-completion masks derived from rewards, for the two parts of the authors' recipe the paper
leaves out (docs/algorithm.md §3), the SFT term on correct rollouts and dynamic sampling; and the batch-layout
arithmetic of where a resumed run lands in the rollout schedule. Pure functions, tensors or numbers in and out.

Rewards are the total (weighted) reward per completion over the whole generation batch of all processes, laid out
group by group (`num_generations` consecutive completions per prompt), NaN for completions no reward function
could score.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _grouped(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    if rewards.dim() != 1 or rewards.numel() % num_generations != 0:
        raise ValueError(
            f"rewards must be 1-D with a multiple of num_generations={num_generations} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    return rewards.view(-1, num_generations)  # [G, n]


def correct_completions(rewards: torch.Tensor, num_generations: int, threshold: float | None = None) -> torch.Tensor:
    """Which completions the SFT term treats as correct.

    Args:
        rewards: total reward per completion, shape ``(N,)``, NaN if unscorable.
        num_generations: completions per prompt; ``N`` must be a multiple of it.
        threshold: if given, correct means ``reward >= threshold``. Otherwise (default) correct means the reward is
            positive and equals the best reward of its group, which for the authors' +1/-1 math reward is "verified
            correct" and for graded rewards is "the best answer the policy found, if it was any good".

    Returns:
        Boolean mask ``(N,)``; unscorable completions are never correct.
    """
    if threshold is not None:
        return rewards >= threshold  # NaN compares False
    grouped = _grouped(rewards, num_generations)
    group_max = torch.nan_to_num(grouped, nan=-torch.inf).amax(dim=1, keepdim=True)  # [G, 1]
    return ((grouped == group_max) & (grouped > 0)).view(-1)


def informative_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Dynamic sampling (DAPO): keep the completions of groups whose scorable rewards are not all equal.

    A group whose rewards coincide has zero advantage everywhere, so it carries no policy gradient; it only
    dilutes the token normaliser. Unscorable (NaN) completions are ignored when comparing.

    Returns:
        Boolean mask ``(N,)``, True for completions to keep.
    """
    grouped = _grouped(rewards, num_generations)
    high = torch.nan_to_num(grouped, nan=-torch.inf).amax(dim=1)
    low = torch.nan_to_num(grouped, nan=torch.inf).amin(dim=1)
    keep = (high - low) > 0  # False for all-equal and for groups with < 2 scorable completions
    return keep.repeat_interleave(num_generations)


def total_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The total (weighted) reward per completion, as TRL sums it, and which completions no reward could score.

    Args:
        rewards_per_func: TRL's rewards ``(N, num_reward_funcs)``, NaN where a function gave None.
        reward_weights: one weight per reward function.

    Returns:
        ``(rewards, unscorable)``: ``(N,)`` totals over the scorable functions, NaN where every function is NaN (as
        in TRL), and the boolean mask ``(N,)`` of those completions.
    """
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
    """What a rollout batch adds to TRL's output for the CE-GPPO loss: the rollout-batch counts and the
    per-completion masks of dynamic sampling and the SFT term.

    Args:
        rewards: the total reward ``(N,)`` of each completion of the whole rollout batch, all processes, group by
            group, NaN where no reward scored it (`total_rewards`).
        advantages: TRL's advantages ``(N,)`` of the same completions (all processes), NaN where unscorable: what
            dynamic sampling decides from (only read with `dynamic_sampling`).
        loss_mask: this process's completion mask ``(B, T)``, times TRL's tool mask where there is one.
        process_index: this process's rank; its completions are rows ``[rank * B, (rank + 1) * B)`` of the batch.
        num_generations: completions per prompt.
        dynamic_sampling: drop the groups without reward spread (only in training).
        sft_loss_coef: the SFT term's weight; its mask is built when > 0.
        sft_reward_threshold: `correct_completions`' threshold.
        gather: concatenates a tensor over the processes (`accelerator.gather`; the identity on one process).

    Returns:
        ``(outputs, metrics)``: the entries to add to TRL's output (with dynamic sampling `keep_mask`, and
        `num_items_in_batch` over the kept groups; with the SFT term `sft_mask` and `num_sft_items_in_batch`, the
        correct completions' tokens over the rollout batch), and the metric values to log by name.
    """
    outputs: dict[str, torch.Tensor] = {}
    metrics: dict[str, float] = {}
    if not (sft_loss_coef > 0 or dynamic_sampling):
        return outputs, metrics
    local = loss_mask.size(0)
    process_slice = slice(process_index * local, (process_index + 1) * local)

    keep = None
    if dynamic_sampling:
        # Decided from the advantages TRL computed (whatever `multi_objective_aggregation` / `scale_rewards`): TRL
        # centres every group, so a group whose scorable completions all get the same advantage has zero advantage
        # (up to rounding) and no policy gradient. Unscorable completions (advantage forced to 0) are ignored, as in
        # the baseline.
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
        correct = correct[process_slice].float()
        outputs["sft_mask"] = correct
        outputs["num_sft_items_in_batch"] = gather((loss_mask * correct.unsqueeze(1)).sum()).sum()
    return outputs, metrics
