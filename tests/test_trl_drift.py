"""The `_compute_loss` override is a copy of TRL's: fail loudly when the installed TRL's method changes."""

from __future__ import annotations

import difflib
import inspect

import pytest
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
