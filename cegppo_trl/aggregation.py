"""How a per-token loss becomes one micro-batch's loss, as pure functions (no trainer state).

`trl_weights` is TRL's own rule, ``loss = sum_{i,t} per_token_loss[i, t] * w[i, t]`` for each `loss_type` (TRL 1.16's
`GRPOTrainer._compute_loss`; tests/test_aggregation.py holds it to TRL's loss): the trainer aggregates CE-GPPO's
preserved-gradient term with it, so the term is normalised exactly as TRL normalises the surrogate beside it.

==========  ==========================================================================
loss_type   ``w[i, t]`` (``mask`` the loss mask, ``|o_i|`` the tokens of sequence i, ``B`` the micro-batch's rows)
==========  ==========================================================================
``grpo``    ``mask / |o_i| / B / accumulation``
``bnpo``    ``mask / sum(mask) / accumulation``
``dr_grpo`` ``mask / (B * max_completion_length) / accumulation``
``dapo``    ``mask / (num_items_in_batch / processes * accumulation / steps_per_generation)`` (train)
``luspo``   ``mask / B / accumulation``
==========  ==========================================================================

``accumulation`` is the gradient-accumulation steps in training, 1 in evaluation.

`normaliser` and `aggregate` serve the authors' SFT term (`sft_loss`), which this library adds: its counts span the
whole rollout batch (all processes, all micro-batches), rescaled to one micro-batch's share, so its loss does not
depend on how the rollout batch is split.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

AGGREGATION_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


class Normaliser(NamedTuple):
    """The normalisers of one micro-batch's aggregation (see `normaliser`).

    Attributes:
        per_sequence: ``(B,)`` divisor of each sequence's token sum (``grpo``: its token count), or None.
        total: 0-d divisor of the summed (per-sequence-normalised) loss.
        accumulation: divisor for gradient accumulation, applied last.
        rows_first: sum each sequence before summing the batch (TRL's ``luspo`` order), rather than all at once.
        accumulated: `total` already spans the accumulation window (``dapo``): the loss is not divided by
            `accumulation`.
    """

    per_sequence: torch.Tensor | None
    total: torch.Tensor
    accumulation: float
    rows_first: bool = False
    accumulated: bool = False


def trl_weights(
    loss_type: str,
    mask: torch.Tensor,
    *,
    num_items_in_batch: torch.Tensor,
    num_processes: int,
    steps_per_generation: int,
    gradient_accumulation_steps: int,
    max_completion_length: int,
    train: bool,
) -> torch.Tensor:
    """``d loss / d per_token_loss`` of TRL's aggregation rule `loss_type` for one micro-batch (module table).

    Args:
        loss_type: one of ``AGGREGATION_LOSS_TYPES``.
        mask: ``(B, T)`` loss mask of the micro-batch.
        num_items_in_batch: 0-d, tokens in the loss over the whole rollout batch (``dapo``; TRL's input).
        num_processes: processes the rollout batch is spread over.
        steps_per_generation: micro-batches per process per rollout batch in training.
        gradient_accumulation_steps: micro-batches per optimizer step (the trainer's current value).
        max_completion_length: ``dr_grpo``'s constant token count.
        train: training (the loss is accumulated) or evaluation (it is not).

    Returns:
        ``(B, T)`` weights in the mask's floating dtype (float32 for an integer mask), 0 outside `mask`.
    """
    mask = mask if mask.is_floating_point() else mask.float()
    accumulation = gradient_accumulation_steps if train else 1
    rows = mask.size(0)
    if loss_type == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / (rows * accumulation)
    if loss_type == "bnpo":
        return mask / (mask.sum().clamp(min=1.0) * accumulation)
    if loss_type == "dr_grpo":
        return mask / (rows * max_completion_length * accumulation)
    if loss_type == "dapo":
        total = num_items_in_batch.clamp(min=1.0) / num_processes
        if train:  # in eval, the batch is neither split across steps nor accumulated
            total = total * gradient_accumulation_steps / steps_per_generation
        return mask / total
    if loss_type == "luspo":
        return mask / (rows * accumulation)
    raise ValueError(f"Unknown loss type: {loss_type}")


def micro_batch_share(num_processes: int, steps_per_generation: int, train: bool) -> int:
    """Micro-batches per rollout batch: the generation batch spans all processes and, in training,
    `steps_per_generation` micro-batches (TRL's rescaling of `num_items_in_batch` for ``dapo``)."""
    return num_processes * (steps_per_generation if train else 1)


def normaliser(
    loss_type: str,
    mask: torch.Tensor,
    *,
    num_items_in_batch: torch.Tensor,
    num_sequences_in_batch: torch.Tensor,
    num_processes: int,
    steps_per_generation: int,
    gradient_accumulation_steps: int,
    max_completion_length: int,
    train: bool,
) -> Normaliser:
    """The normalisers of TRL's aggregation rule `loss_type` for one micro-batch (module table).

    Args:
        loss_type: one of ``AGGREGATION_LOSS_TYPES``.
        mask: ``(B, T)`` loss mask of the micro-batch.
        num_items_in_batch: 0-d, tokens in the loss over the whole rollout batch (``dapo``).
        num_sequences_in_batch: 0-d, sequences in the loss over the whole rollout batch (``grpo``, ``dr_grpo``,
            ``luspo``).
        num_processes: processes the rollout batch is spread over.
        steps_per_generation: micro-batches per process per rollout batch in training.
        gradient_accumulation_steps: micro-batches per optimizer step (the trainer's current value).
        max_completion_length: ``dr_grpo``'s constant token count.
        train: training (the batch is split into micro-batches and accumulated) or evaluation (neither).

    Returns:
        `Normaliser`.
    """
    accumulation = gradient_accumulation_steps if train else 1.0
    share = micro_batch_share(num_processes, steps_per_generation, train)
    if loss_type == "grpo":
        num_sequences = num_sequences_in_batch.clamp(min=1.0) / share
        return Normaliser(mask.sum(-1).clamp(min=1.0), num_sequences, accumulation)
    if loss_type == "bnpo":
        return Normaliser(None, mask.sum().clamp(min=1.0), accumulation)
    if loss_type == "dr_grpo":
        num_sequences = num_sequences_in_batch.clamp(min=1.0) / share
        return Normaliser(None, num_sequences * max_completion_length, accumulation)
    if loss_type == "dapo":
        # TRL's expression: `num_items_in_batch` spans the generation batch; rescale it to one accumulation window
        total = num_items_in_batch.clamp(min=1.0) / num_processes
        if train:  # in eval, the batch is neither split across steps nor accumulated
            total = total * gradient_accumulation_steps / steps_per_generation
        return Normaliser(None, total, accumulation, accumulated=True)
    if loss_type == "luspo":
        num_sequences = num_sequences_in_batch.clamp(min=1.0) / share
        return Normaliser(None, num_sequences, accumulation, rows_first=True)
    raise ValueError(f"Unknown loss type: {loss_type}")


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """One micro-batch's loss from the per-token loss, scaled for gradient accumulation.

    Args:
        per_token_loss: ``(B, T)``, or ``(B, 1)`` for a sequence-level ratio (broadcast against `mask`).
        mask: ``(B, T)`` loss mask.
        norm: `normaliser` of the rule.
    """
    if norm.per_sequence is not None:
        summed = ((per_token_loss * mask).sum(-1) / norm.per_sequence).sum()
    elif norm.rows_first:
        summed = (per_token_loss * mask).sum(-1).sum()
    else:
        summed = (per_token_loss * mask).sum()
    loss = summed / norm.total
    return loss if norm.accumulated else loss / norm.accumulation


def sft_loss(
    loss_type: str,
    per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    sft_sequences: torch.Tensor,
    num_sft_items_in_batch: torch.Tensor,
    num_sft_sequences_in_batch: torch.Tensor | None,
    **layout,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' SFT term: the NLL of the completions judged correct, normalised by the correct sequences or tokens
    of the whole rollout batch by the policy loss's rule. Under ``bnpo``, whose per-micro-batch token count would give
    a micro-batch holding one correct completion the weight of a whole batch, it is the rollout batch's token mean, as
    under ``dapo``.

    Args:
        loss_type: the policy loss's rule.
        per_token_logps: ``(B, T)`` log-probabilities of the completion tokens.
        mask: ``(B, T)`` loss mask (dropped groups already out).
        sft_sequences: ``(B,)`` the correct completions (`rollouts.rollout_batch_masks`' ``sft_mask``).
        num_sft_items_in_batch: 0-d, their tokens over the rollout batch.
        num_sft_sequences_in_batch: 0-d, their count over the rollout batch, or None: this micro-batch's, scaled to
            the rollout batch by `micro_batch_share`.
        **layout: `normaliser`'s keyword arguments from `num_processes` on.

    Returns:
        The loss, and ``[NLL sum, tokens]`` of the correct completions (detached, float32) for the logged token mean.
    """
    if num_sft_sequences_in_batch is None:
        share = micro_batch_share(layout["num_processes"], layout["steps_per_generation"], layout["train"])
        num_sft_sequences_in_batch = sft_sequences.sum() * share
    sft_mask = mask * sft_sequences.unsqueeze(1)
    norm = normaliser(
        "dapo" if loss_type == "bnpo" else loss_type,
        sft_mask,
        num_items_in_batch=num_sft_items_in_batch,
        num_sequences_in_batch=num_sft_sequences_in_batch,
        **layout,
    )
    loss = aggregate(-per_token_logps, sft_mask, norm)
    nll = -per_token_logps.detach().float()
    return loss, torch.stack([(nll * sft_mask).sum(), sft_mask.sum().float()])
