"""Rollout batches: per-completion masks derived from rewards, for the two parts of the authors' recipe the paper
leaves out (docs/algorithm.md §3), the SFT term on correct rollouts and dynamic sampling; and the batch-layout
arithmetic of where a resumed run lands in the rollout schedule. Pure functions, tensors or numbers in and out.

Rewards are the total (weighted) reward per completion over the whole generation batch of all processes, laid out
group by group (`num_generations` consecutive completions per prompt), NaN for completions no reward function
could score.
"""

from __future__ import annotations

import math

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


def resume_offset(
    global_step: int,
    *,
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    num_iterations: int,
    num_prompts: int | None,
    generation_batch_size: int,
    num_generations: int,
) -> int:
    """Micro-batches into its rollout batch at which a run resumed at `global_step` continues; 0 at a boundary.

    TRL's `GRPOTrainer._prepare_inputs` generates a rollout batch when its micro-batch counter is a multiple of
    ``steps_per_generation * num_iterations`` and serves the buffered batch's micro-batches in between. Neither the
    counter nor the buffer is in a checkpoint: a resumed run counts from 0 and generates at its first micro-batch,
    which transformers takes at ``(global_step % updates per epoch) * gradient_accumulation_steps`` micro-batches
    into the epoch (it skips the ones already trained). An epoch holds ``num_prompts // (generation_batch_size //
    num_generations)`` rollout batches of ``steps_per_generation * num_iterations`` micro-batches each (TRL's
    `RepeatSampler`), so the uninterrupted run generates at multiples of that within every epoch.

    Args:
        global_step: the checkpoint's optimizer step.
        gradient_accumulation_steps, steps_per_generation, num_iterations, generation_batch_size, num_generations:
            the run's settings.
        num_prompts: prompts in the training set, None for a dataset without a length (one endless epoch).

    Returns:
        The offset in micro-batches, in ``[0, steps_per_generation * num_iterations)``.
    """
    generate_every = steps_per_generation * num_iterations
    position = global_step * gradient_accumulation_steps
    if num_prompts is not None:
        micro_batches = num_prompts // (generation_batch_size // num_generations) * generate_every
        updates_per_epoch = max(math.ceil(micro_batches / gradient_accumulation_steps), 1)
        position = global_step % updates_per_epoch * gradient_accumulation_steps
    return position % generate_every


def resume_inside_rollout_batch_message(global_step: int, args, num_prompts: int | None) -> str | None:
    """The warning for a resume that lands inside a rollout batch (`resume_offset` > 0), else None.

    Args:
        global_step: the checkpoint's optimizer step.
        args: the run's `GRPOConfig` (its batch layout and `ignore_data_skip`).
        num_prompts: prompts in the training set, None for a dataset without a length.
    """
    if args.ignore_data_skip:  # the resumed run restarts the epoch's data: it starts at a rollout-batch boundary
        return None
    offset = resume_offset(
        global_step,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        steps_per_generation=args.steps_per_generation,
        num_iterations=args.num_iterations,
        num_prompts=num_prompts,
        generation_batch_size=args.generation_batch_size,
        num_generations=args.num_generations,
    )
    if offset == 0:
        return None
    generate_every = args.steps_per_generation * args.num_iterations
    every = generate_every // math.gcd(generate_every, args.gradient_accumulation_steps)
    return (
        f"Resuming at step {global_step} lands {offset} of {generate_every} micro-batches into a rollout batch "
        f"(steps_per_generation={args.steps_per_generation} x num_iterations={args.num_iterations}; "
        f"gradient_accumulation_steps={args.gradient_accumulation_steps} per optimizer step). Checkpoints do not hold "
        "the rollout batch, so TRL generates a new one here and every later rollout batch starts "
        f"{generate_every - offset} micro-batches later than in the interrupted run: training continues, but it is "
        f"not the run that was interrupted. To resume exactly, resume from a checkpoint at a multiple of {every} "
        f"steps (e.g. `save_steps` a multiple of {every})."
    )
