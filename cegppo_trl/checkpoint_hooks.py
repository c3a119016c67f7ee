"""`CEGPPOTrainer`'s checkpoint hooks: transformers' save, resume and sampler hooks, each calling `super()`.

The protocol is `checkpoints`' (commit, `last`, one run per folder, same settings, lock) and `rollout_state`'s (the
rollout batch); these overrides wire it into `Trainer`:

1. Commit after every callback. `_save_checkpoint` writes `cegppo_state.json` first, then transformers' files and
   the rollout batch; `CommitAfterCallbacks`, the last callback, commits the folder once every `on_save` has written
   into it, then rotates (transformers' rule, its own held back during `train()`) and pushes.
2. The rollout batch a checkpoint falls inside is saved, and a resume continues it; where it cannot (a checkpoint of
   `GRPOTrainer` or cegppo-trl 0.4, a changed layout), TRL generates a new one and the log says why.
3. Every epoch draws its own order: TRL's `RepeatSampler` is reseeded with `seed + epoch` (`EpochSeededRepeatSampler`),
   so a run resumed in any epoch, on any number of processes, trains what the uninterrupted one trains.
4. Data only: every read of a checkpoint folder (weights, optimizer, RNG, the best model) is under `safe_load`.
"""

from __future__ import annotations

import contextlib
import os
import signal

import torch
from accelerate.logging import get_logger
from transformers import TrainerCallback, TrainerState
from transformers.trainer_utils import TrainOutput
from trl.trainer.utils import RepeatSampler

from .checkpoints import ResumePlan, begin_checkpoint, commit, read_state, rotate, start_run
from .rollout_state import RolloutBatchError, load_rollout_batch, rollout_batch_file, save_rollout_batch
from .rollouts import resume_offset
from .safe_load import UnsafeCheckpointError, safe_resume_loads

logger = get_logger(__name__)


