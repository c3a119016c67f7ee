"""Hand-made inputs shared by the tests: a reward with spread in every group, the base test config, an off-policy
batch that populates every CE-GPPO region, and the loss + gradients of one `_compute_loss` call."""

from __future__ import annotations

import torch


def count_ones_reward(completions, **kwargs):
    """Reward with spread inside every group: the number of '1' characters."""
    return [float(c.count("1")) for c in completions]


def base_config_kwargs(tmp_path, **overrides) -> dict:
    kwargs = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-2,
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    return kwargs


def make_offpolicy_batch(trainer, *, seed: int = 0, batch: int = 6, prompt_len: int = 4, completion_len: int = 7):
    """A hand-made generation batch whose old log-probs differ from the current ones by up to +-0.6 nats, so every
    CE-GPPO region (left clip, right clip, inside) is populated; advantages of both signs and one zero."""
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    prompt_ids = torch.randint(4, vocab, (batch, prompt_len), generator=g)
    completion_ids = torch.randint(4, vocab, (batch, completion_len), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[0, 0] = 0  # left padding
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, -3:] = 0  # a shorter completion
    completion_mask[2, -1:] = 0
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, completion_len
        )
    old = logps + (torch.rand(logps.shape, generator=g) * 1.2 - 0.6)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.7, 0.0, 1.3])[:batch]
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": completion_mask.sum().float(),
    }


def loss_and_grads(trainer, inputs, compute_loss=None):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    compute_loss = compute_loss or trainer._compute_loss
    loss = compute_loss(trainer.model, inputs)
    return loss.detach(), torch.autograd.grad(loss, params)
