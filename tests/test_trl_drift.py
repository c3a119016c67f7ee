"""The `_compute_loss` override is a copy of TRL's: fail loudly when the installed TRL's method changes."""

from __future__ import annotations

import difflib
import inspect
import io
import textwrap
import tokenize
import types

import pytest
import torch
import trl
from packaging.version import Version

from cegppo_trl import trl_compat


def test_installed_trl_internals_are_the_ones_the_package_was_checked_against():
    assert trl_compat.trl_source_changes() == [], (
        f"trl {trl.__version__} changed {trl_compat.trl_source_changes()}: re-check each assumption in "
        "TRL_GUARDED_SOURCES (docs/maintaining.md, 'Bumping TRL'), then add the release to TRL_SOURCE_FINGERPRINTS."
    )
    assert trl.__version__ in trl_compat.TRL_SOURCE_FINGERPRINTS, (
        f"trl {trl.__version__} has the code of tested release {trl_compat.matching_release()} but is not listed: "
        "run this subset against it and add its entry (`python -m cegppo_trl.trl_compat`)."
    )
    assert trl_compat.TRL_SOURCE_FINGERPRINTS[trl.__version__] == trl_compat.trl_source_fingerprints()
    assert trl_compat.missing_config_fields() == []


def test_every_tested_release_fingerprints_every_guarded_source():
    for release, fingerprints in trl_compat.TRL_SOURCE_FINGERPRINTS.items():
        assert list(fingerprints) == list(trl_compat.TRL_GUARDED_SOURCES), release


# ---------------------------------------------------------------------------------------------------------------------
# The fingerprint is the code: comments, layout and docstrings do not change it, any code change does
# ---------------------------------------------------------------------------------------------------------------------
SOURCE = '''
    @profiling_decorator
    def f(self, x, mask):
        """Docstring."""
        # a comment
        total = (x * mask).sum() / mask.sum().clamp(min=1.0)  # trailing comment
        return self.scale(total, mode="train")
'''


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("# a comment", "# another comment, reworded"),
        lambda s: s.replace("  # trailing comment", ""),
        lambda s: s.replace("        # a comment\n", ""),
        lambda s: s.replace('"""Docstring."""', '"""Docstring, rewritten\n\n        over two paragraphs."""'),
        lambda s: s.replace(
            'self.scale(total, mode="train")', 'self.scale(\n            total,\n            mode="train",\n        )'
        ),
        lambda s: s.replace("total = (x * mask)", "total = ((x * mask))"),
        lambda s: textwrap.indent(textwrap.dedent(s), "        "),
        lambda s: s.replace('mode="train"', "mode='train'"),
    ],
    ids=[
        "comment",
        "trailing-comment",
        "comment-line-dropped",
        "docstring",
        "rewrapped",
        "parentheses",
        "indent",
        "quotes",
    ],
)
def test_comment_and_formatting_changes_keep_the_fingerprint(edit):
    assert edit(SOURCE) != SOURCE
    assert trl_compat.source_fingerprint(edit(SOURCE)) == trl_compat.source_fingerprint(SOURCE)


@pytest.mark.parametrize(
    "old, new",
    [
        ("min=1.0", "min=1"),  # a constant's type
        ("min=1.0", "min=2.0"),  # a constant
        ("x * mask", "mask * x"),  # operand order
        ("/ mask.sum()", "// mask.sum()"),  # an operator
        ('mode="train"', 'mode="eval"'),  # a string
        ("self.scale", "self.rescale"),  # a name
        ("@profiling_decorator\n    ", ""),  # a decorator
        ("def f(self, x, mask)", "def f(self, x, mask=None)"),  # a default
    ],
)
def test_any_code_change_changes_the_fingerprint(old, new):
    assert old in SOURCE
    assert trl_compat.source_fingerprint(SOURCE.replace(old, new)) != trl_compat.source_fingerprint(SOURCE)


