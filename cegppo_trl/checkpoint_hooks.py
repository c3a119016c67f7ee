"""`CEGPPOTrainer`'s checkpoint hooks: four of transformers' methods, each calling `super()`, and three callbacks.

1. `train`: `True` or `"last"` is the newest committed checkpoint (`checkpoints`), the `output_dir` lock is held, and
   a resumed DeepSpeed or FSDP run reads its checkpoints as data (`safe_load`).
2. `_save_checkpoint`: the pending mark, transformers' save (its rotation and Hub push), the rollout batch
   (`rollout_state`); `CommitAfterCallbacks`, the last callback, commits after every `on_save`.
3. `_load_rng_state`, once per resume before a step trains: the `ExportableState` run state, the rollout batch.
4. `_get_train_sampler`: TRL's sampler and order, its generator put back on resume (`ResumableRepeatSampler`).
5. `enable_jit_checkpoint`: a SIGTERM to any process is agreed at a step's end (`AgreedSigterm`); all save, then stop.
"""

from __future__ import annotations

import os
import signal

import torch
from accelerate.logging import get_logger
from transformers import TrainerCallback
from trl.trainer.utils import RepeatSampler

from . import checkpoints as ckpt
from .rollout_state import RolloutBatchError, load_rollout_batch, rollout_batch_file, save_rollout_batch
from .safe_load import safe_resume_loads

logger = get_logger(__name__)
# Where earlier cegppo-trl kept each run-state callback's state in `cegppo_state.json` (its checkpoints still resume)
_LEGACY_KEYS = {
    "StopWhenNothingToLearn": ("run_state", "reward_monitor"),
    "LeftDriftAlarm": ("run_state", "left_drift_alarm"),
    "EntropyControllerState": ("controller",),
}  # fmt: skip (the last: cegppo_trl.research)


