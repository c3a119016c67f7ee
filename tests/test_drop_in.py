"""Drop-in means drop-in: the same small script run with `GRPOTrainer` / `GRPOConfig` and with `CEGPPOTrainer` /
`CEGPPOConfig` at beta1 = beta2 = 0 has the same outcome (parameters, logged metric keys, exception type)."""

from __future__ import annotations

import pytest
from datasets import Dataset
from helpers.batches import base_config_kwargs, count_ones_reward

from cegppo_trl import CEGPPOConfig
from cegppo_trl.preflight import trainer_checks


class CounterEnv:
    """An environment whose `reset()` gives the prompt and whose one tool adds to a counter."""

    def reset(self, **kwargs) -> str:
        self.total = 0
        return "count:"

    def add(self, n: int) -> str:
        """Add to the counter.

        Args:
            n: how much to add.
        """
        self.total += n
        return str(self.total)


def test_preflight_accepts_an_environment_dataset_without_prompt(tmp_path):
    """TRL trains a dataset holding only the `environment` routing column: the prompt comes from `reset()`."""
    args = CEGPPOConfig(**base_config_kwargs(tmp_path, gppo_beta1=0.0, gppo_beta2=0.0))
    dataset = Dataset.from_dict({"environment": ["counter"] * 8})
    report = trainer_checks(
        "unused", count_ones_reward, args, train_dataset=dataset, environment_factory={"counter": CounterEnv}
    )
    assert report.errors == []
    report = trainer_checks("unused", count_ones_reward, args, train_dataset=dataset, environment_factory=CounterEnv)
    assert report.errors == []
    with pytest.raises(ValueError, match=r"`train_dataset` has no `prompt` column \(its columns: environment\)"):
        trainer_checks("unused", count_ones_reward, args, train_dataset=dataset)
