"""The private TRL names and the one order of statements the CE-GPPO seam relies on (docs/maintaining.md, "The TRL
seam"): each test fails, naming what changed, when a TRL release changes one. The loss is TRL's `_compute_loss` on a
micro-batch whose advantages carry the preserved gradient: no copy of TRL's code or rules to keep in step.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer

from cegppo_trl import trl_compat

# name -> the parameters the seam passes (in this order), as `inspect.signature` shows them on TRL's GRPOTrainer
SEAM = {
    "_compute_loss": ["self", "model", "inputs"],
    "_get_per_token_logps_and_entropies": ["self", "model"],  # passed through; its first two outputs are taken
    "_generate_and_score_completions": ["self", "inputs"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
}


@pytest.mark.parametrize("name", list(SEAM))
def test_the_private_trl_names_the_seam_touches_keep_their_parameters(name):
    method = getattr(GRPOTrainer, name, None)
    assert method is not None, f"trl {trl.__version__}'s GRPOTrainer has no `{name}`: the CE-GPPO seam needs it"
    parameters = list(inspect.signature(method).parameters)[: len(SEAM[name])]
    assert parameters == SEAM[name], f"trl {trl.__version__} changed `GRPOTrainer.{name}`'s parameters: {parameters}"


def test_trls_loss_reads_the_advantages_after_its_one_policy_forward_pass(make_trainer, monkeypatch):
    # The contract: inside `_compute_loss` TRL runs the policy's forward pass once, and only then reads
    # `inputs["advantages"]` (TRL 1.10-1.16). The advantages handed over at that pass are the ones TRL's loss uses:
    # the backward reaches them at every training micro-batch.
    trainer = make_trainer(num_iterations=2, max_steps=2, top_entropy_quantile=0.5, gppo_beta1=0.5)
    calls, consumed = [], []
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def counted(self, *args, **kwargs):
        if self._micro_batch is not None:  # inside `_compute_loss`, before the advantages are replaced
            calls.append("policy pass")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counted)
    consume = type(trainer)._consumed
    monkeypatch.setattr(
        type(trainer), "_consumed", lambda self, grad: consumed.append(grad.shape) or consume(self, grad)
    )
    trainer.train()
    assert calls == ["policy pass"] * 2
    assert len(consumed) == 2  # old log-probs exist for both passes (num_iterations = 2): both are replaced


def test_a_trl_that_reads_the_advantages_before_the_forward_pass_fails_at_the_first_step(make_trainer, monkeypatch):
    # Simulated: TRL's loss works on its own copy of the micro-batch, taken before the forward pass, so the advantages
    # that carry the preserved gradient never reach it. The run must not train GRPO under CE-GPPO's name.
    trainer = make_trainer(num_iterations=2, max_steps=4, gppo_beta1=0.5)
    original = GRPOTrainer._compute_loss
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, model, inputs: original(self, model, dict(inputs)))
    with pytest.raises(RuntimeError, match=r"did not use the advantages .* read `inputs\['advantages'\]` after"):
        trainer.train()
    assert trainer.state.global_step <= 2


def test_the_micro_batch_carries_the_inputs_the_term_reads(make_trainer, monkeypatch):
    # What the term reads from TRL's micro-batch, off-policy: the loss mask, the advantages, the old log-probs and
    # dapo's token count.
    trainer = make_trainer(num_iterations=2, max_steps=1)
    seen = []
    original = GRPOTrainer._compute_loss
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, m, i: seen.append(set(i)) or original(self, m, i))
    trainer.train()
    for keys in seen:
        missing = {"completion_mask", "advantages", "old_per_token_logps", "num_items_in_batch"} - keys
        assert not missing, f"trl {trl.__version__}'s micro-batch lacks {missing}"


def test_training_goes_through_the_overridden_loss(make_trainer, monkeypatch):
    # Guards against any dispatch path (e.g. a fused loss) that would train without the CE-GPPO surrogate.
    trainer = make_trainer(num_iterations=2, max_steps=2)
    calls = []
    original = type(trainer)._compute_loss
    monkeypatch.setattr(type(trainer), "_compute_loss", lambda self, m, i: calls.append(1) or original(self, m, i))
    trainer.train()
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------------------------------
# What the rollout-batch normalisers assume of TRL, tested on the real code path (the hashes above only say it changed)
# ---------------------------------------------------------------------------------------------------------------------
def test_one_reward_call_per_rollout_batch_split_into_steps_per_generation_micro_batches(make_trainer, monkeypatch):
    # 4 optimizer steps, 2 per rollout batch: 2 rollout batches of 8 completions, each split into 2 micro-batches of
    # 4 that hold exactly its rows and the rollout batch's 0-d counts (the SFT term's normaliser reads them).
    from trl import GRPOTrainer

    trainer = make_trainer(
        per_device_train_batch_size=4, num_generations=4, steps_per_generation=2, max_steps=4, sft_loss_coef=0.1
    )  # fmt: skip
    reward_calls, rollouts, micro_batches = [], [], []
    calculate_rewards = GRPOTrainer._calculate_rewards
    monkeypatch.setattr(
        GRPOTrainer, "_calculate_rewards", lambda self, inputs, *a: reward_calls.append(len(inputs)) or
        calculate_rewards(self, inputs, *a),
    )  # fmt: skip
    cls = type(trainer)
    generate, compute_loss = cls._generate_and_score_completions, cls._compute_loss
    monkeypatch.setattr(cls, "_generate_and_score_completions", lambda self, i: rollouts.append(generate(self, i)) or
                        rollouts[-1])  # fmt: skip
    monkeypatch.setattr(cls, "_compute_loss", lambda self, m, i: micro_batches.append(i) or compute_loss(self, m, i))
    trainer.train()

    assert reward_calls == [8, 8] and len(rollouts) == 2 and len(micro_batches) == 4

    def rows(batch):
        return sorted(zip(batch["completion_ids"].tolist(), batch["advantages"].tolist(), batch["sft_mask"].tolist()))

    counts = ("num_items_in_batch", "num_sft_items_in_batch")
    for rollout, pair in zip(rollouts, (micro_batches[:2], micro_batches[2:])):
        assert [len(micro["advantages"]) for micro in pair] == [4, 4]
        assert sorted(rows(pair[0]) + rows(pair[1])) == rows(rollout)
        for micro in pair:
            for name in counts:
                assert micro[name].dim() == 0 and micro[name].item() == rollout[name].item(), name


def test_split_and_shuffle_pass_0d_tensors_through():
    from trl.trainer.grpo_trainer import shuffle_sequence_dict, split_tensor_dict

    count = torch.tensor(7.0)
    batch = {"rows": torch.arange(6), "count": count, "none": None}
    shuffled = shuffle_sequence_dict(batch)
    assert shuffled["count"] is count and sorted(shuffled["rows"].tolist()) == list(range(6))
    chunks = split_tensor_dict(shuffled, 3)
    assert [chunk["rows"].tolist() for chunk in chunks] == [shuffled["rows"][i : i + 2].tolist() for i in (0, 2, 4)]
    assert all(chunk["count"] is count and chunk["none"] is None for chunk in chunks)


def test_each_process_takes_the_slice_process_index_times_local_of_the_gathered_batch(make_trainer, monkeypatch):
    # Two processes simulated in one: this one is rank 1, and "rank 0" holds the reversed batch. TRL must hand rank 1
    # the rows 8..15 of the gathered rewards (its advantages), and the SFT / dynamic-sampling masks, cut from the
    # gathered batch by `CEGPPOTrainer`, must be the same rows.
    import trl.trainer.grpo_trainer as grpo_module

    def reward(completions, **kwargs):  # local group 0 informative (0, 1, 2, 3), local group 1 constant
        return [0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0][: len(completions)]  # the pre-flight calls it on 3 rows

    trainer = make_trainer(
        reward_funcs=reward, per_device_train_batch_size=8, sft_loss_coef=0.1, dynamic_sampling=True
    )  # fmt: skip

    def gather(tensor):  # [rank 0 = this process's batch reversed (groups and their members), rank 1 = this one]
        tensor = tensor.reshape(1) if tensor.dim() == 0 else tensor
        return torch.cat([tensor.flip(0), tensor])

    monkeypatch.setattr(grpo_module, "gather", gather)
    monkeypatch.setattr(trainer.accelerator, "gather", gather)
    monkeypatch.setattr(type(trainer.accelerator), "process_index", property(lambda self: 1))
    trainer.model.train()
    output = trainer._generate_and_score_completions([{"prompt": p} for p in ("1+1=", "2+2=") for _ in range(4)])

    std = torch.tensor([0.0, 1.0, 2.0, 3.0]).std()
    expected_advantages = torch.cat([(torch.arange(4.0) - 1.5) / (std + 1e-4), torch.zeros(4)])
    torch.testing.assert_close(output["advantages"], expected_advantages)  # rows 8..15 (rows 0..7: reversed)
    assert output["keep_mask"].tolist() == [1.0] * 4 + [0.0] * 4  # rows 0..7 would give the reverse
    assert output["sft_mask"].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # the best of the kept group
    assert output["num_items_in_batch"].item() == 2 * output["completion_mask"][:4].sum().item()  # kept groups only


@pytest.mark.parametrize("version", ["1.10.0", "1.13.0", "1.14.0", "1.16.0"])
def test_use_liger_kernel_is_refused_where_compute_loss_sends_it_to_a_fused_loss(monkeypatch, version):
    # Before TRL 1.14, `compute_loss` sends `use_liger_kernel=True` to Liger's fused GRPO loss (plain GRPO).
    monkeypatch.setattr(trl, "__version__", version)
    liger = types.SimpleNamespace(use_liger_kernel=True)
    if Version(version) < Version("1.14.0"):
        with pytest.raises(
            ValueError, match=rf"`use_liger_kernel=True` with trl {version}: .* would train plain GRPO"
        ):
            trl_compat.check_trl_compatibility(liger)
    else:
        trl_compat.check_trl_compatibility(liger)
    trl_compat.check_trl_compatibility(types.SimpleNamespace(use_liger_kernel=False))


def test_the_trl_pin_is_the_tested_range():
    # pip's pin is the tested ends, without the release left out (what `.ci/trl_oldest.sh` installs is the pin's
    # lower end), and holds the installed TRL.
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (pin,) = [Requirement(d).specifier for d in project["dependencies"] if Requirement(d).name == "trl"]
    oldest, newest = (Version(v) for v in trl_compat.TESTED_TRL)
    left_out = trl_compat.GPU_ONLY_LOG_PROBS
    assert pin == SpecifierSet(f">={oldest},!={left_out}.*,<{newest.major}.{newest.minor + 1}")
    assert str(oldest) in pin and str(newest) in pin and f"{left_out}.0" not in pin
    assert pin.contains(trl.__version__)
