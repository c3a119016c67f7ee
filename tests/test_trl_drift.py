"""The `_compute_loss` override is a copy of TRL's: fail loudly when the installed TRL's method changes."""

from __future__ import annotations

import difflib
import inspect

import pytest
import torch
import trl

from cegppo_trl import trainer as trainer_module


def test_installed_trl_internals_are_the_ones_the_package_was_checked_against():
    assert trainer_module.trl_source_changes() == [], (
        f"trl {trl.__version__} changed {trainer_module.trl_source_changes()}: re-check each assumption in "
        "TRL_GUARDED_SOURCES (docs/maintaining.md, 'Bumping TRL'), then add the release to TRL_SOURCE_SHA256."
    )
    assert trl.__version__ in trainer_module.TRL_SOURCE_SHA256
    assert set(trainer_module.TRL_SOURCE_SHA256[trl.__version__]) == set(trainer_module.TRL_GUARDED_SOURCES)


def _with_changed(monkeypatch, *names, new_hash="0" * 64):
    installed = trainer_module.trl_source_sha256()
    monkeypatch.setattr(trainer_module, "trl_source_sha256", lambda: {**installed, **dict.fromkeys(names, new_hash)})


@pytest.mark.parametrize("name", list(trainer_module.TRL_GUARDED_SOURCES))
def test_drift_in_any_guarded_source_refuses_to_train_naming_it(monkeypatch, name):
    _with_changed(monkeypatch, name)
    monkeypatch.delenv(trainer_module.SKIP_DRIFT_CHECK_ENV, raising=False)
    with pytest.raises(RuntimeError) as error:
        trainer_module.check_trl_compatibility()
    message = str(error.value)
    assert f"changed in the installed trl {trl.__version__}" in message and "CEGPPO_SKIP_TRL_DRIFT_CHECK=1" in message
    assert f"`{name}`, which {trainer_module.TRL_GUARDED_SOURCES[name]}" in message
    others = [other for other in trainer_module.TRL_GUARDED_SOURCES if other != name]
    assert not any(f"`{other}`" in message for other in others), "only the changed source is named"


def test_a_guarded_source_trl_no_longer_has_counts_as_changed(monkeypatch):
    from trl.trainer import grpo_trainer

    monkeypatch.delattr(grpo_trainer, "split_tensor_dict")
    assert trainer_module.trl_source_sha256()["split_tensor_dict"] == "missing"
    assert trainer_module.trl_source_changes() == ["split_tensor_dict"]


def test_drift_override_warns(monkeypatch):
    _with_changed(monkeypatch, "GRPOTrainer._prepare_inputs")
    monkeypatch.setenv(trainer_module.SKIP_DRIFT_CHECK_ENV, "1")
    with pytest.warns(UserWarning, match=r"changed in the installed trl .*`GRPOTrainer._prepare_inputs`"):
        trainer_module.check_trl_compatibility()


def test_training_goes_through_the_overridden_loss(make_trainer, monkeypatch):
    # Guards against any dispatch path (e.g. a fused loss) that would train without the CE-GPPO surrogate.
    trainer = make_trainer(num_iterations=2, max_steps=2)
    calls = []
    original = type(trainer)._compute_loss
    monkeypatch.setattr(type(trainer), "_compute_loss", lambda self, m, i: calls.append(1) or original(self, m, i))
    trainer.train()
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------------------------------
# The copy is fenced: every line that differs from TRL's `_compute_loss` lies between CE-GPPO fence markers
# ---------------------------------------------------------------------------------------------------------------------
FENCE_BEGIN, FENCE_END = "# --- CE-GPPO begin", "# --- CE-GPPO end"


def unfenced_changes(theirs: str, ours: str) -> list[str]:
    """Hunks of `ours` (the override) that differ from `theirs` (TRL's method) outside a CE-GPPO fence.

    A fence is a `# --- CE-GPPO begin: why ---` line, the changed lines, and a `# --- CE-GPPO end ---` line. Lines
    TRL has and the copy drops must be dropped inside a fence too (the fence says why).
    """
    a, b = theirs.splitlines(), ours.splitlines()
    fenced, depth = [], 0  # fenced[j]: line j of `ours` is a marker or lies inside a fence
    for line in b:
        stripped = line.strip()
        if stripped.startswith(FENCE_BEGIN):
            depth += 1
        fenced.append(depth > 0)
        if stripped.startswith(FENCE_END):
            depth -= 1
    assert depth == 0, "unbalanced CE-GPPO fence markers"
    problems = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if j2 > j1:  # lines the copy adds or replaces (a blank line around a fence changes nothing)
            ok = all(fenced[j] or not b[j].strip() for j in range(j1, j2))
        else:  # lines the copy drops: the gap must sit inside a fence
            ok = 0 < j1 < len(b) and fenced[j1 - 1] and fenced[j1]
        if not ok:
            removed = "\n".join("- " + line for line in a[i1:i2])
            added = "\n".join("+ " + line for line in b[j1:j2])
            problems.append(f"@@ TRL lines {i1 + 1}-{i2}, override lines {j1 + 1}-{j2}\n{removed}\n{added}".strip())
    return problems


def test_fence_check_catches_unfenced_edits_and_accepts_fenced_ones():
    trl_text = "a = 1\nb = 2\nc = 3\nd = 4\n"
    assert unfenced_changes(trl_text, trl_text) == []
    assert len(unfenced_changes(trl_text, "a = 1\nb = 20\nc = 3\nd = 4\n")) == 1  # edited in place
    assert len(unfenced_changes(trl_text, "a = 1\nc = 3\nd = 4\n")) == 1  # dropped silently
    fenced_edit = "a = 1\n# --- CE-GPPO begin: why ---\nb = 20\n# --- CE-GPPO end ---\nc = 3\nd = 4\n"
    assert unfenced_changes(trl_text, fenced_edit) == []
    fenced_drop = "a = 1\n# --- CE-GPPO begin: b is not needed ---\n# --- CE-GPPO end ---\nc = 3\nd = 4\n"
    assert unfenced_changes(trl_text, fenced_drop) == []


def test_every_deviation_of_the_override_from_trl_is_fenced():
    from trl import GRPOTrainer

    from cegppo_trl.trainer import CEGPPOTrainer

    problems = unfenced_changes(
        inspect.getsource(GRPOTrainer._compute_loss), inspect.getsource(CEGPPOTrainer._compute_loss)
    )
    assert not problems, "changes to TRL's _compute_loss outside a CE-GPPO fence:\n\n" + "\n\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------------
# What the rollout-batch normalisers assume of TRL, tested on the real code path (the hashes above only say it changed)
# ---------------------------------------------------------------------------------------------------------------------
def test_one_reward_call_per_rollout_batch_split_into_steps_per_generation_micro_batches(make_trainer, monkeypatch):
    # 4 optimizer steps, 2 per rollout batch: 2 rollout batches of 8 completions, each split into 2 micro-batches of
    # 4 that hold exactly its rows and the rollout batch's 0-d counts (`num_sequences_in_batch` / `share`).
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

    counts = ("num_items_in_batch", "num_sequences_in_batch", "num_sft_items_in_batch", "num_sft_sequences_in_batch")
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
        return [0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0]

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
    assert output["num_sequences_in_batch"].item() == 8  # kept sequences of both processes: 2 groups of 4
