"""Scale-out on CPU: DeepSpeed ZeRO-2/3 and two nodes train what DDP trains.

The parity tests launch tests/helpers/mp_train.py's job (4 steps at lr 5e-2, SFT term, dynamic sampling, a β schedule
and the entropy controller; steps 2 and 4 off-policy) from the shipped accelerate configs, made to run here by
`tests/helpers/cpu_rehearsal.py` (`use_cpu`, 2 processes, fp32), and compare with 2-process DDP
(`ddp_two_process_run`, tests/conftest.py). Measured on a 2-core shared CPU (2026-12-01), the largest parameter
difference from DDP is 6.5e-6 for ZeRO-2 and 1.1e-4 for ZeRO-3 (its gradients are reduce-scattered and its AdamW
steps flat partitions: fp32 rounding in another order, which the off-policy steps amplify), and at most 1e-5
relative on the `cegppo/*` metrics; tolerances in tests/helpers/mp_launch.py. Two nodes and the ZeRO-2/3 resumes are
bit-identical to their references; a ZeRO-2/3 checkpoint with a file replaced by a pickle that runs code is refused
before it runs (`cegppo_trl.safe_load`).

DeepSpeed's first run on a machine JIT-compiles its CPU communication op (gcc + ninja, 1-3 minutes) into
~/.cache/cegppo_trl/torch_extensions; later runs load it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.crafted import crafted_copy, hostile_bytes
from helpers.mp_launch import (
    ACCELERATE,
    LAYOUT_ATOL,
    METRIC_RTOL,
    REPO,
    TORCHRUN,
    ZERO2_ATOL,
    cpu_accelerate_config,
    free_port,
    launch,
    load,
    run,
    same_training,
    start,
    wait,
)
from torch.serialization import get_unsafe_globals_in_checkpoint

from cegppo_trl.safe_load import DEEPSPEED_CHECKPOINT_GLOBALS, TRUST_ENV

DAPO = {"loss_types": ["dapo"]}
# What a CPU rehearsal overrides in a GPU recipe (docs/usage.md): device and precision, no vLLM, short completions, a
# batch layout for 2 processes, 2 steps.
REHEARSAL_FLAGS = [
    "--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--use_vllm", "false",
    "--solution_column", "solution", "--max_completion_length", "16", "--per_device_train_batch_size", "4",
    "--gradient_accumulation_steps", "1", "--steps_per_generation", "2", "--max_steps", "2", "--logging_steps", "1",
    "--save_strategy", "no",
]  # fmt: skip


def _accelerate_launch(config, *extra: str) -> list[str]:
    return [str(ACCELERATE), "launch", "--config_file", str(config), "--main_process_port", str(free_port()), *extra]


def _engine(tmp) -> dict:
    return json.loads((tmp / "engine_dapo.json").read_text())


def _steps(logs: list[dict]) -> list[dict]:
    return [h for h in logs if "cegppo/beta1" in h]


# ----------------------------------------------------------------------------------------------------------------
# Parity with DDP (real multi-process jobs)
# ----------------------------------------------------------------------------------------------------------------
def _assert_crafted_resume_is_refused(config, checkpoint, tmp_path, member: str) -> None:
    """Resuming a copy of `checkpoint` whose `member` is a pickle that creates a file: refused, naming the file and
    the pickled call, and the file is not created."""
    marker = tmp_path / "PWNED"
    crafted = crafted_copy(checkpoint, tmp_path / "crafted" / "checkpoint-2", member, marker)
    proc = start(_accelerate_launch(config), tmp_path / "crafted_run", {**DAPO, "resume": str(crafted)})
    proc.wait(timeout=600)
    output = proc.log_path.read_text()
    assert proc.returncode != 0 and not marker.exists(), output[-3000:]
    for needle in ("Refusing to load ", member.rsplit("/", 1)[-1], "io.open", TRUST_ENV):
        assert needle in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.campaign
def test_zero2_trains_what_ddp_trains_and_resumes_exactly_and_safely(tmp_path, ddp_two_process_run):
    config = cpu_accelerate_config("deepspeed_zero2.yaml", tmp_path)
    zero2 = run(_accelerate_launch(config), tmp_path, {**DAPO, "save_steps": 2})
    assert _engine(tmp_path) == {
        "distributed_type": "DistributedType.DEEPSPEED", "num_processes": 2, "zero_stage": 2,
        "optimizer": "DeepSpeedZeroOptimizer",
    }  # fmt: skip
    same_training("zero2", ddp_two_process_run["dapo"], zero2["dapo"], atol=ZERO2_ATOL, metric_rtol=METRIC_RTOL)

    # What DeepSpeed pickled beyond tensors and containers: exactly the ZeRO-2 entries of cegppo_trl.safe_load's
    # allowlist (fp16's DynamicLossScaler aside).
    checkpoint = tmp_path / "dapo" / "checkpoint-2"
    files = sorted((checkpoint / "global_step2").iterdir())
    assert [f.name for f in files] == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]  # fmt: skip
    unsafe = {g for f in files for g in get_unsafe_globals_in_checkpoint(f)}
    assert unsafe == set(DEEPSPEED_CHECKPOINT_GLOBALS) - {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"}

    # The model states replaced by a pickle that runs code: refused, naming the file, and nothing runs.
    _assert_crafted_resume_is_refused(config, checkpoint, tmp_path, "global_step2/mp_rank_00_model_states.pt")

    # The genuine checkpoint resumes through the weights-only loads exactly as the uninterrupted run went on.
    resumed = run(_accelerate_launch(config), tmp_path / "resumed", {**DAPO, "resume": str(checkpoint)})
    for name, value in zero2["dapo"][0].items():
        assert torch.equal(resumed["dapo"][0][name], value), name
    after = [
        [{k: v for k, v in h.items() if k.startswith("cegppo/")} for h in _steps(r["dapo"][1])[2:]]
        for r in (zero2, resumed)
    ]
    assert len(after[0]) == 2 and after[0] == after[1]


@pytest.mark.slow
@pytest.mark.campaign
def test_zero2_best_model_named_by_a_resumed_checkpoint_runs_nothing_and_the_run_ends(tmp_path):
    # The reviewer's scenario: a genuine checkpoint-2 whose trainer_state.json names checkpoint-1 as
    # the best model, beside a decoy checkpoint-1 (a DeepSpeed `latest` file and a pickled model-states file that
    # creates a marker). `last` resumes checkpoint-2; with `load_best_model_at_end` transformers then hands
    # checkpoint-1 to DeepSpeed's engine at the end of training, after the resume: refused, once the run trained
    # to its end (its checkpoints, had it saved any, committed: a requeue resumes them).
    config = cpu_accelerate_config("deepspeed_zero2.yaml", tmp_path)
    run(_accelerate_launch(config), tmp_path, {**DAPO, "save_steps": 2, "max_steps": 2, "claim_best_step": 1})
    output_dir = tmp_path / "dapo"
    state = json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == str(output_dir / "checkpoint-1") and state["best_global_step"] == 1
    marker = tmp_path / "PWNED"
    decoy = output_dir / "checkpoint-1"
    (decoy / "global_step1").mkdir(parents=True)
    (decoy / "latest").write_text("global_step1")
    (decoy / "global_step1" / "mp_rank_00_model_states.pt").write_bytes(hostile_bytes(marker))
    proc = start(
        _accelerate_launch(config),
        tmp_path,
        {**DAPO, "resume": "last", "max_steps": 4, "load_best_model_at_end": True},
    )
    proc.wait(timeout=900)
    output = proc.log_path.read_text()
    assert not marker.exists(), "the best-model load ran code from the decoy checkpoint"
    assert proc.returncode != 0, output[-3000:]
    for needle in ("Refusing to load ", "checkpoint-1/global_step1/mp_rank_00_model_states.pt", "io.open", TRUST_ENV):
        assert needle in output, (needle, output[-3000:])
    assert "train_runtime" in output  # transformers' end-of-training metrics, logged before the best-model load


@pytest.mark.slow
@pytest.mark.campaign
def test_zero3_partitions_trains_what_ddp_trains_and_resumes_exactly(tmp_path, ddp_two_process_run):
    config = cpu_accelerate_config("deepspeed_zero3.yaml", tmp_path)
    full = run(_accelerate_launch(config), tmp_path, {**DAPO, "zero3": True, "save_steps": 2})
    assert _engine(tmp_path)["zero_stage"] == 3
    assert _engine(tmp_path)["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
    for rank in (0, 1):  # every parameter is a half-size shard on each rank, the module's own tensor is empty
        partition = json.loads((tmp_path / f"partition_dapo_rank{rank}.json").read_text())
        assert len(partition["shards"]) == partition["params"] > 0
        for numel, full_numel, shard in partition["shards"]:
            assert numel == 0 and shard == math.ceil(full_numel / 2)
    same_training("zero3", ddp_two_process_run["dapo"], full["dapo"], atol=LAYOUT_ATOL, metric_rtol=METRIC_RTOL)

    # Resume from the rollout-batch boundary: the same parameters, metrics and run state, bit for bit. (The entropy
    # controller's state, an `ExportableState` callback's, is tested with the controller in its research layer.)
    checkpoint = tmp_path / "dapo" / "checkpoint-2"
    callbacks = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]
    assert callbacks["StopWhenNothingToLearn"]["attributes"]["learned"] is True
    unsafe = {g for f in (checkpoint / "global_step2").iterdir() for g in get_unsafe_globals_in_checkpoint(f)}
    assert unsafe == {"deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.runtime.zero.config.ZeroStageEnum"}
    resumed = run(_accelerate_launch(config), tmp_path / "resumed", {**DAPO, "resume": str(checkpoint)})
    for name, value in full["dapo"][0].items():
        assert torch.equal(resumed["dapo"][0][name], value), name
    after = [{k: v for k, v in h.items() if k.startswith("cegppo/")} for h in _steps(resumed["dapo"][1])[2:]]
    assert len(after) == 2
    assert after == [{k: v for k, v in h.items() if k.startswith("cegppo/")} for h in _steps(full["dapo"][1])[2:]]

    # The same checkpoint with rank 0's model states replaced by a pickle that runs code: refused, nothing runs
    # (cegppo_trl.safe_load; the other engines are in tests/test_safe_load.py).
    _assert_crafted_resume_is_refused(
        config, checkpoint, tmp_path, "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt"
    )


@pytest.mark.slow
@pytest.mark.campaign
def test_two_nodes_on_loopback_train_what_one_node_trains(tmp_path, ddp_two_process_run):
    port = str(free_port())
    nodes = [
        start(
            [
                str(TORCHRUN),
                "--nnodes",
                "2",
                "--nproc_per_node",
                "1",
                "--node_rank",
                str(rank),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                port,
            ],
            tmp_path,
            DAPO,
            ACCELERATE_USE_CPU="1",
        )  # fmt: skip
        for rank in (0, 1)
    ]
    wait(nodes)
    assert _engine(tmp_path)["num_processes"] == 2
    two_nodes = load(tmp_path, ["dapo"])["dapo"]
    same_training("two nodes", ddp_two_process_run["dapo"], two_nodes, atol=0.0, metric_rtol=0.0, metric_atol=0.0)


@pytest.mark.slow
@pytest.mark.campaign
def test_cpu_rehearsal_of_the_7b_recipe_under_zero3(tmp_path):
    # docs/usage.md, "Rehearse on CPU": the shipped recipe and accelerate config, a tiny model, 2 steps. The model is
    # loaded partition by partition (`zero3_init_flag`), generates through TRL's ZeRO-3 gather, and is saved whole.
    from safetensors.torch import load_file

    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    build_tiny_llama(tokenizer, seed=0).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    rows = [{"prompt": f"{i}+{i % 5}=", "solution": str(i + i % 5)} for i in range(16)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = cpu_accelerate_config("deepspeed_zero3.yaml", tmp_path)
    argv = _accelerate_launch(config) + [
        str(REPO / "examples" / "cegppo.py"), "--config", str(REPO / "examples/recipes/cegppo_r1_distill_7b.yaml"),
        *REHEARSAL_FLAGS, "--model_name_or_path", str(tmp_path / "tiny"),
        "--dataset_name", str(tmp_path / "data.jsonl"), "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    wait([launch(argv, tmp_path)])
    log = (tmp_path / "output_0.txt").read_text()
    assert log.count("'cegppo/beta1': '0.75'") == 2  # two optimizer steps with the recipe's beta1
    # Warm-up keeps the learning rate at ~0 for these steps: what was saved is what was loaded, so neither the
    # partitioned load nor the gathered save lost or re-initialised a weight.
    before, after = (load_file(tmp_path / d / "model.safetensors") for d in ("tiny", "out"))
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# The CPU copy of a shipped accelerate config (tests/helpers/cpu_rehearsal.py)
# ----------------------------------------------------------------------------------------------------------------
def test_cpu_rehearsal_config_keeps_the_shipped_settings(tmp_path):
    import yaml
    from helpers.cpu_rehearsal import main

    main([str(REPO / "accelerate_configs" / "two_nodes.yaml"), str(tmp_path / "two_nodes_cpu.yaml")])
    config = yaml.safe_load((tmp_path / "two_nodes_cpu.yaml").read_text())
    assert config["use_cpu"] is True and config["num_processes"] == 2 and config["num_machines"] == 2
    assert config["main_process_ip"] == "127.0.0.1" and config["distributed_type"] == "DEEPSPEED"
    ds = json.loads((tmp_path / "two_nodes_cpu.deepspeed.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert config["deepspeed_config"]["deepspeed_config_file"] == str(tmp_path / "two_nodes_cpu.deepspeed.json")
    assert "mixed_precision" not in config  # accelerate refuses it beside a DeepSpeed file