class CommitAfterCallbacks(TrainerCallback):
    """Commits the checkpoint `_save_checkpoint` began once every callback's `on_save` has run (`train()` keeps it
    last): what a callback writes into the folder (an adapter, a README line) is in the commit."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        trainer = self.trainer
        ckpt.commit(trainer._pending, args.should_save, trainer.accelerator.wait_for_everyone, args.save_only_model)
        trainer._committed = {*trainer._committed, os.path.realpath(trainer._pending)}  # a second `train()` may run


class AgreedSigterm(TrainerCallback):
    """transformers' SIGTERM checkpoint agreed by every process: its timer (per process) only raises a flag, summed
    over the processes at each step's end, and then every process saves that step and stops. (transformers saved
    mid-step in the signalled process alone: a signal to one rank hung or aborted a multi-process run.)"""

    def __init__(self, trainer):
        self.trainer, self.requested, self.on = trainer, False, False

    def on_train_begin(self, args, state, control, **kwargs):
        for callback in self.trainer.callback_handler.callbacks:
            if getattr(callback, "jit_manager", None) is not None:  # transformers' `JITCheckpointCallback`
                callback.jit_manager._enable_checkpoint = self._request  # its timer's target: asks, saves nothing
                self.on = True

    def _request(self) -> None:
        self.requested = True

    def on_step_end(self, args, state, control, **kwargs):
        if not self.on:
            return
        accelerator = self.trainer.accelerator
        flag = torch.tensor([float(self.requested)], device=accelerator.device)
        if accelerator.num_processes > 1:
            flag = accelerator.reduce(flag, reduction="sum")
        if flag.item() > 0:
            control.should_save = control.should_training_stop = self.trainer._sigterm = True


class ResumableRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` (one generator seeded once, a permutation per epoch); an iteration that begins epoch
    `epoch_of()` after other than that many permutations (a resume, wherever accelerate wraps the sampler) reseeds and
    draws the earlier epochs' first, so every epoch gets the uninterrupted run's order."""

    def __init__(self, *args, epoch_of, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch_of, self.drawn = epoch_of, 0

    def __iter__(self):
        if self.shuffle and (epoch := self.epoch_of()) != self.drawn:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        self.drawn = self.epoch_of() + 1
        return super().__iter__()


class CheckpointHooks:
    """The module's overrides; `_run_state_callbacks`: the `ExportableState` callbacks restored on every resume."""

    _run_state_callbacks: tuple = ()
    _pending: str | None = None  # the checkpoint `_save_checkpoint` began and `CommitAfterCallbacks` commits
    _sigterm = False
    _committed: frozenset = frozenset()  # the checkpoints this trainer committed (rule 3 of `checkpoints`)

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        lock, created = (
            ckpt.acquire_lock(self.args.output_dir, logger.warning) if self.args.should_save else (None, False)
        )
        try:
            checkpoint, messages = ckpt.resolve(self.args.output_dir, resume_from_checkpoint)
            if checkpoint is None and (others := ckpt.other_runs(self.args.output_dir, self._committed)):
                raise ValueError(ckpt.refusal(self.args.output_dir, others))
            for message in messages:
                logger.warning(message, main_process_only=True)
            self._sigterm = False
            for callback in (AgreedSigterm, CommitAfterCallbacks):
                self.pop_callback(callback)
                self.add_callback(callback(self))  # the commit last: after every other callback's `on_save`
            # transformers reads its own files weights-only; DeepSpeed's and sharded FSDP's need the guard
            with safe_resume_loads(checkpoint if self.is_deepspeed_enabled or self.is_fsdp_enabled else None):
                return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)
        finally:
            ckpt.release_lock(lock, self.args.output_dir, created)
            if self._sigterm:
                logger.warning(f"SIGTERM: stopped at step {self.state.global_step} of {self.state.max_steps} after "
                               "committing its checkpoint; requeue with `--resume_from_checkpoint last`.")  # fmt: skip
                signal.raise_signal(signal.SIGTERM)  # the handler transformers put back: by default, the exit

    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is not RepeatSampler or not sampler.shuffle or sampler.seed is None:
            return sampler
        names = ("data_source", "mini_repeat_count", "batch_size", "repeat_count", "shuffle", "seed")
        return ResumableRepeatSampler(**{n: getattr(sampler, n) for n in names},
                                      epoch_of=lambda: int(self.state.epoch or 0))  # fmt: skip

    def _save_checkpoint(self, model, trial):
        self._pending = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.args.should_save:
            ckpt.begin(self._pending)
        self.accelerator.wait_for_everyone()
        super()._save_checkpoint(model, trial)
        step = self._step  # inside a rollout batch: what TRL keeps in memory (`rollout_state`)
        if step % (self.args.steps_per_generation * self.num_iterations) and self._buffered_inputs is not None:
            layout = {**self._rollout_layout(), "global_step": self.state.global_step}
            path = rollout_batch_file(self._pending, self.args.process_index)
            save_rollout_batch(path, self._buffered_inputs, step, layout)

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        saved, legacy = (
            self.state.stateful_callbacks,
            ckpt.read_json(os.path.join(checkpoint, ckpt.LEGACY_STATE_FILE)) or {},
        )
        handler = self.callback_handler
        for callback in self._run_state_callbacks:
            # transformers' `restore_callback_states_from_checkpoint` puts a copy in its place: the trainer's stays
            handler.callbacks = [callback if type(c) is type(callback) else c for c in handler.callbacks]
            name, state = type(callback).__name__, legacy
            for key in _LEGACY_KEYS.get(type(callback).__name__, ("-",)):
                state = state.get(key) if isinstance(state, dict) else None
            state = saved[name]["attributes"] if name in saved else state  # None: a checkpoint of another trainer
            if state is not None:
                callback.load_state_dict(state)
            saved[name] = callback.state()  # transformers' save updates an entry each stateful callback must have
        self._load_rollout_batch(checkpoint)

    # ------------------------------------------------------------------------------------------------------------
    # The rollout batch a checkpoint falls inside (`rollout_state`): saved with it, continued on resume
    # ------------------------------------------------------------------------------------------------------------
    def _rollout_layout(self) -> dict:
        """The settings that size and split this process's rollout batch (`rollout_state`, rule 3)."""
        names = ("steps_per_generation", "gradient_accumulation_steps", "per_device_train_batch_size")
        return {**{name: getattr(self.args, name) for name in names}, "num_iterations": self.num_iterations,
                "num_generations": self.num_generations, "world_size": self.accelerator.num_processes}  # fmt: skip

    def _load_rollout_batch(self, checkpoint: str) -> None:
        """The resume's rollout batch: the saved one, continued (`rollout_state`); else TRL's, generated at once."""
        self._step, self._buffered_inputs = 0, None  # TRL's at a resume (a trainer that trained before holds its own)
        path, batch, why, changed = rollout_batch_file(checkpoint, self.args.process_index), None, None, {}
        try:
            if os.path.isfile(path):
                batch = load_rollout_batch(path, self.accelerator.device)
                if (saved := batch.layout.pop("global_step", None)) != self.state.global_step:
                    raise RolloutBatchError(f"{path} was written at step {saved}, its checkpoint is at step "
                                            f"{self.state.global_step}: it belongs to another checkpoint, so nothing "
                                            "of it was used. Resume an earlier checkpoint.")  # fmt: skip
                changed = {k: [batch.layout.get(k), v] for k, v in self._rollout_layout().items()
                           if batch.layout.get(k) != v}  # fmt: skip
        except RolloutBatchError as error:
            why = error
        # 0 no file, 1 a batch to continue, 2 one that cannot be, 3 refused: alike on every process, or none
        # continues (a process that generated alone would wait in TRL's gathers for the others)
        code = 3 if why else 0 if batch is None else 2 if changed or batch.unsaved else 1
        codes = self.accelerator.gather(torch.tensor([code], device=self.accelerator.device)).tolist()
        name = os.path.basename(os.path.normpath(checkpoint))
        if 3 in codes or 0 in codes and any(codes):
            raise why or RolloutBatchError(f"{name}: process {codes.index(3)} refused its rollout-batch file (its log "
                                           "says why)" if 3 in codes else f"{name} lacks the rollout-batch file of "
                                           f"processes {[i for i, c in enumerate(codes) if not c]}: resume an earlier "
                                           "checkpoint of the run.")  # fmt: skip
        if codes == [1] * len(codes):
            self._step, self._buffered_inputs = batch.step, batch.micro_batches
        elif any(codes):
            reason = (f"the batch layout changed, saved -> now: {changed}" if changed else f"these values are not "
                      f"tensors: {batch.unsaved}" if batch.unsaved else "another process could not use its file")  # fmt: skip
            logger.warning(
                f"{name} falls inside a rollout batch, whose saved micro-batches are not used ({reason}): a new batch "
                "is generated there, as TRL does, so the run goes on but not as the uninterrupted one would.",
                main_process_only=True,
            )
