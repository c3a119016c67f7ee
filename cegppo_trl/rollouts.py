"""Per-completion masks derived from rewards, for the two parts of the authors' recipe the paper leaves out
(docs/algorithm.md §3): the SFT term on correct rollouts and dynamic sampling. Pure functions, tensors in and out.

Rewards are the total (weighted) reward per completion over the whole generation batch of all processes, laid out
group by group (`num_generations` consecutive completions per prompt), NaN for completions no reward function
could score.
"""

from __future__ import annotations

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