def test_the_fingerprint_text_leaves_out_empty_fields_so_it_is_the_same_on_every_python():
    # Python 3.12 added `type_params=[]` to every function node and 3.13's `ast.dump` hides empty fields: the
    # canonical text must not depend on either (the tested fingerprints were checked equal on 3.10-3.13).
    import ast

    text = trl_compat._canonical(ast.parse("def f(x):\n    return x[0]\n"))
    assert "[]" not in text and "None" not in text and "type_params" not in text
    assert text.startswith("Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x')]")


def test_trl_1_15_comment_change_of_compute_loss_keeps_its_fingerprint_and_a_token_does_not():
    # TRL 1.15 reworded one comment line of `_compute_loss`: the same code, so the same fingerprint in 1.10-1.16.
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    trl_1_14 = "# provide advantages with shape (B, T) (e.g., MiniLLM), we *conditionally* unsqueeze the tensor."
    trl_1_15 = "# provide advantages with shape (B, T), we *conditionally* unsqueeze the tensor."
    old, new = (trl_1_14, trl_1_15) if trl_1_14 in source else (trl_1_15, trl_1_14)
    assert old in source
    assert trl_compat.source_fingerprint(source.replace(old, new)) == trl_compat.source_fingerprint(source)
    one_token = source.replace("advantages.dim() == 1", "advantages.dim() == 2", 1)
    assert one_token != source and trl_compat.source_fingerprint(one_token) != trl_compat.source_fingerprint(source)


# ---------------------------------------------------------------------------------------------------------------------
# The refusal before training
# ---------------------------------------------------------------------------------------------------------------------
def _installed(monkeypatch, fingerprints):
    monkeypatch.setattr(trl_compat, "trl_source_fingerprints", lambda: dict(fingerprints))


def _with_changed(monkeypatch, *names, new_fingerprint="0" * 64):
    installed = trl_compat.trl_source_fingerprints()
    _installed(monkeypatch, {**installed, **dict.fromkeys(names, new_fingerprint)})


@pytest.mark.parametrize("name", list(trl_compat.TRL_GUARDED_SOURCES))
def test_drift_in_any_guarded_source_refuses_to_train_naming_it(monkeypatch, name):
    _with_changed(monkeypatch, name)
    monkeypatch.delenv(trl_compat.SKIP_DRIFT_CHECK_ENV, raising=False)
    with pytest.raises(RuntimeError) as error:
        trl_compat.check_trl_compatibility()
    message = str(error.value)
    assert f"changed in the installed trl {trl.__version__}" in message and "CEGPPO_SKIP_TRL_DRIFT_CHECK=1" in message
    assert f"`{name}`, which {trl_compat.TRL_GUARDED_SOURCES[name]}" in message
    assert f"to {trl_compat.newest_tested_release()})" in message, "names the newest tested release"
    others = [other for other in trl_compat.TRL_GUARDED_SOURCES if other != name]
    assert not any(f"`{other}`" in message for other in others), "only the changed source is named"


def test_a_patched_guarded_source_is_fingerprinted_afresh(monkeypatch):
    # The fingerprints are cached per function object: a replaced method must not keep its predecessor's.
    from trl import GRPOTrainer

    before = trl_compat.trl_source_fingerprints()["GRPOTrainer._compute_loss"]

    def _compute_loss(self, model, inputs):
        return 0.0

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", _compute_loss)
    assert trl_compat.trl_source_fingerprints()["GRPOTrainer._compute_loss"] != before
    assert trl_compat.trl_source_changes() == ["GRPOTrainer._compute_loss"]


def test_a_guarded_source_trl_no_longer_has_counts_as_changed(monkeypatch):
    from trl.trainer import grpo_trainer

    monkeypatch.delattr(grpo_trainer, "split_tensor_dict")
    assert trl_compat.trl_source_fingerprints()["split_tensor_dict"] == "missing"
    assert trl_compat.trl_source_changes() == ["split_tensor_dict"]


