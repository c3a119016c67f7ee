# /// script
# dependencies = ["cegppo-trl[math]", "peft"]
# ///
"""CE-GPPO training script for `accelerate launch` (the counterpart of TRL's `trl/scripts/grpo.py`).

One GPU:
    python examples/cegppo.py --config examples/recipes/gsm8k_qwen2.5_0.5b_lora.yaml

Eight GPUs (DDP; the paper recipes want DeepSpeed ZeRO-2/3 or FSDP2 instead, see accelerate_configs/README.md):
    accelerate launch --config_file accelerate_configs/multi_gpu.yaml examples/cegppo.py \
        --config examples/recipes/cegppo_r1_distill_1.5b.yaml

Every field of CEGPPOConfig, trl.ModelConfig and the script arguments can be set in the YAML or as a flag; flags
override the YAML (`--gppo_beta1 0.75 --use_peft --lora_r 32`). `cegppo train ...` is the same script.
"""

from cegppo_trl.scripts import main, make_parser

if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    main(script_args, training_args, model_args)
