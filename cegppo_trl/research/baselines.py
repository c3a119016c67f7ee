"""CE-GPPO and the paper's baselines as `CEGPPOConfig` fields: the one map from a method name to its settings.

`method_config` returns the same keys for every method, so only the objective differs between the arms of a
comparison. `recipe="paper"` (default): the objective alone, as the paper runs its baselines. `recipe="authors"`:
every arm also gets the authors' CE-GPPO additions (dual clip `delta=10`, `sft_loss_coef=0.1`, dynamic sampling), as
the baseline recipes in `examples/recipes/` do, except CISPO (TRL's own objective, for which they are not defined).
`python -m cegppo_trl.research.baselines` prints the table of docs/configuration.md (a test keeps the two equal).
"""

from __future__ import annotations

# The paper's baselines (§4.1) and the recommended CE-GPPO setting. Clip ranges are the paper's.
METHODS: dict[str, dict] = {
    # (beta1, beta2) = (0.5, 1), the paper's recommended default; epsilon 0.2 on both sides; token mean.
    "cegppo": {"gppo_beta1": 0.5, "gppo_beta2": 1.0, "epsilon": 0.2, "epsilon_high": 0.2},
    # beta1 = beta2 = 0 makes the CE-GPPO surrogate's gradient exactly PPO-clip's.
    "grpo": {"gppo_beta1": 0.0, "gppo_beta2": 0.0, "epsilon": 0.2, "epsilon_high": 0.2},
    # Clip-higher: epsilon 0.2 / 0.28.
    "dapo": {"gppo_beta1": 0.0, "gppo_beta2": 0.0, "epsilon": 0.2, "epsilon_high": 0.28},
    # TRL's `loss_type="cispo"`, -sg(min(r, epsilon_high)) A log pi, unchanged. TRL's `epsilon_high` caps the ratio
    # itself, so the paper's CISPO epsilon = 0.2 is `epsilon_high=1.2`.
    "cispo": {"gppo_beta1": 0.0, "gppo_beta2": 0.0, "epsilon": 0.2, "epsilon_high": 1.2, "loss_type": "cispo"},
    # Sequence-level ratio, epsilon 3e-4 / 4e-4, GSPO's sequence-mean aggregation (`loss_type="grpo"`).
    "gspo": {
        "gppo_beta1": 0.0,
        "gppo_beta2": 0.0,
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
    },
}
DEFAULTS = {"loss_type": "dapo", "importance_sampling_level": "token"}
PAPER_ADDITIONS = {"delta": None, "sft_loss_coef": 0.0, "dynamic_sampling": False}
AUTHORS_ADDITIONS = {"delta": 10.0, "sft_loss_coef": 0.1, "dynamic_sampling": True}
RECIPES = {"paper": PAPER_ADDITIONS, "authors": AUTHORS_ADDITIONS}
# TRL's own objectives: the CE-GPPO additions are not defined for them (CEGPPOConfig rejects SFT / dynamic sampling).
PASSTHROUGH_METHODS = ("cispo",)


def method_config(name: str, recipe: str = "paper") -> dict:
    """`CEGPPOConfig` keyword arguments that select method `name` (one of `METHODS`) under `recipe` ("paper" or
    "authors", the module docstring); the same keys for every method, so one dict after another switches cleanly."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}; choose one of {list(METHODS)}.")
    if recipe not in RECIPES:
        raise ValueError(f"Unknown recipe {recipe!r}; choose one of {list(RECIPES)}.")
    additions = PAPER_ADDITIONS if name in PASSTHROUGH_METHODS else RECIPES[recipe]
    return {**DEFAULTS, **additions, **METHODS[name]}


def markdown_table() -> str:
    """The methods table of docs/configuration.md: each method's fields that differ from CE-GPPO's (plus CE-GPPO's own)."""
    rows = ["| method | `CEGPPOConfig` fields (`cegppo_trl.research.baselines.method_config`) |", "|---|---|"]
    reference = method_config("cegppo")
    for name in METHODS:
        config = method_config(name)
        fields = config if name == "cegppo" else {k: v for k, v in config.items() if reference[k] != v}
        keys = [k for k in config if k in fields and k not in PAPER_ADDITIONS]
        rows.append(f"| `{name}` | " + ", ".join(f"`{k}={config[k]!r}`" for k in keys) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
