"""Which distributed engine a launch asked for, which one accelerate will run, and a refusal when they differ.

accelerate falls back to plain DDP without a word in three launches that look right:

- DeepSpeed asked (`accelerate launch` with a DeepSpeed config sets `ACCELERATE_USE_DEEPSPEED=true`; or
  `TrainingArguments.deepspeed`) while `ACCELERATE_USE_CPU` is set: accelerate selects DeepSpeed only when not in CPU
  mode, so each process trains a full replica with torch's AdamW.
- FSDP asked (`ACCELERATE_USE_FSDP=true`, or `TrainingArguments.fsdp`) on CPU: accelerate 1.15 enables FSDP only for
  GPU-like devices, so the model is not sharded.
- `ACCELERATE_USE_FSDP` spelled other than `true` (`=1`): accelerate compares it with "true" and transformers does
  not read it. `ACCELERATE_USE_DEEPSPEED=1` is not such a case: `TrainingArguments` parses it as a boolean
  (transformers' `strtobool`: 1/true/yes/y/on/t) and builds a `DeepSpeedPlugin`, and the `Accelerator` given that
  plugin sets the variable to `true` itself, so DeepSpeed runs.

XLA FSDP (`fsdp_config={"xla": True}`) is transformers' own wrapper (torch_xla), not accelerate's FSDP: nothing here
applies to it.

`check_distributed_engine` predicts accelerate's choice from the same inputs accelerate reads (the environment, the
training arguments, the process group `TrainingArguments.device` sets up) before any model is loaded, and refuses a
mismatch naming what was asked, what would run, and a launch line that works. It also refuses DeepSpeed on CPU with
`bf16=True`: DeepSpeed's `bf16: auto` follows `TrainingArguments.bf16` (True by default in TRL's configs) and would
train bf16 weights, which is not what a CPU rehearsal of an fp32-comparable run wants and is slow on CPU.

`cpu_rehearsal_config` writes the CPU copy of a shipped accelerate config used to rehearse a GPU job on a CPU box.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# accelerate's and transformers' spelling of a true flag (`accelerate.utils.str_to_bool`, `transformers.utils.strtobool`).
_TRUE = ("1", "true", "yes", "y", "on", "t")
# Distributed types accelerate enables FSDP for (`AcceleratorState.__init__`): GPU-like devices only.
_FSDP_CAPABLE = (
    "MULTI_GPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_NPU",
    "MULTI_XPU",
    "MULTI_HPU",
    "MULTI_NEURON",
)

# Launch lines the refusals name; they work after a plain `pip install` (RECIPE: a path or a shipped recipe's name).
CPU_DEEPSPEED_LAUNCH_LINE = (
    "python -m cegppo_trl.distributed deepspeed_zero3 cpu_zero3.yaml\n"
    "    DS_ACCELERATOR=cpu accelerate launch --config_file cpu_zero3.yaml -m cegppo_trl.cli train --config RECIPE "
    "--use_cpu true --bf16 false"
)
CPU_DDP_LAUNCH_LINE = "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m cegppo_trl.cli train --config RECIPE ..."


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in _TRUE


def _asked(env: Mapping[str, str], args: Any) -> tuple[str | None, str]:
    """The engine the launch asked for (`"deepspeed"`, `"fsdp"` or None) and where it was asked."""
    if getattr(args, "deepspeed", None):
        return "deepspeed", f"`deepspeed={args.deepspeed!r}` in the training arguments"
    # `TrainingArguments` reads the variable with transformers' `strtobool` (the words of `_TRUE`; it raises on any
    # other non-false value) and builds a `DeepSpeedPlugin`, which the `Accelerator` runs unless in CPU mode.
    if _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        value = env["ACCELERATE_USE_DEEPSPEED"]
        return "deepspeed", f"ACCELERATE_USE_DEEPSPEED={value}, from `accelerate launch` with a DeepSpeed config"
    if getattr(args, "fsdp", None) and (getattr(args, "fsdp_config", None) or {}).get("xla"):
        return None, ""  # transformers' XLA FSDP (torch_xla), run by the Trainer itself: not accelerate's choice
    if _flag(env, "ACCELERATE_USE_FSDP"):
        return (
            "fsdp",
            f"ACCELERATE_USE_FSDP={env['ACCELERATE_USE_FSDP']}, from `accelerate launch` with an FSDP config",
        )
    if getattr(args, "fsdp", None):
        return "fsdp", f"`fsdp={args.fsdp!r}` in the training arguments"
    return None, ""


def check_distributed_engine(
    args: Any,
    env: Mapping[str, str] | None = None,
    distributed_type: str | None = None,
    device_type: str | None = None,
) -> str | None:
    """Refuse a launch whose distributed engine would not be the one it asked for; return the engine that runs.

    Args:
        args: the `TrainingArguments` (a `CEGPPOConfig`); `deepspeed`, `fsdp` and `bf16` are read.
        env: the environment accelerate reads; `os.environ` when None.
        distributed_type: the process group's `DistributedType` name (`"MULTI_CPU"`, `"MULTI_GPU"`, ...); read from
            `args.distributed_state` (set up by `args.device`) when None.
        device_type: the torch device type of this process; from `args.device` when None.

    Returns:
        `"deepspeed"`, `"fsdp"` or None (DDP, a single process, or transformers' own XLA FSDP).

    Raises:
        RuntimeError: DeepSpeed or FSDP was asked for and would not run, or DeepSpeed would run on CPU with
            `bf16=True`.
    """
    env = os.environ if env is None else env
    asked, source = _asked(env, args)
    if asked is None:
        return None
    if distributed_type is None or device_type is None:
        device = args.device  # sets up accelerate's process group, as TrainingArguments does before training
        device_type = device.type if device_type is None else device_type
        if distributed_type is None:
            state = args.distributed_state
            distributed_type = getattr(state.distributed_type, "name", str(state.distributed_type))
    cpu_mode = _flag(env, "ACCELERATE_USE_CPU")

    if asked == "deepspeed":
        # accelerate: `os.environ["ACCELERATE_USE_DEEPSPEED"] == "true" and not cpu`; the `DeepSpeedPlugin` that
        # transformers builds (from `deepspeed` or the variable read as a boolean) makes the Accelerator set it.
        if cpu_mode:
            raise RuntimeError(
                f"DeepSpeed was asked for ({source}) but would not run: ACCELERATE_USE_CPU="
                f"{env['ACCELERATE_USE_CPU']} makes accelerate skip DeepSpeed, so this launch would train plain DDP "
                "(a full model and torch AdamW state on every process) without a word. To rehearse DeepSpeed on CPU, "
                "unset ACCELERATE_USE_CPU and launch a CPU copy of the accelerate config (`use_cpu: true`):\n    "
                f"{CPU_DEEPSPEED_LAUNCH_LINE}\nFor plain DDP on CPU drop the DeepSpeed config:\n"
                f"    {CPU_DDP_LAUNCH_LINE}"
            )
        if device_type == "cpu" and getattr(args, "bf16", False):
            raise RuntimeError(
                f"DeepSpeed on CPU ({source}) with `bf16=True`: DeepSpeed's `bf16: auto` follows `bf16` (True by "
                "default, as in TRL) and would train bf16 weights on CPU, a different run from the fp32 one a CPU "
                f"rehearsal compares with. Set `bf16: false` in the recipe (or pass `--bf16 false`):\n    "
                f"{CPU_DEEPSPEED_LAUNCH_LINE}"
            )
        return "deepspeed"

    # FSDP. accelerate enables it only for GPU-like distributed types (`ACCELERATE_USE_FSDP == "true"` or a plugin).
    spelled_true = env.get("ACCELERATE_USE_FSDP", "").strip().lower() == "true" or getattr(args, "fsdp", None)
    if distributed_type not in _FSDP_CAPABLE:
        on_cpu = device_type == "cpu"
        why = (
            "accelerate (1.15) enables FSDP only on GPUs and other accelerators, not on CPU"
            if on_cpu
            else "accelerate enables FSDP only for a multi-device process group"
        )
        fix = (
            "accelerate cannot shard on CPU; DeepSpeed ZeRO-3 is the way to rehearse a sharded job there:\n    "
            + CPU_DEEPSPEED_LAUNCH_LINE
            if on_cpu
            else 'Launch on the GPUs: accelerate launch --config_file "$(cegppo config-path fsdp2)" '
            "-m cegppo_trl.cli train --config RECIPE"
        )
        raise RuntimeError(
            f"FSDP was asked for ({source}) but would not run: the process group is {distributed_type} and {why}, "
            f"so every process would train a full, unsharded replica (plain DDP) without a word. {fix}"
        )
    if not spelled_true:
        raise RuntimeError(
            f"FSDP was asked for ({source}) but would not run: accelerate only reads ACCELERATE_USE_FSDP=true (the "
            'exact word; transformers does not read it). Launch with `accelerate launch --config_file "$(cegppo '
            'config-path fsdp2)" ...`, which sets it.'
        )
    return "fsdp"


def check_launch(training_args: Any) -> None:
    """Fail fast when a launcher started several processes but accelerate set up a single-process run in each.

    Each copy would train on its own and write to the same `output_dir`. Two launches do this without GPUs:
    `accelerate launch --multi_gpu --num_processes N` (WORLD_SIZE=N, yet accelerate finds no GPU and falls back to one
    process) and `accelerate launch --cpu --num_processes N` (starts one process only).
    """
    _ = training_args.device  # sets up accelerate's distributed state
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size > 1 and training_args.world_size == 1:
        raise RuntimeError(
            f"The launcher started {world_size} processes (WORLD_SIZE={world_size}, "
            f"LOCAL_RANK={os.environ.get('LOCAL_RANK')}) but accelerate set up a single-process run in each: they "
            "would train independently and overwrite each other's `output_dir`. On a machine without GPUs, launch "
            f"several CPU processes with:\n    {CPU_DDP_LAUNCH_LINE}"
        )
    cpu_flag = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    if cpu_flag and "MASTER_ADDR" in os.environ and "WORLD_SIZE" not in os.environ and training_args.world_size == 1:
        # `accelerate launch --cpu --num_processes N` (N > 1) sets MASTER_ADDR but starts one plain process.
        raise RuntimeError(
            "`accelerate launch --cpu --num_processes N` starts only one process (MASTER_ADDR is set, WORLD_SIZE is "
            "not). For one CPU process drop `--num_processes`; for several use:\n    " + CPU_DDP_LAUNCH_LINE
        )


def cpu_rehearsal_config(shipped: str | os.PathLike, out: str | os.PathLike, num_processes: int = 2) -> Path:
    """Write a copy of an accelerate config that runs on a CPU box: `use_cpu`, `num_processes`, fp32.

    Everything else comes from `shipped`. A ZeRO-3 config also gets `stage3_param_persistence_threshold: 0`, through
    a DeepSpeed JSON written beside `out` from the shipped `deepspeed_config`: DeepSpeed keeps parameters below the
    threshold (10 x hidden size by default) whole on every rank, which for a tiny rehearsal model is nearly all of
    them, so nothing would be partitioned. The GPU configs need no such change.

    Args:
        shipped: the accelerate YAML to rehearse: a path, or a shipped config's name (`deepspeed_zero3`; a missing
            `accelerate_configs/deepspeed_zero3.yaml` is the shipped one of that name, see
            `resources.resolve_accelerate_config`).
        out: where to write the CPU copy.
        num_processes: total processes (over all machines) on the CPU box.

    Returns:
        The path written.
    """
    import yaml

    from .resources import resolve_accelerate_config

    config = yaml.safe_load(Path(resolve_accelerate_config(os.fspath(shipped))).read_text())
    config.update(use_cpu=True, num_processes=num_processes, mixed_precision="no")
    if config.get("num_machines", 1) > 1:
        config["main_process_ip"] = "127.0.0.1"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ds = config.get("deepspeed_config") or {}
    if ds.get("zero_stage") == 3:
        zero = {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": ds.get("zero3_save_16bit_model", False),
            "offload_optimizer": {"device": ds.get("offload_optimizer_device", "none")},
            "offload_param": {"device": ds.get("offload_param_device", "none")},
        }
        ds_json = out.with_suffix(".deepspeed.json")
        ds_json.write_text(json.dumps({
            "zero_optimization": zero,
            "bf16": {"enabled": "auto"},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
        }, indent=2) + "\n")  # fmt: skip
        # With a DeepSpeed file, accelerate refuses the keys it would otherwise translate into one.
        config["deepspeed_config"] = {
            "deepspeed_config_file": str(ds_json.resolve()),
            "deepspeed_multinode_launcher": ds.get("deepspeed_multinode_launcher", "standard"),
            "zero3_init_flag": ds.get("zero3_init_flag", False),
        }
        del config["mixed_precision"]
    out.write_text(yaml.safe_dump(config, sort_keys=True))
    return out


def _main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m cegppo_trl.distributed",
        description="Write the CPU copy of an accelerate config (use_cpu, NUM_PROCESSES processes, fp32; for ZeRO-3 "
        "every parameter partitioned), to rehearse a GPU job on a CPU box with a tiny model, then launch it:\n  "
        + CPU_DEEPSPEED_LAUNCH_LINE.replace("\n    ", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "shipped",
        help="accelerate config to rehearse: a shipped config's name (deepspeed_zero3, two_nodes, ...) or a path",
    )
    parser.add_argument("out", help="where to write the CPU copy")
    parser.add_argument("--num_processes", type=int, default=2, help="total CPU processes (default 2)")
    ns = parser.parse_args(argv)
    try:
        print(cpu_rehearsal_config(ns.shipped, ns.out, ns.num_processes))
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    _main()