class CommitAfterCallbacks(TrainerCallback):
    """Commits the checkpoint `_save_checkpoint` wrote once every callback's `on_save` has run (`train()` keeps it
    last), then rotates and pushes it: what a callback writes into the folder (an adapter, a README line) is in it."""

    def __init__(self, trainer: CheckpointHooks):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        t, folder = self.trainer, self.trainer._pending
        commit(folder, args.should_save, t._run, t.accelerator.wait_for_everyone, args.save_only_model)
        if args.should_save:
            rotate(os.path.dirname(folder), t._held["save_total_limit"], state.best_model_checkpoint, t._run)
        if t._held["push_to_hub"]:
            t._push_from_checkpoint(folder)


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` with its generator reseeded to `seed + epoch` at each epoch (see `_get_train_sampler`).

    The epoch is `set_epoch`'s, and `epoch_of()` (the trainer's epoch) for an iteration that no `set_epoch` preceded:
    the epoch a multi-process run resumes in, where transformers' call cannot reach the sampler."""

    epoch = 0
    epoch_of = None
    _told = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._told = epoch, True

    def __iter__(self):
        if not self._told and self.epoch_of is not None:
            self.epoch = self.epoch_of()
        self._told = False
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


class CheckpointHooks:
    """`CEGPPOTrainer`'s overrides of transformers' checkpoint hooks (the module's rules). The objects named in
    `_RUN_STATE_COMPONENTS` carry state across optimizer steps and are saved in `cegppo_state.json`."""

    _RUN_STATE_COMPONENTS: tuple[str, ...] = ()
    _pending: str | None = None  # the checkpoint `_save_checkpoint` wrote and `CommitAfterCallbacks` commits
    _sigterm = False

    def _init_checkpoint_state(self) -> None:
        """Called by the trainer's constructor."""
        self.settings_history: list[dict] = []  # settings changed on resume, `{"step", "changes"}` (model card)
        self._run: str | None = None  # the run this trainer's checkpoints belong to (`checkpoints`, rule 3)
        self._plan: ResumePlan | None = None  # the plan of the current `train()`
        self._held: dict = {}  # transformers' settings held back during `train()` (`save_total_limit`, `push_to_hub`)

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train` from the launch's `checkpoints.ResumePlan` (`start_run`, or the one `cegppo train` made);
        a checkpoint at the run's end trains nothing but the final model, written from it. transformers' rotation,
        end-of-train deletion and Hub push are held back for the call (`CommitAfterCallbacks` rotates and pushes
        after each commit). A run transformers stopped for a SIGTERM (`enable_jit_checkpoint`) ends by the signal."""
        plan = resume_from_checkpoint
        if not isinstance(plan, ResumePlan):
            plan = start_run(self.args, resume_from_checkpoint, logger.warning, run=self._run)
        self._run, self._plan, self._sigterm = plan.run, plan, False
        self._held = {"save_total_limit": self.args.save_total_limit, "push_to_hub": self.args.push_to_hub}
        self.args.save_total_limit, self.args.push_to_hub = None, False
        self.pop_callback(CommitAfterCallbacks)
        self.add_callback(CommitAfterCallbacks(self))  # last: after every other callback's `on_save`
        try:
            if not plan.finished:
                return super().train(plan.checkpoint, trial, ignore_keys_for_eval, **kwargs)
            # transformers would train a step past the end; a requeue of a finished run only writes the final model
            self._load_from_checkpoint(plan.checkpoint)  # guarded (`safe_load`), as every checkpoint read
            state = TrainerState.load_from_json(f"{plan.checkpoint}/trainer_state.json")
            self.state.global_step = state.global_step
            if self.args.load_best_model_at_end and state.best_model_checkpoint is not None:
                self.state.best_model_checkpoint = state.best_model_checkpoint  # the run's final model is the best
                self._load_best_model()
            self.save_model(self.args.output_dir)  # whatever `output_dir` holds may be another run's
            return TrainOutput(self.state.global_step, 0.0, {})
        finally:
            self.args.__dict__.update(self._held)
            self._held = {}
            if plan is not resume_from_checkpoint:
                plan.release()
            if self._sigterm:
                logger.warning(f"SIGTERM: stopped at step {self.state.global_step} of {self.state.max_steps} after "
                               "committing its checkpoint; requeue with `--resume_from_checkpoint last`.")  # fmt: skip
                signal.raise_signal(signal.SIGTERM)  # the handler transformers put back: by default, the exit

    def _get_train_sampler(self, dataset=None):
        # TRL's `RepeatSampler` seeds its generator once, so a run resumed in a later epoch would replay the first
        # epoch's permutation; reseeded with seed + epoch (accelerate's `SeedableRandomSampler`), every epoch draws
        # the same order whether the run was resumed or not. transformers calls `set_epoch` before each epoch, but in
        # the epoch that a run of 2+ processes resumes in, the call stops short: accelerate's `skip_first_batches`
        # wraps the `BatchSamplerShard` in a `SkipBatchSampler`, one level deeper than `set_epoch` looks, so that epoch
        # drew epoch 1's order (a DDP resume in epoch 2 or 3 ended on other weights). There the sampler takes the
        # resumed trainer state's epoch: the integer part of `state.epoch`, exactly `e` when epoch e begins.
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is RepeatSampler and sampler.shuffle and sampler.seed is not None:
            sampler.__class__ = EpochSeededRepeatSampler  # TRL's construction kept, its iteration reseeded
            sampler.epoch_of = lambda: int(self.state.epoch or 0)
        return sampler

    def _save_checkpoint(self, model, trial):
        # The protocol of `checkpoints` (rule 1): `cegppo_state.json` first (an earlier save's files gone), a barrier;
        # transformers' files. `CommitAfterCallbacks` commits once every callback's `on_save` has run.
        self._pending = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if os.path.exists(sentinel := os.path.join(self._pending, "checkpoint-is-incomplete.txt")):
            # transformers' SIGTERM checkpoint (`enable_jit_checkpoint`) falls mid-step: this step's end is saved
            # instead, as any save, then the run stops as transformers asked
            self._sigterm = self.control.should_save = True
            os.remove(sentinel)
            with contextlib.suppress(OSError):  # the folder transformers made for it, unless a checkpoint is there
                os.rmdir(self._pending)
            return
        if self.args.should_save:
            controller = None if self.entropy_controller is None else self.entropy_controller.state_dict()
            record = {"settings": self._plan.settings, "controller": controller,
                      "run_state": self.cegppo_run_state(), "history": self.settings_history}  # fmt: skip
            # format 2: every config field that changes the run (1, cegppo-trl 0.4: a fixed list of them)
            begin_checkpoint(self._pending, {"format": 2, **{k: v for k, v in record.items() if v}})
        self.accelerator.wait_for_everyone()
        super()._save_checkpoint(model, trial)
        self._save_rollout_batch(self._pending)  # inside a rollout batch: what TRL keeps in memory (`rollout_state`)

    def cegppo_run_state(self) -> dict:
        """What this trainer carries from step to step, as JSON (saved in each checkpoint's `cegppo_state.json`)."""
        state = {}
        for name in self._RUN_STATE_COMPONENTS:
            if getattr(self, name) is not None:
                state[name] = getattr(self, name).state_dict()
        return state

    def load_cegppo_run_state(self, state: dict) -> None:
        """Restore `cegppo_run_state()`; what `state` lacks (a checkpoint written before it was saved) stays fresh."""
        for name in self._RUN_STATE_COMPONENTS:
            if getattr(self, name) is not None and name in state:
                getattr(self, name).load_state_dict(state[name])

    # Every read of a checkpoint folder is data only (`safe_load`), for as long as the trainer lives: the resume
    # (`_prepare_for_training` holds the DeepSpeed, FSDP and optimizer loads; `_load_from_checkpoint` the weights of
    # one process and DDP), the RNG state (read inside the training loop) and the best model at the end.
    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        with safe_resume_loads(resume_from_checkpoint):
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with safe_resume_loads(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_rng_state(self, checkpoint):
        # transformers calls it once per resume, on every process, before the first micro-batch trains
        with safe_resume_loads(checkpoint):
            super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            self._load_rollout_batch(checkpoint)

    # ------------------------------------------------------------------------------------------------------------
    # The rollout batch a checkpoint falls inside (`rollout_state`): saved with it, continued on resume
    # ------------------------------------------------------------------------------------------------------------
    def _rollout_layout(self) -> dict:
        """The settings that size and split this process's rollout batch (`rollout_state`, rule 3)."""
        names = ("steps_per_generation", "gradient_accumulation_steps", "per_device_train_batch_size")
        return {**{name: getattr(self.args, name) for name in names}, "num_iterations": self.num_iterations,
                "num_generations": self.num_generations, "world_size": self.accelerator.num_processes}  # fmt: skip

    def _save_rollout_batch(self, folder: str) -> None:
        """`rollout_state` rule 1: inside a rollout batch, this process's buffered micro-batches and TRL's counter.
        Every checkpoint is taken at an optimizer step's end (transformers' SIGTERM one too: `_save_checkpoint`)."""
        step = self._step
        if step % (self.args.steps_per_generation * self.num_iterations) == 0 or self._buffered_inputs is None:
            return  # a rollout-batch end: the resume generates, as the uninterrupted run does
        layout = {**self._rollout_layout(), "global_step": self.state.global_step}
        save_rollout_batch(rollout_batch_file(folder, self.args.process_index), self._buffered_inputs, step, layout)

    def _load_rollout_batch(self, checkpoint: str) -> None:
        """The resume's rollout batch: the saved one, continued (`rollout_state`); else TRL's, generated at once."""
        self._step, self._buffered_inputs = 0, None  # TRL's at a resume (a trainer that trained before holds its own)
        path, batch, why = rollout_batch_file(checkpoint, self.args.process_index), None, None
        if os.path.isfile(path):
            try:
                batch = load_rollout_batch(path, self.accelerator.device)
                if (saved := batch.layout.pop("global_step", None)) != self.state.global_step:
                    raise RolloutBatchError(
                        f"{path} was written at step {saved}, its checkpoint is at step {self.state.global_step}: it "
                        "belongs to another checkpoint, so nothing of it was used. Resume an earlier checkpoint."
                    )
            except RolloutBatchError as error:
                why = error
        changed = {} if batch is None else {
            k: [batch.layout.get(k), v] for k, v in self._rollout_layout().items() if batch.layout.get(k) != v
        }  # fmt: skip
        # 0 no file, 1 a batch to continue, 2 one that cannot be, 3 refused: alike on every process, or none
        # continues (a process that generated alone would wait in TRL's gathers for the others)
        code = 3 if why else 0 if batch is None else 2 if changed or batch.unsaved else 1
        codes = self.accelerator.gather(torch.tensor([code], device=self.accelerator.device)).tolist()
        if 3 in codes:
            raise why or RolloutBatchError(
                f"process {codes.index(3)} refused its rollout-batch file (its log says why)"
            )
        name = os.path.basename(os.path.normpath(checkpoint))
        if 0 in codes and any(codes):
            raise RolloutBatchError(
                f"{name} holds a rollout-batch file for processes {[i for i, c in enumerate(codes) if c]} but not for "
                f"{[i for i, c in enumerate(codes) if not c]}: a file of the checkpoint was lost. Resume an earlier "
                "checkpoint of the run."
            )
        if codes == [1] * len(codes):
            self._step, self._buffered_inputs = batch.step, batch.micro_batches
            return
        if any(codes):
            reason = (
                f"the batch layout changed, saved -> now: {changed}" if changed
                else f"these values are not tensors: {batch.unsaved}" if batch.unsaved
                else "another process could not use its file"
            )  # fmt: skip
            logger.warning(
                f"{name} falls inside a rollout batch, whose saved micro-batches are not used ({reason}): a new batch "
                "is generated there, as TRL does, so the run goes on but not as the uninterrupted one would.",
                main_process_only=True,
            )
            return
        args = self.args
        try:
            num_prompts = len(self.train_dataset)
        except TypeError:  # an iterable dataset: one endless epoch
            num_prompts = None
        offset = resume_offset(
            self.state.global_step, gradient_accumulation_steps=args.gradient_accumulation_steps,
            steps_per_generation=args.steps_per_generation, num_iterations=self.num_iterations,
            num_prompts=num_prompts, generation_batch_size=args.generation_batch_size,
            num_generations=self.num_generations,
        )  # fmt: skip
        if offset:
            logger.warning(
                f"{name} falls {offset} micro-batch(es) into a rollout batch but holds no rollout_batch_*.safetensors "
                "(a checkpoint of cegppo-trl 0.4 or of GRPOTrainer): a new batch is generated there, as TRL does, so "
                "the run goes on but not as the uninterrupted one would.",
                main_process_only=True,
            )

    def _load_best_model(self):
        # `best_model_checkpoint` may come from a resumed checkpoint's `trainer_state.json`, i.e. name any folder.
        # A refusal comes after training: the model keeps the weights it has, and the run is not lost.
        try:
            with safe_resume_loads(self.state.best_model_checkpoint):
                return super()._load_best_model()
        except UnsafeCheckpointError as error:
            logger.warning(
                f"`load_best_model_at_end`: the best model was not loaded, and the model keeps the weights it has "
                f"(the last step's, unless the refused file was read after the model's weights). {error}"
            )

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # The plan has told the user what differs; here the state is restored (JSON, read on every process). The
        # history of settings changed on resume goes on the model card.
        state, changes = read_state(checkpoint), self._plan.changes
        self.settings_history = state.get("history", []) + (
            [{"step": self.state.global_step, "changes": changes}] if changes else []
        )
        self.load_cegppo_run_state(state.get("run_state", {}))
        if self.entropy_controller is not None and "controller" in state:
            self.entropy_controller.load_state_dict(state["controller"])
