"""`cegppo_trl.research.baselines`: the one map from a method name to `CEGPPOConfig` fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cegppo_trl import CEGPPOConfig
from cegppo_trl.research.baselines import METHODS, markdown_table, method_config

CONFIGURATION_DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


@pytest.mark.parametrize("recipe", ["paper", "authors"])
def test_every_method_sets_the_same_keys_and_builds_a_valid_config(recipe, tmp_path):
    keys = {name: set(method_config(name, recipe)) for name in METHODS}
    assert len({frozenset(k) for k in keys.values()}) == 1
    for name in METHODS:
        fields = method_config(name, recipe)
        config = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **fields)
        assert {k: getattr(config, k) for k in fields} == fields


def test_the_methods_are_the_papers():
    assert method_config("cegppo") == {
        "loss_type": "dapo", "importance_sampling_level": "token", "delta": None, "sft_loss_coef": 0.0,
        "dynamic_sampling": False, "gppo_beta1": 0.5, "gppo_beta2": 1.0, "epsilon": 0.2, "epsilon_high": 0.2,
    }  # fmt: skip
    assert method_config("grpo")["gppo_beta1"] == method_config("grpo")["gppo_beta2"] == 0.0
    assert method_config("dapo")["epsilon_high"] == 0.28
    assert method_config("cispo")["loss_type"] == "cispo"
    assert method_config("gspo")["importance_sampling_level"] == "sequence"


def test_a_comparison_holds_the_additions_equal_across_arms_except_cispo():
    for recipe, additions in (("paper", (None, 0.0, False)), ("authors", (10.0, 0.1, True))):
        for name in ("cegppo", "grpo", "dapo", "gspo"):
            config = method_config(name, recipe)
            assert (config["delta"], config["sft_loss_coef"], config["dynamic_sampling"]) == additions
        cispo = method_config("cispo", recipe)  # TRL's objective: the CE-GPPO additions are not defined for it
        assert (cispo["delta"], cispo["sft_loss_coef"], cispo["dynamic_sampling"]) == (None, 0.0, False)


def test_unknown_method_or_recipe_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"Unknown method 'ppo'; choose one of \['cegppo'"):
        method_config("ppo")
    with pytest.raises(ValueError, match=r"Unknown recipe 'klear'; choose one of \['paper', 'authors'\]"):
        method_config("grpo", "klear")


def test_readme_shows_the_generated_methods_table():
    # `python -m cegppo_trl.research.baselines` prints it; the docs must not drift from the code.
    assert markdown_table() in CONFIGURATION_DOC.read_text()
    assert re.search(r"\| `grpo` \| `gppo_beta1=0\.0`, `gppo_beta2=0\.0` \|", markdown_table())
