"""Every checkpoint resumes exactly off-policy, in every epoch: saves and evaluations are taken only at rollout-batch
ends (other steps are refused by `CEGPPOConfig`: TRL keeps the rollout batch in memory only, so a checkpoint inside one
would resume another run), and the repeat sampler draws each epoch's order from seed + epoch."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers.batches import base_config_kwargs, count_ones_reward

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.checkpoints import COMMIT_FILE
from cegppo_trl.offline.tiny import build_tiny_llama

# Off-policy: two optimizer steps per rollout batch (steps_per_generation = 2 x gradient_accumulation_steps), a
# checkpoint at every rollout-batch end; 6 steps stay inside the first epoch (32 prompts, 4 per rollout batch).
LAYOUT = dict(gradient_accumulation_steps=1, steps_per_generation=2, max_steps=6, save_strategy="steps", save_steps=2)


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
    assert saved == [2, 4, 6]
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
def test_item4_a_run_resumed_in_epochs_2_and_3_ends_with_the_uninterrupted_runs_weights(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    # 8 prompts: 2 rollout batches (4 optimizer steps) per epoch, 12 steps = 3 epochs. TRL's RepeatSampler drew
    # epoch 1's order again in a resumed epoch (0.04 apart); reseeded with seed + epoch it draws the same order.
    prompts = prompt_dataset.select(range(8))
    reference = _trainer(tmp_path / "run", tokenizer, prompts, max_steps=12)
    reference.train()
    final = _params(reference)
    for step in (4, 6, 10):  # the end of epoch 1, inside epoch 2, inside epoch 3
        resumed_dir = tmp_path / f"resumed-{step}"
        shutil.copytree(tmp_path / "run" / f"checkpoint-{step}", resumed_dir / f"checkpoint-{step}")
        resumed = _trainer(resumed_dir, tokenizer, prompts, max_steps=12)
        resumed.train(resume_from_checkpoint=str(resumed_dir / f"checkpoint-{step}"))
        assert resumed.state.global_step == 12 and resumed.state.epoch == 3
        for name, value in _params(resumed).items():
            assert torch.equal(value, final[name]), (step, name)


@pytest.mark.slow
def test_item2_save_total_limit_1_with_load_best_model_at_end_keeps_the_newest_checkpoint_beside_the_best(
    tmp_path, tokenizer, prompt_dataset
):
    from transformers import TrainerCallback

    class BestIsCheckpoint2(TrainerCallback):  # as a metric that peaked at step 2 would say
        def on_evaluate(self, args, state, control, **kwargs):
            state.best_model_checkpoint, state.best_global_step, state.best_metric = (
                str(tmp_path / "checkpoint-2"), 2, -1e9,
            )  # fmt: skip

    (tmp_path / "checkpoint-0").mkdir(parents=True)  # hand-made
    (tmp_path / "checkpoint-5").mkdir()  # torn: no marker
    (tmp_path / "checkpoint-5" / "model.safetensors").write_bytes(b"half")
    best = dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=2, save_total_limit=1)
    trainer = _trainer(tmp_path, tokenizer, prompt_dataset, **best)
    trainer.add_callback(BestIsCheckpoint2())
    trainer.train()
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert names == ["checkpoint-0", "checkpoint-2", "checkpoint-5", "checkpoint-6"]  # 4 rotated; 6 is the newest
    assert (tmp_path / "checkpoint-6" / COMMIT_FILE).exists() and trainer.args.save_total_limit == 1


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

    best = dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=2, max_steps=4)
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
