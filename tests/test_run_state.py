"""A resume continues the run: the drift alarm and the unscorable-batch count are in the checkpoint, as transformers
keeps a callback's state (`ExportableState`, in `trainer_state.json`); a checkpoint of an earlier cegppo-trl (its
`cegppo_state.json`) resumes the same way.

One process, a deterministic `rollout_func` (as tests/helpers/mp_train.py's job: completions keyed on the global step
and position), 8 optimizer steps, 2 per rollout batch (steps 2, 4, 6, 8 off-policy), a checkpoint at step 4. The
rollout batches of steps 3-4 and 5-6 get no reward (a run of 2 unscorable batches across the checkpoint), and the
drift threshold sits just below log(1 - epsilon), so every off-policy step with a left-clipped token is in one
episode of drift: the alarm fires at step 2 and, in the uninterrupted run, stays silent through step 8.
"""

from __future__ import annotations

import json
import logging
import math
import shutil

import pytest
import torch
from datasets import Dataset

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.checkpoints import COMMIT_FILE, LEGACY_STATE_FILE
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

UNSCORABLE_AT = (2, 4)  # global steps whose rollout batches get no reward
TIMING = ("runtime", "per_second", "time")


class _StepLog(logging.Handler):
    """Records each CE-GPPO warning with the global step it was given at."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.trainer = None
        self.records: list[tuple[int, str]] = []

    def emit(self, record):
        self.records.append((self.trainer.state.global_step, record.getMessage()))


def _train(output_dir, log: _StepLog, resume=None, **config):
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    vocab = len(tokenizer)
    holder = {}

    def rollout_func(prompts, trainer):
        completion_ids = []
        for i in range(len(prompts)):
            g = torch.Generator().manual_seed(1000 * trainer.state.global_step + i)
            length = int(torch.randint(3, 7, (1,), generator=g))
            completion_ids.append(torch.randint(4, vocab, (length,), generator=g).tolist())
        return {
            "prompt_ids": [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(c) for c in completion_ids],
        }

    def reward(prompts, completions, **kwargs):
        trainer = holder.get("trainer")  # set once the trainer exists (nothing calls the reward before)
        if trainer is not None and trainer.state.global_step in UNSCORABLE_AT:
            return [None] * len(completions)
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    args = CEGPPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", save_strategy="steps", save_steps=4,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=6, num_iterations=2, max_steps=8,
        learning_rate=5e-2, logging_steps=1, seed=0, disable_tqdm=True, max_unscorable_batches=3,
        left_drift_warning=math.log(1 - 0.2) - 1e-4, **config,
    )  # fmt: skip
    trainer = CEGPPOTrainer(
        model=build_tiny_llama(tokenizer, seed=0), reward_funcs=reward, args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i % 5}=" for i in range(16)]}), rollout_func=rollout_func,
    )  # fmt: skip
    holder["trainer"] = log.trainer = trainer
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _after(history: list[dict], step: int) -> list[dict]:
    return [
        {k: v for k, v in h.items() if not any(t in k for t in TIMING)}
        for h in history
        if h["step"] > step and "loss" in h
    ]


@pytest.mark.slow
def test_a_resumed_run_logs_what_the_uninterrupted_run_logs(tmp_path):
    loggers = [logging.getLogger(f"cegppo_trl.{name}") for name in ("trainer", "checkpoint_hooks")]
    log, resumed_log, legacy_log = _StepLog(), _StepLog(), _StepLog()
    for logger in loggers:
        logger.addHandler(log)
    try:
        full = _train(tmp_path / "full", log)
        for logger in loggers:
            logger.removeHandler(log)
            logger.addHandler(resumed_log)
        checkpoint = tmp_path / "full" / "checkpoint-4"
        saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]
        # Checkpoint-4 falls inside both runs: the alarm disarmed (episode since step 2), one unscorable batch so far.
        assert saved["LeftDriftAlarm"]["attributes"] == {"armed": False}
        assert saved["StopWhenNothingToLearn"]["attributes"]["unscorable_batches"] == 2 - 1
        resumed = _train(tmp_path / "resumed", resumed_log, resume=str(checkpoint))
        # The same checkpoint as earlier cegppo-trl wrote it: the state in `cegppo_state.json`, a format-3 marker
        legacy = tmp_path / "legacy" / "checkpoint-4"
        shutil.copytree(checkpoint, legacy)
        state = json.loads((legacy / "trainer_state.json").read_text())
        run_state = {"reward_monitor": state["stateful_callbacks"].pop("StopWhenNothingToLearn")["attributes"],
                     "left_drift_alarm": state["stateful_callbacks"].pop("LeftDriftAlarm")["attributes"]}  # fmt: skip
        (legacy / "trainer_state.json").write_text(json.dumps(state))
        (legacy / LEGACY_STATE_FILE).write_text(json.dumps({"format": 2, "run_state": run_state}))
        files = {p.name: p.stat().st_size for p in legacy.iterdir() if p.name != COMMIT_FILE}
        (legacy / COMMIT_FILE).write_text(json.dumps({"format": 3, "run": "old", "files": files, "state": {}}))
        for logger in loggers:
            logger.removeHandler(resumed_log)
            logger.addHandler(legacy_log)
        from_legacy = _train(tmp_path / "legacy", legacy_log, resume=True)
    finally:
        for logger in loggers:
            for handler in (log, resumed_log, legacy_log):
                logger.removeHandler(handler)

    drift = [(step, m) for step, m in log.records if "left_drift_warning" in m]
    assert [step for step, _ in drift] == [1]  # given during step 2 only: steps 4-8 stay in the same episode ...
    steps = {h["step"]: h for h in full.state.log_history if "loss" in h}
    assert "cegppo/preserved/left_log_ratio" in steps[8]  # ... although step 8 has left-clipped tokens again
    unscorable = [m for _, m in log.records if "consecutive unscorable" in m]
    assert [m.split(":")[1].split(" consecutive")[0].strip() for m in unscorable] == ["1", "2"]

    # The resumed run says and logs what the uninterrupted run says and logs after step 4.
    said = [(step, m) for step, m in resumed_log.records if "Resuming from" not in m]
    assert said == [(step, m) for step, m in log.records if step >= 4]
    assert [m for _, m in resumed_log.records if "Resuming from" in m] == [
        f"[RANK 0] Resuming from {checkpoint} (global step 4)."
    ]
    assert _after(resumed.state.log_history, 4) == _after(full.state.log_history, 4)
    assert len(_after(full.state.log_history, 4)) == 4
    assert [(step, m) for step, m in legacy_log.records if "Resuming from" not in m] == said
    assert _after(from_legacy.state.log_history, 4) == _after(full.state.log_history, 4)


def test_run_state_is_exportable_state_as_json_and_restored_into_the_trainers_own_callbacks(make_trainer, tmp_path):
    trainer = make_trainer(left_drift_warning=-1.0)
    trainer.left_drift_alarm.armed = False
    trainer.reward_monitor.unscorable_batches, trainer.reward_monitor.last_values = 3, [1.0]
    states = {type(c).__name__: json.loads(json.dumps(c.state())) for c in trainer._run_state_callbacks}
    assert states["LeftDriftAlarm"] == {"args": {"threshold": -1.0}, "attributes": {"armed": False}}
    monitor = states["StopWhenNothingToLearn"]["attributes"]
    assert monitor["unscorable_batches"] == 3 and monitor["last_values"] == [1.0]  # `end_of_run`'s values too
    # A resume with transformers' `restore_callback_states_from_checkpoint`: its copies give way to the trainer's own
    resumed = make_trainer(left_drift_warning=-1.0, restore_callback_states_from_checkpoint=True)
    folder = tmp_path / "checkpoint-0"
    folder.mkdir()
    resumed.state.stateful_callbacks = dict(states)
    for callback in resumed._run_state_callbacks:  # what `_load_callback_state` does
        resumed.callback_handler.remove_callback(type(callback))
        resumed.callback_handler.add_callback(type(callback)(**states[type(callback).__name__]["args"]))
    resumed._load_rollout_batch = lambda checkpoint: None
    resumed._load_rng_state(str(folder))
    assert not resumed.left_drift_alarm.armed and resumed.reward_monitor.unscorable_batches == 3
    assert resumed.reward_monitor.last_values == [1.0]
    assert all(any(c is own for c in resumed.callback_handler.callbacks) for own in resumed._run_state_callbacks)