def test_a_config_field_trl_no_longer_has_refuses(monkeypatch):
    monkeypatch.setattr(trl_compat, "TRL_CONFIG_FIELDS", (*trl_compat.TRL_CONFIG_FIELDS, "gone_in_this_release"))
    monkeypatch.delenv(trl_compat.SKIP_DRIFT_CHECK_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"`GRPOConfig` has no field\(s\) \['gone_in_this_release'\]"):
        trl_compat.check_trl_compatibility()


def test_drift_override_warns(monkeypatch):
    _with_changed(monkeypatch, "GRPOTrainer._prepare_inputs")
    monkeypatch.setenv(trl_compat.SKIP_DRIFT_CHECK_ENV, "1")
    with pytest.warns(UserWarning, match=r"changed in the installed trl .*`GRPOTrainer._prepare_inputs`"):
        trl_compat.check_trl_compatibility()


def test_a_newer_trl_with_the_code_of_a_tested_release_trains_with_a_warning(monkeypatch):
    # The day TRL 1.17 ships: pip keeps cegppo_trl's pin (< 1.17), but a user who upgrades TRL anyway trains when
    # every guarded source has a tested release's code, and is refused, before the model loads, when one changed.
    newest = trl_compat.newest_tested_release()
    monkeypatch.setattr(trl, "__version__", "1.99.0")
    _installed(monkeypatch, trl_compat.TRL_SOURCE_FINGERPRINTS[newest])
    with pytest.warns(
        UserWarning, match=rf"trl 1.99.0 is newer than the newest release .* \({newest}\); every TRL source"
    ):
        trl_compat.check_trl_compatibility()
    _with_changed(monkeypatch, "GRPOTrainer._calculate_rewards")
    monkeypatch.delenv(trl_compat.SKIP_DRIFT_CHECK_ENV, raising=False)
    with pytest.raises(
        RuntimeError, match=rf"installed trl 1.99.0 \(tested: .* to {newest}\): `GRPOTrainer._calculate_rewards`"
    ):
        trl_compat.check_trl_compatibility()


@pytest.mark.parametrize("release", sorted(trl_compat.TRL_SOURCE_FINGERPRINTS, key=Version))
def test_use_liger_kernel_is_refused_where_compute_loss_sends_it_to_a_fused_loss(monkeypatch, release):
    # Before TRL 1.14, `compute_loss` sends `use_liger_kernel=True` to Liger's fused GRPO loss (plain GRPO).
    _installed(monkeypatch, trl_compat.TRL_SOURCE_FINGERPRINTS[release])
    monkeypatch.setattr(trl, "__version__", release)
    liger = types.SimpleNamespace(use_liger_kernel=True)
    if Version(release) < Version("1.14.0"):
        with pytest.raises(
            ValueError, match=rf"`use_liger_kernel=True` with trl {release}: .* would train plain GRPO"
        ):
            trl_compat.check_trl_compatibility(liger)
    else:
        trl_compat.check_trl_compatibility(liger)
    trl_compat.check_trl_compatibility(types.SimpleNamespace(use_liger_kernel=False))


def test_the_trainer_checks_its_config_against_the_installed_release(make_trainer, monkeypatch):
    # With TRL 1.13's code installed, `use_liger_kernel=True` stops in `__init__` before GRPOTrainer sets up anything.
    from trl import GRPOTrainer

    _installed(monkeypatch, trl_compat.TRL_SOURCE_FINGERPRINTS["1.13.0"])
    monkeypatch.setattr(GRPOTrainer, "__init__", lambda *a, **k: pytest.fail("GRPOTrainer.__init__ ran"))
    with pytest.raises(ValueError, match=rf"`use_liger_kernel=True` with trl {trl.__version__}: before trl 1.14.0"):
        make_trainer(use_liger_kernel=True)


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


