"""Every checkpoint resumes exactly off-policy: `save_strategy="steps"` saves only at rollout-batch ends (issue 36
item 8). TRL keeps the rollout batch in memory only, so a checkpoint inside one resumes another run."""

from __future__ import annotations

import shutil

import torch
from helpers.batches import base_config_kwargs, count_ones_reward

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.offline.tiny import build_tiny_llama
from cegppo_trl.rollouts import at_rollout_batch_boundary

# Off-policy: two optimizer steps per rollout batch (steps_per_generation = 2 x gradient_accumulation_steps), a
# checkpoint asked for at every step; 6 steps stay inside the first epoch (32 prompts, 4 per rollout batch).
LAYOUT = dict(gradient_accumulation_steps=1, steps_per_generation=2, max_steps=6, save_strategy="steps", save_steps=1)


def _trainer(output_dir, tokenizer, prompt_dataset, **kw) -> CEGPPOTrainer:
    args = CEGPPOConfig(**base_config_kwargs(output_dir, **{**LAYOUT, "learning_rate": 5e-2, **kw}))
    return CEGPPOTrainer(
        model=build_tiny_llama(tokenizer, seed=0), reward_funcs=count_ones_reward, args=args,
        train_dataset=prompt_dataset, processing_class=tokenizer,
    )  # fmt: skip


def _params(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def test_checkpoints_are_taken_at_rollout_batch_ends_and_each_resumes_the_run_bit_for_bit(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    reference = _trainer(tmp_path / "run", tokenizer, prompt_dataset)
    reference.train()
    final = _params(reference)
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "run").glob("checkpoint-*"))
    assert saved == [2, 4, 6]  # save_steps=1 asked for 1..6; 1, 3 and 5 fall inside a rollout batch
    assert [at_rollout_batch_boundary(step, reference.args, 32) for step in range(1, 7)] == [False, True] * 3
    for step in saved[:-1]:
        resumed_dir = tmp_path / f"resumed-{step}"
        shutil.copytree(tmp_path / "run" / f"checkpoint-{step}", resumed_dir / f"checkpoint-{step}")
        resumed = _trainer(resumed_dir, tokenizer, prompt_dataset)
        resumed.train(resume_from_checkpoint=str(resumed_dir / f"checkpoint-{step}"))
        assert resumed.state.global_step == 6
        for name, value in _params(resumed).items():
            assert torch.equal(value, final[name]), (step, name)
    assert any(not torch.equal(v, p) for v, p in zip(final.values(), build_tiny_llama(tokenizer, seed=0).parameters()))


def test_a_save_inside_a_rollout_batch_is_taken_at_its_end_and_max_steps_is_kept(tmp_path, tokenizer, prompt_dataset):
    # 4 optimizer steps per rollout batch (steps_per_generation 8, 2 micro-batches a step): save_steps=3 asks for
    # 3 (inside the first batch: taken at 4) and 6 (inside the second: taken at 8); max_steps=9 is saved as is.
    trainer = _trainer(
        tmp_path, tokenizer, prompt_dataset, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        steps_per_generation=8, save_steps=3, max_steps=9,
    )  # fmt: skip
    trainer.train()
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*")) == [4, 8, 9]
