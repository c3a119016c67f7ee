"""Every checkpoint resumes exactly off-policy: `save_strategy="steps"` saves only at rollout-batch ends. TRL keeps
the rollout batch in memory only, so a checkpoint inside one would resume another run."""

from __future__ import annotations

import shutil

import pytest
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
        eval_dataset=prompt_dataset.select(range(8)) if args.eval_strategy != "no" else None,
    )  # fmt: skip


def _params(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_save_inside_a_rollout_batch_is_taken_at_its_end_and_max_steps_is_kept(tmp_path, tokenizer, prompt_dataset):
    # 4 optimizer steps per rollout batch (steps_per_generation 8, 2 micro-batches a step): save_steps=3 asks for
    # 3 (inside the first batch: taken at 4) and 6 (inside the second: taken at 8); max_steps=9 is saved as is.
    trainer = _trainer(
        tmp_path, tokenizer, prompt_dataset, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        steps_per_generation=8, save_steps=3, max_steps=9,
    )  # fmt: skip
    trainer.train()
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*")) == [4, 8, 9]


@pytest.mark.slow
def test_a_requeue_after_the_last_checkpoint_writes_the_best_model_with_load_best_model_at_end(
    tmp_path, tokenizer, prompt_dataset
):
    # Killed after its last checkpoint, a run with `load_best_model_at_end` is requeued with `last`: nothing is left
    # to train, and the final model it writes is the one the uninterrupted run ended with, the best checkpoint's.
    from transformers import TrainerCallback

    class BestIsCheckpoint2(TrainerCallback):  # as a metric that peaked at step 2 would say
        def on_step_end(self, args, state, control, **kwargs):
            state.best_model_checkpoint, state.best_global_step, state.best_metric = (
                str(tmp_path / "checkpoint-2"),
                2,
                -1e9,
            )

    best = dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=1, max_steps=4)
    full = _trainer(tmp_path, tokenizer, prompt_dataset, **best)
    full.add_callback(BestIsCheckpoint2())
    full.train()
    final = _params(full)
    (tmp_path / "model.safetensors").unlink(missing_ok=True)  # killed before the final model was written
    requeued = _trainer(tmp_path, tokenizer, prompt_dataset, **best)
    requeued.train(resume_from_checkpoint=True)
    assert requeued.state.global_step == 4
    for name, value in _params(requeued).items():
        assert torch.equal(value, final[name]), name
    last = _trainer(tmp_path / "other", tokenizer, prompt_dataset)
    last._load_from_checkpoint(str(tmp_path / "checkpoint-4"))
    assert any(not torch.equal(p, final[n]) for n, p in last.model.named_parameters())  # best != last