def code_lines(source: str) -> list[str]:
    """The lines of `source` without comments (except fence markers) or blank lines: what the fingerprint sees.

    A comment edit (TRL 1.15 reworded one in `_compute_loss`) is neither a drift nor a deviation of the copy.
    """
    lines = textwrap.dedent(source).splitlines()
    for token in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
        if token.type == tokenize.COMMENT and not token.string.startswith((FENCE_BEGIN, FENCE_END)):
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return [line.rstrip() for line in lines if line.strip()]


def unfenced_changes(theirs: str, ours: str) -> list[str]:
    """Hunks of `ours` (the override) whose code differs from `theirs` (TRL's method) outside a CE-GPPO fence.

    A fence is a `# --- CE-GPPO begin: why ---` line, the changed lines, and a `# --- CE-GPPO end ---` line. Lines
    TRL has and the copy drops must be dropped inside a fence too (the fence says why). Comments and blank lines are
    left out on both sides (`code_lines`).
    """
    a, b = code_lines(theirs), code_lines(ours)
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
        if j2 > j1:  # lines the copy adds or replaces
            ok = all(fenced[j] for j in range(j1, j2))
        else:  # lines the copy drops: the gap must sit inside a fence
            ok = 0 < j1 < len(b) and fenced[j1 - 1] and fenced[j1]
        if not ok:
            removed = "\n".join("- " + line for line in a[i1:i2])
            added = "\n".join("+ " + line for line in b[j1:j2])
            problems.append(
                f"@@ TRL code lines {i1 + 1}-{i2}, override code lines {j1 + 1}-{j2}\n{removed}\n{added}".strip()
            )
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
    # comments are not code: rewording, adding or dropping one outside a fence is no deviation
    commented = "a = 1  # one\n# why b\nb = 2\n\nc = 3\nd = 4\n"
    assert unfenced_changes(trl_text, commented) == [] and unfenced_changes(commented, trl_text) == []
    assert len(unfenced_changes(trl_text, "a = 1  # one\nb = 20\nc = 3\nd = 4\n")) == 1


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
    assert output["num_sequences_in_batch"].item() == 8  # kept sequences of both processes: 2 groups of 4


@pytest.mark.parametrize(
    "version, refused", [("1.15.0", True), ("1.15.1", True), ("1.14.0", False), ("1.16.0", False)]
)
def test_trl_1_15_on_cpu_is_refused_before_training(make_trainer, monkeypatch, version, refused):
    # TRL 1.15 computes log-probabilities with a triton (GPU-only) kernel: on CPU its own first step fails.
    from trl import GRPOTrainer

    monkeypatch.setattr(trl, "__version__", version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (trl_compat.missing_trl_kernel() is not None) == refused
    if refused:
        monkeypatch.setattr(GRPOTrainer, "__init__", lambda *a, **k: pytest.fail("GRPOTrainer.__init__ ran"))
        with pytest.raises(ValueError, match=rf"trl {version} computes every log-probability with a triton kernel .*"
                           r"no GPU in this run.*!=1\.15\.\*"):  # fmt: skip
            make_trainer()


def test_the_trl_pin_is_the_tested_range():
    # pip's pin and the run-time check say the same: from the oldest tested release to the newest one's minor series,
    # without the release left out (what `.ci/trl_oldest.sh` installs is the pin's lower end).
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (pin,) = [Requirement(d).specifier for d in project["dependencies"] if Requirement(d).name == "trl"]
    newest = Version(trl_compat.newest_tested_release())
    left_out = trl_compat.TRL_RELEASE_FACTS["gpu_only_log_probs"]
    expected = SpecifierSet(
        f">={trl_compat.oldest_tested_release()},!={left_out}.*,<{newest.major}.{newest.minor + 1}"
    )
    assert pin == expected
    assert all(release in pin for release in trl_compat.TRL_SOURCE_FINGERPRINTS)
    assert f"{left_out}.0" not in pin and f"{left_out}.0" not in trl_compat.TRL_SOURCE_FINGERPRINTS
