"""The CPU copy of an accelerate config, to rehearse a GPU launch on a CPU box with a tiny model (the multi-process
tests run DeepSpeed ZeRO-2/3 and two nodes on loopback through it). From a checkout:

    python tests/helpers/cpu_rehearsal.py deepspeed_zero3 cpu_zero3.yaml
    DS_ACCELERATOR=cpu accelerate launch --config_file cpu_zero3.yaml -m cegppo_trl.cli train --config RECIPE \
        --use_cpu true --bf16 false

Plain DDP on CPU needs no config: `ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m cegppo_trl.cli train ...`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cegppo_trl.resources import resolve_accelerate_config

CPU_DDP_LAUNCH_LINE = "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m cegppo_trl.cli train --config RECIPE ..."


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python tests/helpers/cpu_rehearsal.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "shipped", help="a shipped accelerate config's name (deepspeed_zero3, two_nodes, ...) or a path"
    )
    parser.add_argument("out", help="where to write the CPU copy")
    parser.add_argument("--num_processes", type=int, default=2, help="total CPU processes (default 2)")
    ns = parser.parse_args(argv)
    try:
        print(cpu_rehearsal_config(ns.shipped, ns.out, ns.num_processes))
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
