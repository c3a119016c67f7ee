"""Train a tiny CE-GPPO model for four optimizer steps and dump parameters, logs and controller state per loss type.

Run as one process, under `torchrun --nproc_per_node 2` (gloo, CPU, DDP), as two torchrun "nodes" on 127.0.0.1, and
under `accelerate launch` with a DeepSpeed ZeRO-2/3 config: every launch sees the same global batch, because
completions come from a deterministic `rollout_func` keyed on the global position of each sample. `dapo` normalises
by the rollout batch's token count; `grpo` by its sequence count. With 2 processes the constant group (dropped by
dynamic sampling) sits on one process and the informative one on the other, so a per-process count would weigh them
differently from one process. The job has every part that crosses processes: the SFT term, dynamic sampling, a β
schedule and the entropy controller, with two optimizer steps per rollout batch (steps 2 and 4 are off-policy).

Usage: `mp_train.py OUT_DIR [SPEC_JSON]`; SPEC_JSON keys (all optional): `loss_types` (list), `save_steps` (int:
save checkpoints), `save_total_limit`, `resume` (a checkpoint folder, or `last`), `bf16` (default False), `zero3`
(record how the parameters are partitioned), `max_steps`, `num_iterations` (default 2), `pid_files` (each process
writes `OUT_DIR/pid_<rank>` first), `slow_save` (`{"rank": k, "step": s}`: process k stalls before writing its RNG
state into checkpoint-s, after creating `OUT_DIR/slow_save_started`, as a slow or dying process would),
`load_best_model_at_end` (bool), `claim_best_step` (k: the trainer state names `checkpoint-k` as the best model from
the first step on, so every checkpoint's `trainer_state.json` says so), `dataset_repeats` (the 4 prompts this many times, default 4), `steps_per_generation` (default
`gradient_accumulation_steps`, 1), `on_save_writes` (a callback appends a line to
each checkpoint's `notes.txt` in `on_save`, as an EMA or a README callback does), `kill_after_save` (k: every
process SIGKILLs itself once checkpoint-k is committed, as a preemption right after a checkpoint would). Used by
tests/test_multiprocess.py,
tests/test_deepspeed.py and tests/helpers/chaos.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback

from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

# the research trainer: the entropy controller's state is part of what every resume must restore
from cegppo_trl.research.trainer import ResearchCEGPPOConfig as CEGPPOConfig
from cegppo_trl.research.trainer import ResearchCEGPPOTrainer as CEGPPOTrainer

GLOBAL_BATCH = 8
NUM_GENERATIONS = 4
COMPLETION_LEN = 6
MAX_STEPS = 4
LOSS_TYPES = ("dapo", "grpo")


def main(out_dir: str, spec: dict) -> None:
    torch.set_num_threads(1)
    if spec.get("pid_files"):  # what a scheduler knows of its job: every process, whoever started it
        with open(os.path.join(out_dir, f"pid_{os.environ.get('RANK', '0')}"), "w") as f:
            f.write(str(os.getpid()))
    for loss_type in spec.get("loss_types", LOSS_TYPES):
        train(out_dir, loss_type, spec)
    # Tear the gloo group down before interpreter exit: left to atexit, one rank can abort with "terminate called
    # without an active exception" while the other still holds the connection.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    # Under DeepSpeed a rank still aborted at interpreter exit ("terminate called without an active exception",
    # 1 of about 12 launches, after every output was written): leave without running the C++ destructors, so the
    # exit code reports the training, which is what the tests check.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(out_dir: str, loss_type: str, spec: dict) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = build_char_tokenizer()
    # Built before the config: under an active ZeRO-3 config (`zero3_init_flag`) a model built from a config is
    # initialised partition by partition, with other random values than the other launches'.
    model = build_tiny_llama(tokenizer, seed=0)
    vocab = len(tokenizer)

    def rollout_func(prompts, trainer):
        # Deterministic "sampling": completion tokens depend only on the sample's global position in the batch.
        rank, local = trainer.accelerator.process_index, len(prompts)
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = []
        for i in range(local):
            g = torch.Generator().manual_seed(1000 * trainer.state.global_step + rank * local + i)
            length = int(torch.randint(3, COMPLETION_LEN + 1, (1,), generator=g))
            completion_ids.append(torch.randint(4, vocab, (length,), generator=g).tolist())
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(c) for c in completion_ids],
        }

    def reward(prompts, completions, **kwargs):
        # Groups of prompts starting with "0" are constant (dropped by dynamic sampling).
        return [
            1.0 if p.startswith("0") else float(sum(ch.isdigit() for ch in c)) for p, c in zip(prompts, completions)
        ]

    dataset = Dataset.from_dict({"prompt": ["0+1=", "2+3=", "4+5=", "0+7="] * spec.get("dataset_repeats", 4)})
    save_steps = spec.get("save_steps")
    load_best = spec.get("load_best_model_at_end", False)
    args = CEGPPOConfig(
        output_dir=os.path.join(out_dir, loss_type),
        loss_type=loss_type,
        use_cpu=True,
        # fp32: TrainingArguments' bf16=True default would autocast the CPU forward to bf16 (and DeepSpeed's
        # `bf16: auto` would follow it), so the launches would be compared through bf16 rounding.
        bf16=spec.get("bf16", False),
        report_to="none",
        save_strategy="no" if save_steps is None else "steps",
        save_steps=save_steps or 500,
        save_total_limit=spec.get("save_total_limit"),
        save_on_each_node=spec.get("save_on_each_node", False),
        per_device_train_batch_size=GLOBAL_BATCH // world,
        num_generations=NUM_GENERATIONS,
        max_completion_length=COMPLETION_LEN,
        num_iterations=spec.get("num_iterations", 2),
        steps_per_generation=spec.get("steps_per_generation"),
        max_steps=spec.get("max_steps", MAX_STEPS),
        learning_rate=5e-2,
        logging_steps=1,
        seed=0,
        delta=10.0,
        sft_loss_coef=0.1,
        dynamic_sampling=True,
        gppo_beta1_schedule="linear:0.5->0.25",
        entropy_controller={"target_low": 0, "target_high": 1, "damping": 0, "raise_beta1": True},  # beta1 both ways
        disable_tqdm=True,
        # transformers wants the eval strategy to match the save strategy: evaluate at each save, or never (the
        # trainer state resumed from a checkpoint can still name a best checkpoint).
        load_best_model_at_end=load_best,
        eval_strategy="steps" if load_best and save_steps else "no",
        eval_steps=save_steps or 500,
    )
    trainer = CEGPPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        rollout_func=rollout_func, eval_dataset=dataset if args.eval_strategy != "no" else None,
    )  # fmt: skip
    if spec.get("claim_best_step") is not None:
        trainer.add_callback(ClaimBest(os.path.join(args.output_dir, f"checkpoint-{spec['claim_best_step']}")))
    if spec.get("on_save_writes"):
        trainer.add_callback(WritesIntoCheckpoints())
    if spec.get("kill_after_save") is not None:
        trainer.add_callback(KilledAfterSave(spec["kill_after_save"]))
    slow = spec.get("slow_save")
    if slow and trainer.accelerator.process_index == slow["rank"]:
        save_rng_state = trainer._save_rng_state

        def stalled(output_dir):
            if trainer.state.global_step == slow["step"]:
                open(os.path.join(out_dir, "slow_save_started"), "w").close()
                time.sleep(600)
            save_rng_state(output_dir)

        trainer._save_rng_state = stalled
    resume = spec.get("resume")
    trainer.train(resume_from_checkpoint=resume)  # "last": the newest committed checkpoint, or a fresh start
    if spec.get("zero3"):
        # Each rank holds a shard of every parameter (ZeRO-3), not a replica: the module's tensors are empty.
        params = list(trainer.model.parameters())
        shards = [(p.numel(), p.ds_numel, p.ds_tensor.numel()) for p in params if hasattr(p, "ds_tensor")]
        rank = trainer.accelerator.process_index
        with open(os.path.join(out_dir, f"partition_{loss_type}_rank{rank}.json"), "w") as f:
            json.dump({"params": len(params), "shards": shards}, f)
    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)  # collective under ZeRO-3: gathers shards
    if trainer.accelerator.is_main_process:
        params = {k: v.detach().cpu().float() for k, v in state.items()}
        torch.save(params, os.path.join(out_dir, f"params_{loss_type}.pt"))
        with open(os.path.join(out_dir, f"log_history_{loss_type}.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
        if trainer.entropy_controller is not None:
            with open(os.path.join(out_dir, f"controller_{loss_type}.json"), "w") as f:
                json.dump(trainer.entropy_controller.state_dict(), f)
        plugin = trainer.accelerator.state.deepspeed_plugin
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper, if any
        with open(os.path.join(out_dir, f"engine_{loss_type}.json"), "w") as f:
            json.dump({
                "distributed_type": str(trainer.accelerator.distributed_type),
                "num_processes": trainer.accelerator.num_processes,
                "zero_stage": None if plugin is None else plugin.zero_stage,
                "optimizer": type(optimizer).__name__,
            }, f)  # fmt: skip
    trainer.accelerator.wait_for_everyone()


class ClaimBest(TrainerCallback):
    """Names `folder` as the best model in the trainer state (what a metric that peaked there would do)."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_step_end(self, args, state, control, **kwargs):
        state.best_model_checkpoint = self.folder
        state.best_global_step = int(self.folder.rsplit("-", 1)[1])
        state.best_metric = -1e9


class WritesIntoCheckpoints(TrainerCallback):
    """Appends a line to every checkpoint it sees saved, after transformers (and the commit) wrote it."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            with open(os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "notes.txt"), "a") as f:
                f.write(f"saved at step {state.global_step}\n")


class KilledAfterSave(TrainerCallback):
    """SIGKILLs this process once checkpoint-`step` is committed (its marker written by the main process), as the
    next step begins: the commit comes after every callback's `on_save`, so an `on_save` that waited for it would
    wait forever."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            from cegppo_trl.checkpoints import COMMIT_FILE

            marker = os.path.join(args.output_dir, f"checkpoint-{self.step}", COMMIT_FILE)
            while not os.path.exists(marker):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
