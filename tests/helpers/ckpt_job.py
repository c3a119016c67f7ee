"""One small off-policy job through either trainer, for the checkpoint tests that resume it
(tests/test_callback_commit.py, tests/test_grpo_continuation.py): in-process (`build`) or as its own process, one or
two (`python ckpt_job.py SPEC` under `torchrun`; the main process writes the final parameters to `SPEC["params"]`).

The job: a tiny seeded Llama, 32 prompts, 2 prompts (8 completions) an optimizer step, two optimizer steps per rollout
batch (`steps_per_generation=2`: the second is off-policy), a checkpoint every rollout batch (`save_steps=2`), a
constant learning rate high enough that the second step of a batch clips tokens: 16 steps an epoch, so every run here
stays in epoch 1. SPEC keys: `trainer` ("grpo" or "cegppo"), `output_dir`, `max_steps`, `resume` (None, True or a
path), `betas` (CE-GPPO's beta1, beta2; default 0, 0), `callback` (a name in `CALLBACKS`), `lora`, and any config
field (`save_total_limit`, `enable_jit_checkpoint`, ...).
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

JOB = dict(per_device_train_batch_size=8, num_generations=4, steps_per_generation=2, gradient_accumulation_steps=1,
           max_completion_length=6, learning_rate=0.1, lr_scheduler_type="constant", save_strategy="steps",
           save_steps=2, use_cpu=True, bf16=False, report_to="none", logging_steps=1, seed=0,
           disable_tqdm=True)  # fmt: skip


def count_ones(completions, **kwargs):  # spread in every group
    return [float(c.count("1")) for c in completions]


def _folder(args, state) -> str:
    return os.path.join(args.output_dir, f"checkpoint-{state.global_step}")


class PeftSavingCallback(TrainerCallback):
    """The widely copied snippet (TRL's SFTTrainer docs once carried it; axolotl keeps a version)."""

    def on_save(self, args, state, control, **kwargs):
        checkpoint_path = _folder(args, state)
        kwargs["model"].save_pretrained(checkpoint_path)
        if "pytorch_model.bin" in os.listdir(checkpoint_path):
            os.remove(os.path.join(checkpoint_path, "pytorch_model.bin"))


class AppendsToReadme(TrainerCallback):
    """Appends a line to the checkpoint's model card, on the main process only (as a rank-0 writer does)."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            with open(os.path.join(_folder(args, state), "README.md"), "a") as f:
                f.write(f"\nSaved at step {state.global_step}.\n")


class EmaWriter(TrainerCallback):
    """Keeps an exponential moving average of the weights, saved into each checkpoint with a note on its card."""

    def __init__(self):
        self.ema = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.ema = weights if self.ema is None else {k: 0.9 * self.ema[k] + 0.1 * v for k, v in weights.items()}

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            torch.save(self.ema, os.path.join(_folder(args, state), "ema.pt"))
            with open(os.path.join(_folder(args, state), "README.md"), "a") as f:
                f.write("\nAn EMA of the weights (decay 0.9) is in `ema.pt`.\n")


class KilledWhileWriting(TrainerCallback):
    """At step 4's save, writes half of a file into the checkpoint and is killed (SIGKILL): a preemption that lands
    after transformers' files and before the commit."""

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 4:
            with open(os.path.join(_folder(args, state), "README.md"), "a") as f:
                f.write("half a l")
                f.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class SigtermAtStep4(TrainerCallback):
    """Sends the process SIGTERM at the end of step 4, as a scheduler does, and waits past transformers' 3 s grace
    (`enable_jit_checkpoint`), so its checkpoint request is raised before that step's end is agreed."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(4.5)


class SlowSteps(TrainerCallback):
    """Sleeps 0.25 s after each step: a job slow enough for a test to signal it while it trains."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.25)


CALLBACKS = {"peft": PeftSavingCallback, "readme": AppendsToReadme, "ema": EmaWriter, "kill": KilledWhileWriting,
             "sigterm": SigtermAtStep4, "slow": SlowSteps}  # fmt: skip


def build(spec: dict):
    """The job's trainer for `spec` (see the module docstring), callbacks added after construction."""
    from trl import GRPOConfig, GRPOTrainer

    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    spec = dict(spec)
    trainer_name, output_dir, callback = spec.pop("trainer"), spec.pop("output_dir"), spec.pop("callback", None)
    betas, lora = spec.pop("betas", (0.0, 0.0)), spec.pop("lora", False)
    for key in ("resume", "params", "pid_dir"):
        spec.pop(key, None)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = {**JOB, "per_device_train_batch_size": JOB["per_device_train_batch_size"] // world, **spec}
    if trainer_name == "cegppo":
        args = CEGPPOConfig(output_dir=str(output_dir), gppo_beta1=betas[0], gppo_beta2=betas[1], **config)
    else:
        args = GRPOConfig(output_dir=str(output_dir), **config)
    tokenizer = build_char_tokenizer()
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=4, target_modules="all-linear")
    trainer = (CEGPPOTrainer if trainer_name == "cegppo" else GRPOTrainer)(
        model=build_tiny_llama(tokenizer, seed=0), reward_funcs=count_ones, args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(32)]}),
        processing_class=tokenizer, peft_config=peft,
    )  # fmt: skip
    if callback is not None:
        trainer.add_callback(CALLBACKS[callback]())
    return trainer


def params(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def torchrun(spec: dict, processes: int = 2, timeout: float = 600, wait: bool = True):
    """This job as `processes` real CPU processes under torchrun (gloo); it must exit 0. Returns the finished process
    (`wait=False`: the running launcher, its output in `<output_dir>.log`)."""
    import subprocess
    from pathlib import Path

    from helpers.mp_launch import TORCHRUN, free_port

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")]), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "ACCELERATE_USE_CPU": "1"}  # fmt: skip
    cmd = [str(TORCHRUN), "--nproc_per_node", str(processes), "--master_port", str(free_port()), __file__,
           json.dumps(spec, default=str)]  # fmt: skip
    if not wait:
        with open(f"{spec['output_dir']}.log", "w") as log:
            return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def main(spec: dict) -> None:
    torch.set_num_threads(1)
    trainer = build(spec)
    if spec.get("pid_dir"):  # for a test that signals this process
        with open(os.path.join(spec["pid_dir"], f"pid_{trainer.args.process_index}"), "w") as f:
            f.write(str(os.getpid()))
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    if trainer.accelerator.is_main_process and spec.get("params"):
        torch.save(params(trainer), spec["params"])
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
