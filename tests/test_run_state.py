"""A resume continues the run: the drift alarm and the unscorable-batch count are in the checkpoint (JSON).

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

import pytest
import torch
from datasets import Dataset

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.checkpoints import CEGPPO_STATE_FILE
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


def _train(output_dir, log: _StepLog, resume=None):
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
        left_drift_warning=math.log(1 - 0.2) - 1e-4,
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
    log, resumed_log = _StepLog(), _StepLog()
    for logger in loggers:
        logger.addHandler(log)
    try:
        full = _train(tmp_path / "full", log)
        for logger in loggers:
            logger.removeHandler(log)
            logger.addHandler(resumed_log)
        checkpoint = tmp_path / "full" / "checkpoint-4"
        saved = json.loads((checkpoint / CEGPPO_STATE_FILE).read_text())["run_state"]
        # Checkpoint-4 falls inside both runs: the alarm disarmed (episode since step 2), one unscorable batch so far.
        assert saved["left_drift_alarm"] == {"armed": False}
        assert saved["reward_monitor"]["unscorable_batches"] == 2 - 1
        resumed = _train(tmp_path / "resumed", resumed_log, resume=str(checkpoint))
    finally:
        for logger in loggers:
            logger.removeHandler(log)
            logger.removeHandler(resumed_log)

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


def test_run_state_round_trips_as_json_and_an_older_checkpoint_gives_a_fresh_one(make_trainer):
    trainer = make_trainer(left_drift_warning=-1.0)
    trainer.left_drift_alarm.armed = False
    trainer.reward_monitor.unscorable_batches = 3
    state = json.loads(json.dumps(trainer.cegppo_run_state()))  # JSON, never a pickle
    assert state["left_drift_alarm"] == {"armed": False} and state["reward_monitor"]["unscorable_batches"] == 3
    restored, older = make_trainer(left_drift_warning=-1.0), make_trainer(left_drift_warning=-1.0)
    restored.load_cegppo_run_state(state)
    assert restored.cegppo_run_state() == state
    older.load_cegppo_run_state({})  # a cegppo_state.json written before "run_state" existed: no error, fresh
    fresh = older.cegppo_run_state()
    assert fresh["left_drift_alarm"] == {"armed": True} and fresh["reward_monitor"]["unscorable_batches"] == 0
