"""How exactly a resumed run continues the interrupted one: `CEGPPOTrainer` and TRL's `GRPOTrainer` side by side.

For each trainer, one uninterrupted run saves a checkpoint at every rollout-batch end (every 2 steps); runs resumed from
a checkpoint in the first epoch and from one in the second epoch are compared with it step by step. `CEGPPOTrainer`
puts TRL's repeat sampler's generator where the uninterrupted run had it, so its resume in the second epoch draws the
uninterrupted order; `GRPOTrainer`'s draws the first epoch's again. Prints
the largest absolute difference of the logged loss and entropy after the resume (0 means bit-exact on this machine).

The tiny Llama of `cegppo_trl.demos.tiny`, 32 prompts, 2 prompts per rollout batch, num_iterations=2: an epoch is
32 optimizer steps. Run: ``python benchmarks/resume_exactness.py`` (about a minute on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer  # noqa: E402
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402


def count_ones_reward(completions, **kwargs):
    return [float(c.count("1")) for c in completions]


def run(trainer_cls, config_cls, output_dir: str, max_steps: int, resume: str | None = None) -> dict[int, dict]:
    tokenizer = build_char_tokenizer()
    extra = dict(gppo_beta1=0.5, gppo_beta2=1.0) if config_cls is CEGPPOConfig else dict(loss_type="dapo")
    args = config_cls(
        output_dir=output_dir, use_cpu=True, report_to="none", save_strategy="steps", save_steps=2,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=8, learning_rate=1e-2,
        logging_steps=1, seed=0, disable_tqdm=True, num_iterations=2, max_steps=max_steps, **extra,
    )  # fmt: skip
    trainer = trainer_cls(
        model=build_tiny_llama(tokenizer, seed=0), reward_funcs=count_ones_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(32)]}), processing_class=tokenizer,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # the table only
    trainer.train(resume_from_checkpoint=resume)
    return {h["step"]: h for h in trainer.state.log_history if "loss" in h}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=38, help="run length (an epoch is 32 steps)")
    parser.add_argument("--resume-at", type=int, nargs="+", default=[4, 34], help="checkpoints to resume from (even)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    logging.getLogger("cegppo_trl").setLevel(logging.ERROR)
    print(f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}")  # fmt: skip
    print("| trainer | resumed at step | max abs loss diff after it | max abs entropy diff after it |")
    print("|---|---|---|---|")
    for name, trainer_cls, config_cls in (("CEGPPOTrainer", CEGPPOTrainer, CEGPPOConfig),
                                          ("GRPOTrainer (dapo)", GRPOTrainer, GRPOConfig)):  # fmt: skip
        with tempfile.TemporaryDirectory() as directory:
            full = run(trainer_cls, config_cls, directory, args.steps)
            for step in args.resume_at:
                resumed = run(  # its own output_dir: its checkpoints must not replace the full run's
                    trainer_cls,
                    config_cls,
                    f"{directory}/resumed-{step}",
                    args.steps,
                    f"{directory}/checkpoint-{step}",
                )
                after = [s for s in resumed if s > step]
                loss = max(abs(resumed[s]["loss"] - full[s]["loss"]) for s in after)
                entropy = max(abs(resumed[s]["entropy"] - full[s]["entropy"]) for s in after)
                print(f"| {name} | {step} | {loss:.2g} | {entropy:.2g} |")


if __name__ == "__main__":
    main()
