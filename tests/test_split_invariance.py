"""One rollout batch gives the same update however it is cut into micro-batches (item: every CE-GPPO setting means the
same thing for any split). The SFT term and dynamic sampling are normalised by rollout-batch counts rescaled to one
micro-batch, the way TRL rescales `num_items_in_batch` for `dapo`, so SGD takes the same step for 1 x N and k x N/k.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.demos.tiny import build_tiny_llama

GENERATION_BATCH = 12
NUM_GENERATIONS = 4


def _rollout_func(tokenizer, fixed_length):
    vocab = len(tokenizer)

    def rollout_func(prompts, trainer):
        # Deterministic "sampling" keyed on the sample's position in the generation batch: every split sees the
        # same completions. Lengths vary (3-6 tokens) unless `fixed_length`.
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = []
        for i in range(len(prompts)):
            g = torch.Generator().manual_seed(100 + i)
            length = fixed_length or int(torch.randint(3, 7, (1,), generator=g))
            completion_ids.append(torch.randint(4, vocab, (length,), generator=g).tolist())
        logprobs = [[0.0] * len(c) for c in completion_ids]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    return rollout_func


def char_reward(prompts, completions, **kwargs):
    # The group of "0+1=" is constant (dropped by dynamic sampling); the others get a spread of rewards 0..4.
    return [1.0 if p.startswith("0") else float(sum(map(ord, c)) % 5) for p, c in zip(prompts, completions)]


def one_sgd_step(tmp_path, tokenizer, micro_batches, fixed_length=None, **overrides):
    """Parameters after one SGD step over the same 12 completions, cut into `micro_batches` micro-batches."""
    torch.manual_seed(0)
    # float64: the batch gradient is a sum of near-cancelling group terms; in float32 TRL's own loss differs by
    # ~1e-3 between splits from rounding alone (5e-8 in float64).
    model = build_tiny_llama(tokenizer, seed=0).double()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = CEGPPOConfig(
        output_dir=str(tmp_path / f"split{micro_batches}"),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        per_device_train_batch_size=GENERATION_BATCH // micro_batches,
        gradient_accumulation_steps=micro_batches,  # steps_per_generation follows: one rollout batch per step
        num_generations=NUM_GENERATIONS,
        max_completion_length=6,
        max_steps=1,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,  # no clipping: the step is lr * gradient
        logging_steps=1,
        **overrides,
    )
    dataset = Dataset.from_dict({"prompt": ["0+1=", "2+3=", "4+5="] * 4})
    trainer = CEGPPOTrainer(
        model=model, reward_funcs=char_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        rollout_func=_rollout_func(tokenizer, fixed_length),
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}, logs[0]


def relative_discrepancy(delta_a, delta_b) -> float:
    num = sum(((delta_a[n] - delta_b[n]) ** 2).sum() for n in delta_a) ** 0.5
    den = sum((delta_a[n] ** 2).sum() for n in delta_a) ** 0.5
    return float(num / den)


CASES = {
    # loss_type: (config, fixed completion length or None)
    "grpo": ({"dynamic_sampling": True}, None),
    "dr_grpo": ({"dynamic_sampling": True}, None),
    "luspo": ({"dynamic_sampling": True}, None),
    "dapo": ({"dynamic_sampling": True}, None),
    # bnpo keeps TRL's rule (the micro-batch's own token count) for the policy loss, which depends on the split
    # whenever micro-batches hold different numbers of (kept) tokens; with equal lengths and nothing dropped only
    # the SFT term could make it split-dependent, and it does not.
    "bnpo": ({}, 6),
}


@pytest.mark.parametrize("loss_type", list(CASES))
@pytest.mark.slow
def test_one_optimizer_step_is_the_same_for_every_split(tmp_path, tokenizer, loss_type):
    extra, fixed_length = CASES[loss_type]
    config = dict(loss_type=loss_type, sft_loss_coef=1.0, **extra)
    whole, whole_logs = one_sgd_step(tmp_path, tokenizer, 1, fixed_length, **config)
    split, split_logs = one_sgd_step(tmp_path, tokenizer, 4, fixed_length, **config)
    if extra.get("dynamic_sampling"):
        assert whole_logs["cegppo/dynamic_sampling/dropped_groups"] == 1
    assert 0 < whole_logs["cegppo/sft_frac"] < 1
    assert max(d.abs().max().item() for d in whole.values()) > 1e-3, "the step must move the parameters"
    discrepancy = relative_discrepancy(whole, split)
    assert discrepancy < 1e-6, f"{loss_type}: |step(4 x 3) - step(1 x 12)| / |step(1 x 12)| = {discrepancy:.3g}"
    # The SFT metric is the rollout batch's NLL whatever the split (averaged over the micro-batches of the step).
    assert split_logs["cegppo/sft_loss"] == pytest.approx(whole_logs["cegppo/sft_loss"], rel=1e-5)
