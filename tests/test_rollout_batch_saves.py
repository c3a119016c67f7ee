"""Every checkpoint resumes exactly off-policy, wherever it falls in a rollout batch and in every epoch: a checkpoint
inside a batch holds each process's buffered micro-batches (`cegppo_trl.rollout_state`), which the resume continues
without generating, and the repeat sampler's generator is put where the uninterrupted run had it (TRL's order in
every epoch). Two-process DDP and a real kill -9: tests/test_multiprocess.py."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers.batches import base_config_kwargs, count_ones_reward
from helpers.crafted import crafted_copy

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.checkpoints import COMMIT_FILE
from cegppo_trl.demos.tiny import build_tiny_llama
from cegppo_trl.rollout_state import RolloutBatchError, load_rollout_batch, save_rollout_batch

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


def _steps(folder) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*"))


def _resume_copy(tmp_path, run, step, tokenizer, prompts, **kw) -> CEGPPOTrainer:
    """checkpoint-`step` of `run`, copied into a fresh `output_dir` and resumed there to the end."""
    resumed_dir = tmp_path / f"resumed-{step}"
    shutil.copytree(run / f"checkpoint-{step}", resumed_dir / f"checkpoint-{step}")
    resumed = _trainer(resumed_dir, tokenizer, prompts, **kw)
    resumed.train(resume_from_checkpoint=str(resumed_dir / f"checkpoint-{step}"))
    return resumed


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        # 4 optimizer steps per rollout batch, one batch per epoch (8 prompts): three batches in three epochs
        dict(steps_per_generation=4, num_iterations=1, max_steps=12),
        # 2 micro-batches, 2 passes over them: 4 steps per batch, the second pass off-policy on the first's updates
        dict(steps_per_generation=2, num_iterations=2, max_steps=8),
    ],
    ids=["steps_per_generation=4", "num_iterations=2"],
)
def test_a_resume_from_the_checkpoint_of_every_step_ends_with_the_uninterrupted_runs_weights(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread, layout
):
    prompts = prompt_dataset.select(range(8))
    kw = dict(save_steps=1, **layout)
    reference = _trainer(tmp_path / "run", tokenizer, prompts, **kw)
    reference.train()
    final = _params(reference)
    steps = _steps(tmp_path / "run")
    assert steps == list(range(1, layout["max_steps"] + 1))
    # a batch file inside each rollout batch (4 steps), none at its end
    inside = [s for s in steps if (tmp_path / "run" / f"checkpoint-{s}" / "rollout_batch_0.pt").exists()]
    assert inside == [s for s in steps if s % 4]
    for step in steps[:-1]:
        resumed = _resume_copy(tmp_path, tmp_path / "run", step, tokenizer, prompts, **kw)
        assert resumed.state.global_step == layout["max_steps"]
        for name, value in _params(resumed).items():
            assert torch.equal(value, final[name]), (step, name)
    assert any(not torch.equal(v, p) for v, p in zip(final.values(), build_tiny_llama(tokenizer, seed=0).parameters()))


@pytest.mark.slow
def test_a_resume_inside_a_batch_generates_nothing_until_the_batch_ends(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    run = _trainer(tmp_path / "run", tokenizer, prompt_dataset, save_steps=1, max_steps=3)
    run.train()
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run" / "checkpoint-1", resumed_dir / "checkpoint-1")
    resumed = _trainer(resumed_dir, tokenizer, prompt_dataset, save_steps=1, max_steps=3)
    generated = []
    generate = resumed._generate_and_score_completions
    resumed._generate_and_score_completions = lambda inputs: (
        generated.append(resumed.state.global_step) or generate(inputs)
    )
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-1"))
    assert generated == [2]  # step 2 trains on the saved batch; step 3 begins the next one


@pytest.mark.slow
def test_a_batch_that_cannot_be_continued_is_generated_again_with_a_warning_naming_why(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread, caplog
):
    import logging

    run = _trainer(tmp_path / "run", tokenizer, prompt_dataset, save_steps=1, max_steps=1)
    run.train()
    # A layout the resumed run changed: 4 micro-batches a rollout batch instead of 2
    changed = tmp_path / "changed" / "checkpoint-1"
    shutil.copytree(tmp_path / "run" / "checkpoint-1", changed)
    resumed = _trainer(changed.parent, tokenizer, prompt_dataset, save_steps=1, max_steps=2, steps_per_generation=4)
    with caplog.at_level(logging.WARNING, logger="cegppo_trl.checkpoint_hooks"):
        resumed.train(resume_from_checkpoint=str(changed))
    assert resumed.state.global_step == 2
    assert "steps_per_generation': [2, 4]" in caplog.text and "a new batch is generated, as TRL does" in caplog.text
    # The file a development build of 0.5 wrote (safetensors, format 1): named, not read, the batch generated
    from cegppo_trl.checkpoints import commit

    old = tmp_path / "old" / "checkpoint-1"
    shutil.copytree(tmp_path / "run" / "checkpoint-1", old)
    (old / "rollout_batch_0.pt").rename(old / "rollout_batch_0.safetensors")
    commit(str(old), True, lambda: None)
    caplog.clear()
    resumed = _trainer(old.parent, tokenizer, prompt_dataset, save_steps=1, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="cegppo_trl.checkpoint_hooks"):
        resumed.train(resume_from_checkpoint=str(old))
    assert resumed.state.global_step == 2
    assert "(rollout_batch_0.safetensors is an earlier cegppo-trl's file, not read): a new batch" in caplog.text


@pytest.mark.slow
def test_the_end_of_training_checkpoint_inside_a_batch_resumes_exactly_with_more_max_steps(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    # `max_steps=5` with 2 steps a batch ends inside the third batch; transformers' final save
    # writes checkpoint-5, and a run given `max_steps=8` resumes it (a constant learning rate: a schedule over 5
    # steps is not one over 8). It ends where a run of 8 steps does.
    kw = dict(save_steps=4, lr_scheduler_type="constant")
    uninterrupted = _trainer(tmp_path / "eight", tokenizer, prompt_dataset, max_steps=8, **kw)
    uninterrupted.train()
    short = _trainer(tmp_path / "run", tokenizer, prompt_dataset, max_steps=5, **kw)
    short.train()
    assert _steps(tmp_path / "run") == [4, 5]
    assert (tmp_path / "run" / "checkpoint-5" / "rollout_batch_0.pt").exists()
    longer = _trainer(tmp_path / "run", tokenizer, prompt_dataset, max_steps=8, **kw)
    longer.train(resume_from_checkpoint="last")
    assert longer.state.global_step == 8
    final = _params(uninterrupted)
    for name, value in _params(longer).items():
        assert torch.equal(value, final[name]), name


@pytest.mark.slow
def test_a_crafted_batch_file_with_a_pickle_payload_is_refused_and_runs_nothing(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    run = _trainer(tmp_path / "run", tokenizer, prompt_dataset, save_steps=1, max_steps=1)
    run.train()
    payload_ran = tmp_path / "payload-ran"
    crafted = crafted_copy(
        tmp_path / "run" / "checkpoint-1", tmp_path / "crafted" / "checkpoint-1", "rollout_batch_0.pt",
        payload_ran,
    )  # fmt: skip
    resumed = _trainer(tmp_path / "crafted", tokenizer, prompt_dataset, save_steps=1, max_steps=2)
    with pytest.raises(RolloutBatchError, match=r"rollout_batch_0\.pt is not a rollout batch"):
        resumed.train(resume_from_checkpoint=str(crafted))
    assert not payload_ran.exists()
    assert resumed.state.global_step == 1 and _steps(tmp_path / "crafted") == [1]  # no step trained, none saved


@pytest.mark.slow
def test_a_batch_file_of_another_checkpoint_is_refused_naming_both_steps(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    from cegppo_trl.checkpoints import commit

    run = _trainer(tmp_path / "run", tokenizer, prompt_dataset, save_steps=1, max_steps=3)
    run.train()
    moved = tmp_path / "moved" / "checkpoint-1"
    shutil.copytree(tmp_path / "run" / "checkpoint-1", moved)
    shutil.copy(tmp_path / "run" / "checkpoint-3" / "rollout_batch_0.pt", moved)  # also inside a batch
    commit(str(moved), True, lambda: None)
    resumed = _trainer(moved.parent, tokenizer, prompt_dataset, save_steps=1, max_steps=3)
    with pytest.raises(RolloutBatchError, match=r"written at step 3, its checkpoint is at step 1"):
        resumed.train(resume_from_checkpoint=str(moved))
    assert resumed.state.global_step == 1


@pytest.mark.slow
def test_save_strategy_best_with_eval_steps_1_trains_as_grpo_trainer_does(tmp_path):
    from test_drop_in import differential, prompts

    # 2 optimizer steps per rollout batch: every other evaluation (and the best checkpoint it may pick) falls inside
    best = dict(save_strategy="best", eval_strategy="steps", eval_steps=1, metric_for_best_model="eval_loss",
                greater_is_better=False, max_steps=4)  # fmt: skip
    grpo, cegppo = differential(tmp_path, trainer_kwargs=dict(eval_dataset=prompts(4)), **best)
    assert grpo.error is None and cegppo.error is None, (grpo.message, cegppo.message)
    for outcome in (grpo, cegppo):
        assert outcome.trainer.state.global_step == 4
        assert len([h for h in outcome.log_history if "eval_loss" in h]) == 4
    saved = [sorted(p.name for p in (tmp_path / cls).glob("checkpoint-*")) for cls in ("GRPOTrainer", "CEGPPOTrainer")]
    assert saved[0] == saved[1] and saved[0], saved
    assert (tmp_path / "CEGPPOTrainer" / saved[1][-1] / COMMIT_FILE).exists()


@pytest.mark.slow
def test_item4_a_run_resumed_in_epochs_2_and_3_ends_with_the_uninterrupted_runs_weights(
    tmp_path, tokenizer, prompt_dataset, one_torch_thread
):
    # 8 prompts: 2 rollout batches (4 optimizer steps) per epoch, 12 steps = 3 epochs. TRL's RepeatSampler drew
    # epoch 1's order again in a resumed epoch (0.04 apart); its generator put back, it draws the same order.
    prompts = prompt_dataset.select(range(8))
    reference = _trainer(tmp_path / "run", tokenizer, prompts, max_steps=12)
    reference.train()
    final = _params(reference)
    for step in (4, 6, 10):  # the end of epoch 1, inside epoch 2, inside epoch 3
        resumed = _resume_copy(tmp_path, tmp_path / "run", step, tokenizer, prompts, max_steps=12)
        assert resumed.state.global_step == 12 and resumed.state.epoch == 3
        for name, value in _params(resumed).items():
            assert torch.equal(value, final[name]), (step, name)


def test_a_batch_file_holds_the_micro_batches_as_saved_and_names_what_it_cannot_hold(tmp_path):
    batch = {"completion_ids": torch.arange(6).view(2, 3), "num_images": [1, 2], "pixel_values": None}
    micro_batches = [{k: v[i : i + 1] if isinstance(v, torch.Tensor) else v for k, v in batch.items()} for i in (0, 1)]
    save_rollout_batch(str(tmp_path / "b.pt"), micro_batches, 3, {"world_size": 2})
    record = load_rollout_batch(str(tmp_path / "b.pt"), torch.device("cpu", 0))  # a DDP process's device on CPU
    assert (record["step"], record["layout"], record["unsaved"]) == (3, {"world_size": 2}, [])
    for saved, loaded in zip(micro_batches, record["micro_batches"], strict=True):
        assert torch.equal(saved["completion_ids"], loaded["completion_ids"])
        assert (loaded["num_images"], loaded["pixel_values"]) == ([1, 2], None)
    save_rollout_batch(str(tmp_path / "c.pt"), [{"ids": torch.ones(1), "images": [object()]}], 1, {})
    record = load_rollout_batch(str(tmp_path / "c.pt"))
    assert (record["unsaved"], record["micro_batches"]) == (["images (list)"], [])
