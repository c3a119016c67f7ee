"""A GRPO run continued with CE-GPPO: a checkpoint `GRPOTrainer` wrote (no marker) resumes by every route, an
explicit path, `True` and `last`, in its own `output_dir` or another, with one line saying which. At beta = 0 the
continuation is bit-identical to `GRPOTrainer` continuing; at beta = (0.5, 1) it differs. transformers' rotation
treats the GRPO checkpoints as it treats any.

The job is tests/helpers/ckpt_job.py's (off-policy, a checkpoint every rollout batch, constant learning rate):
`GRPOTrainer` trains 4 steps, then the run goes on to 8.
"""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from helpers.ckpt_job import build, params, torchrun

from cegppo_trl.checkpoints import COMMIT_FILE


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """GRPOTrainer's 4 steps (checkpoints 2 and 4), and GRPOTrainer continuing them to 8: the reference."""
    root = tmp_path_factory.mktemp("grpo")
    build(dict(trainer="grpo", output_dir=root / "run", max_steps=4)).train()
    shutil.copytree(root / "run", root / "continued")
    reference = build(dict(trainer="grpo", output_dir=root / "continued", max_steps=8))
    reference.train(resume_from_checkpoint=str(root / "continued" / "checkpoint-4"))
    return root / "run", params(reference)


ROUTES = {  # route -> (the folder the continuation trains into, relative to the copy; what `train()` is given)
    "explicit path": ("run", lambda run: str(run / "checkpoint-4")),
    "True": ("run", lambda run: True),
    "last": ("run", lambda run: "last"),  # what `cegppo train --resume_from_checkpoint last` hands to the plan
    "explicit path, another output_dir": ("elsewhere", lambda run: str(run / "checkpoint-4")),
}


@pytest.mark.slow
@pytest.mark.parametrize("betas", [(0.0, 0.0), (0.5, 1.0)], ids=["beta=0", "beta=(0.5,1)"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_grpo_checkpoint_continues_with_cegppo_by_every_route(grpo_run, tmp_path, caplog, route, betas):
    run, reference = grpo_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    into, resume = ROUTES[route]
    with caplog.at_level(logging.WARNING):
        trainer = build(dict(trainer="cegppo", output_dir=tmp_path / into, max_steps=8, betas=betas,
                             save_total_limit=1))  # fmt: skip
        trainer.train(resume_from_checkpoint=resume(copy))
    said = [r.getMessage() for r in caplog.records if "Resuming from" in r.getMessage()]
    assert len(said) == 1 and f"Resuming from {copy / 'checkpoint-4'} (global step 4)." in said[0]
    assert trainer.state.global_step == 8
    same = all(torch.equal(p, reference[n]) for n, p in params(trainer).items())
    assert same is (betas == (0.0, 0.0)), (route, betas)
    # transformers' rotation (`save_total_limit=1`), as GRPOTrainer's; CE-GPPO's own checkpoint is committed
    assert sorted(p.name for p in copy.glob("checkpoint-*")) == (
        ["checkpoint-8"] if into == "run" else ["checkpoint-2", "checkpoint-4"])  # fmt: skip
    assert (tmp_path / into / "checkpoint-8" / COMMIT_FILE).exists()


@pytest.mark.slow
def test_the_cli_continues_a_grpo_run_with_last(model_dir, data_file, tmp_path, caplog):
    from datasets import load_dataset
    from helpers.ckpt_job import count_ones
    from test_resume import smoke_args
    from trl import GRPOConfig, GRPOTrainer

    from cegppo_trl.scripts import main as train

    grpo = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=4,
                      per_device_train_batch_size=4, steps_per_generation=2, max_completion_length=16, max_steps=2,
                      save_strategy="steps", save_steps=2, disable_tqdm=True)  # fmt: skip
    data = load_dataset("json", data_files=data_file, split="train")
    GRPOTrainer(model_dir, count_ones, args=grpo, train_dataset=data).train()
    assert not (tmp_path / "checkpoint-2" / COMMIT_FILE).exists()
    with caplog.at_level(logging.WARNING):
        trainer = train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last",
                                    "--max_steps", "4"))  # fmt: skip
    assert trainer.state.global_step == 4
    assert f"Resuming from {tmp_path / 'checkpoint-2'} (global step 2)." in caplog.text
    assert (tmp_path / "checkpoint-4" / COMMIT_FILE).exists() and (tmp_path / "checkpoint-2").is_dir()


@pytest.mark.slow
@pytest.mark.campaign
def test_ddp_a_grpo_checkpoint_continues_with_cegppo_at_beta_0_bit_for_bit(tmp_path):
    torchrun(dict(trainer="grpo", output_dir=tmp_path / "grpo", max_steps=4))
    shutil.copytree(tmp_path / "grpo", tmp_path / "cegppo")
    torchrun(dict(trainer="grpo", output_dir=tmp_path / "grpo", max_steps=8, resume=True, params=tmp_path / "g.pt"))
    done = torchrun(dict(trainer="cegppo", output_dir=tmp_path / "cegppo", max_steps=8, resume=True,
                         params=tmp_path / "c.pt"))  # fmt: skip
    assert f"Resuming from {tmp_path / 'cegppo' / 'checkpoint-4'} (global step 4)." in done.stderr
    grpo, cegppo = torch.load(tmp_path / "g.pt"), torch.load(tmp_path / "c.pt")
    assert grpo.keys() == cegppo.keys() and all(torch.equal(grpo[k], cegppo[k]) for k in grpo)
