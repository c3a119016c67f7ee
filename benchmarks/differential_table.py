"""The differential table of `tests/test_drop_in.py`, printed: per training script, the smallest share of tokens GRPO
clipped on each side over its off-policy steps, whether CE-GPPO at beta = 0 ended with GRPOTrainer's parameters and
logged values bit for bit, and whether beta = (0.5, 1) ended elsewhere.

Run from the repository root: ``python benchmarks/differential_table.py [--cases train kl_beta_model_by_path ...]``
(default: every case of `CONFIG_CASES`, LoRA, LoRA with KL at lr 1.0, and four steps in fp32 and fp64).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_drop_in as t  # noqa: E402
from trl import __version__ as trl_version  # noqa: E402

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer  # noqa: E402
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402


def extra_cases(model_dir: str) -> dict[str, dict]:
    cases = {"peft_lora": t.lora_case(learning_rate=0.2), "peft_lora_kl_lr_1": t.lora_kl_lr_1_case(model_dir)}
    for dtype in (torch.float32, torch.float64):
        cases[f"four_steps_{str(dtype).removeprefix('torch.')}"] = t.four_steps_case(dtype)
    return cases


def row(name: str, kwargs: dict, root: Path) -> str:
    grpo, cegppo = t.differential(root / name, **kwargs)
    if grpo.error is not None:
        return f"| {name} | GRPOTrainer raised {grpo.error.__name__} | | | |"
    steps = t.off_policy_clip_ratios(grpo, cegppo)
    low = min((lo for lo, _ in steps), default=float("nan"))
    high = min((hi for _, hi in steps), default=float("nan"))
    try:
        t.assert_same(grpo, cegppo, trains="lora" not in name)
        same = "yes"
    except AssertionError as error:
        same = f"NO ({str(error).splitlines()[0][:60]})"
    moved = t.run_script(CEGPPOTrainer, CEGPPOConfig, root / name / "betas", **{**kwargs, **t.BETAS})
    differs = any(not torch.equal(grpo.params[n], moved.params[n]) for n in grpo.params)
    return f"| {name} | {len(steps)} | {low:.3f} / {high:.3f} | {same} | {'yes' if differs else 'NO'} |"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=None, help="names of cases (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="cegppo_differential_"))
    tokenizer = build_char_tokenizer()
    model_dir = root / "model"
    build_tiny_llama(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    cases = {
        name: {k: str(model_dir) if v == "MODEL_DIR" else v for k, v in kwargs.items()}
        for name, kwargs in t.CONFIG_CASES.items()
    }
    cases.update(extra_cases(str(model_dir)))
    names = args.cases or list(cases)
    print(f"# differential table: {datetime.date.today()} | {platform.machine()} | torch {torch.__version__} | "
          f"trl {trl_version} | CE-GPPO at beta = 0 and (0.5, 1) against GRPOTrainer")  # fmt: skip
    print("| case | off-policy steps | min clip share low / high | bit-identical at beta = 0 | differs at (0.5, 1) |")
    print("|---|---|---|---|---|")
    for name in names:
        print(row(name, cases[name], root), flush=True)


if __name__ == "__main__":
    main()
