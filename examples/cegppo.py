# /// script
# dependencies = ["cegppo-trl"]
# ///
"""CE-GPPO training script for `accelerate launch` (the counterpart of TRL's `trl/scripts/grpo.py`).

One GPU:
    python examples/cegppo.py --config examples/recipes/gsm8k_qwen2.5_0.5b_lora.yaml

Eight GPUs (DDP; the paper recipes want DeepSpeed ZeRO-2/3 or FSDP2 instead, see accelerate_configs/README.md):
    accelerate launch --config_file accelerate_configs/multi_gpu.yaml examples/cegppo.py \
        --config examples/recipes/cegppo_r1_distill_1.5b.yaml

CPU only (a smoke run; two processes need torchrun, `accelerate launch --cpu --num_processes 2` starts one):
    python examples/cegppo.py --config examples/recipes/cpu_smoke.yaml --model_name_or_path MODEL_DIR \
        --dataset_name data.jsonl
    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 examples/cegppo.py --config examples/recipes/cpu_smoke.yaml ...

Every field of CEGPPOConfig, trl.ModelConfig and the script arguments can be set in the YAML or as a flag; flags
override the YAML (`--gppo_beta1 0.75 --use_peft --lora_r 32`). `cegppo train ...` is the same script.
"""

from cegppo_trl.scripts import main, parse_args

if __name__ == "__main__":
    main(*parse_args(prog="examples/cegppo.py"))
