"""`CEGPPOTrainer`'s checkpoint hooks: four host overrides, each calling `super()`, and a callback kept last.

`train` resolves `True`/`"last"` (`checkpoints`), holds the lock, guards a DeepSpeed or FSDP resume (`safe_load`);
`_save_checkpoint` begins a checkpoint and adds its rollout batch (`rollout_state`), `CheckpointCallback.on_save`
commits it; `_load_rng_state` restores the run state and the rollout batch; `_get_train_sampler`: TRL's order.
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
# Where earlier cegppo-trl kept each run-state callback's state in `cegppo_state.json` (the last: cegppo_trl.research)
_LEGACY_KEYS = {"StopWhenNothingToLearn": ("run_state", "reward_monitor"), "LeftDriftAlarm": ("run_state",
                "left_drift_alarm"), "EntropyControllerState": ("controller",)}  # fmt: skip


class CheckpointCallback(TrainerCallback):
    """The commit, after every other callback's `on_save`; transformers' SIGTERM checkpoint agreed by every process
    (its timer raises a flag, summed at each step's end; taken by the signalled rank alone, it hung the others)."""

    def __init__(self, trainer):
        self.trainer, self.requested, self.stopped = trainer, False, False

    def on_train_begin(self, args, state, control, **kwargs):
        for callback in self.trainer.callback_handler.callbacks:
            if getattr(callback, "jit_manager", None) is not None:  # transformers' `JITCheckpointCallback`
                callback.jit_manager._enable_checkpoint = lambda: setattr(self, "requested", True)  # it saves nothing

    def on_step_end(self, args, state, control, **kwargs):
        if args.enable_jit_checkpoint:
            flag = torch.tensor([float(self.requested)], device=self.trainer.accelerator.device)
            if self.trainer.accelerator.reduce(flag, reduction="sum").item() > 0:
                control.should_save = control.should_training_stop = self.stopped = True

    def on_save(self, args, state, control, **kwargs):
        trainer = self.trainer
        ckpt.commit(trainer._pending, args.should_save, trainer.accelerator.wait_for_everyone, args.save_only_model)
        trainer._committed = {*trainer._committed, os.path.realpath(trainer._pending)}  # a second `train()` may run


class ResumableRepeatSampler(RepeatSampler):
    """TRL's sampler (one generator, a permutation an epoch) whose resumed epoch draws after the earlier epochs'."""

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
    """The overrides; `_run_state_callbacks`: the trainer's `ExportableState` callbacks, restored on every resume."""

    _run_state_callbacks: tuple = ()
    _pending, _committed = None, frozenset()  # the checkpoint `_save_checkpoint` began; those this trainer committed

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        output_dir, callback = self.args.output_dir, CheckpointCallback(self)
        lock, created = ckpt.acquire_lock(output_dir, logger.warning) if self.args.should_save else (None, False)
        try:
            checkpoint, messages = ckpt.resolve(output_dir, resume_from_checkpoint)
            if checkpoint is None and (others := ckpt.other_runs(output_dir, self._committed)):
                raise ValueError(ckpt.refusal(output_dir, others))
            for message in messages:
                logger.warning(message, main_process_only=True)
            self.pop_callback(CheckpointCallback)
            self.add_callback(callback)  # last: after every other callback's `on_save`
            # transformers reads its own files weights-only; DeepSpeed's and sharded FSDP's need the guard
            with safe_resume_loads(checkpoint if self.is_deepspeed_enabled or self.is_fsdp_enabled else None):
                return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)
        finally:
            ckpt.release_lock(lock, output_dir, created)
            if callback.stopped:
                logger.warning(f"SIGTERM: stopped at step {self.state.global_step} of {self.state.max_steps} after "
                               "committing its checkpoint; requeue with `--resume_from_checkpoint last`.")  # fmt: skip
                signal.raise_signal(signal.SIGTERM)  # the handler transformers put back: by default, the exit

    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is not RepeatSampler or sampler.seed is None:
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
        if self._step % (self.args.steps_per_generation * self.num_iterations) and self._buffered_inputs is not None:
            path = rollout_batch_file(self._pending, self.args.process_index)  # inside a rollout batch: save it
            save_rollout_batch(path, self._buffered_inputs, self._step, self._rollout_layout())

    def _load_rng_state(self, checkpoint):  # once per resume, before a step trains
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        saved, legacy = self.state.stateful_callbacks, ckpt.read_json(os.path.join(checkpoint, ckpt.LEGACY_STATE_FILE))
        for callback in self._run_state_callbacks:
            # transformers' `restore_callback_states_from_checkpoint` puts a copy in its place: the trainer's stays
            handler, name, state = self.callback_handler, type(callback).__name__, legacy
            handler.callbacks = [callback if type(c) is type(callback) else c for c in handler.callbacks]
            for key in _LEGACY_KEYS.get(name, ("-",)):
                state = state.get(key) if isinstance(state, dict) else None
            state = saved[name]["attributes"] if name in saved else state  # None: a checkpoint of another trainer
            if state is not None:
                callback.load_state_dict(state)
            saved[name] = callback.state()  # transformers' save updates an entry each stateful callback must have
        self._load_rollout_batch(checkpoint)

    def _rollout_layout(self) -> dict:  # the step, and what sizes and splits this process's rollout batch
        names = ("steps_per_generation", "gradient_accumulation_steps", "per_device_train_batch_size")
        return {**{name: getattr(self.args, name) for name in names}, "num_iterations": self.num_iterations,
                "num_generations": self.num_generations, "world_size": self.accelerator.num_processes,
                "global_step": self.state.global_step}  # fmt: skip

    def _load_rollout_batch(self, checkpoint: str) -> None:
        """The saved rollout batch continued, on every process or none; else TRL's, generated at once."""
        self._step, self._buffered_inputs = 0, None  # TRL's at a resume (a trainer that trained before holds its own)
        path, batch, error, why = rollout_batch_file(checkpoint, self.args.process_index), None, None, None
        try:
            if os.path.isfile(path):
                batch = load_rollout_batch(path, self.accelerator.device)
                layout, unsaved = batch["layout"], batch["unsaved"]
                if layout.get("global_step") != self.state.global_step:
                    raise RolloutBatchError(f"{path} was written at step {layout.get('global_step')}, its checkpoint "
                                            f"is at step {self.state.global_step}: nothing of it was used. Resume "
                                            "another one.")  # fmt: skip
                changed = {k: [layout.get(k), v] for k, v in self._rollout_layout().items() if layout.get(k) != v}
                why = (f"the batch layout changed, saved -> now: {changed}" if changed else
                       f"these values could not be saved: {unsaved}" if unsaved else None)  # fmt: skip
            elif os.path.isfile(old := os.path.splitext(path)[0] + ".safetensors"):  # rollout_state's format 1
                batch, why = {}, f"{os.path.basename(old)} is an earlier cegppo-trl's file, not read"
        except RolloutBatchError as refused:
            error = refused
        # 0 no file, 1 a batch to continue, 2 one that cannot be, 3 refused: alike on every process, or none
        # continues (a process that generated alone would wait in TRL's gathers for the others)
        code = 3 if error else 0 if batch is None else 2 if why else 1
        codes = self.accelerator.gather(torch.tensor([code], device=self.accelerator.device)).tolist()
        if 3 in codes or 0 in codes and any(codes):  # a file refused, or the files of some processes only
            raise error or RolloutBatchError(
                f"{checkpoint}: the processes' rollout-batch files do not continue one "
                f"batch ({codes}; 0: none, 3: refused). Resume an earlier checkpoint."
            )
        if codes == [1] * len(codes):
            self._step, self._buffered_inputs = batch["step"], batch["micro_batches"]
        elif any(codes):
            logger.warning(
                f"{checkpoint} falls inside a rollout batch, whose saved micro-batches are not used ("
                f"{why or 'another process could not use its file'}): a new batch is generated, as TRL "
                "does, so the run goes on but not as the uninterrupted one would.",
                main_process_only=True,
            )
