"""Which TRL releases `CEGPPOTrainer` is correct on, and the refusal before training on any other.

`CEGPPOTrainer._compute_loss` is a copy of TRL's, and the rollout-batch normalisers rely on how TRL builds and splits
a rollout batch. Each TRL source the package relies on (`TRL_GUARDED_SOURCES`, with what it must keep doing) is
fingerprinted by its code, not its text (`source_fingerprint`), and compared with the fingerprints of the releases
the package was tested on (`TRL_SOURCE_FINGERPRINTS`). Where a tested release differs from the newest in a way the
trainer must know about, the difference is a version-keyed fact (`TRL_RELEASE_FACTS`), not a second copy of the code.
`check_trl_compatibility` runs in `CEGPPOTrainer.__init__` before the model loads. docs/maintaining.md, "Bumping
TRL", says how to add a release.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import os
import textwrap
import warnings
from typing import Any

from packaging.version import Version

# The TRL internals this package relies on, each with what it must keep doing. A change in any of them can silently
# train plain GRPO or mis-normalise the loss, so their code is fingerprinted (`check_trl_compatibility`).
TRL_GUARDED_SOURCES = {
    "GRPOTrainer.compute_loss": "dispatches to `_compute_loss` (a fused-loss branch would train plain GRPO)",
    "GRPOTrainer._compute_loss": "is the method `CEGPPOTrainer._compute_loss` copies line for line",
    "GRPOTrainer._generate_and_score_completions": "calls `_calculate_rewards` once per rollout batch and gives "
    "process k the rows k * local .. (k + 1) * local of the gathered batch, the slice the SFT and dynamic-sampling "
    "masks take",
    "GRPOTrainer._calculate_rewards": "returns the rewards of every process, gathered in process order",
    "GRPOTrainer._prepare_inputs": "splits each rollout batch into `steps_per_generation` micro-batches, the share "
    "the rollout-batch normalisers are divided by",
    "split_tensor_dict": "passes 0-d tensors (the rollout-batch counts) to every micro-batch unchanged",
    "shuffle_sequence_dict": "passes 0-d tensors through unshuffled",
}

# `GRPOConfig` fields that `CEGPPOConfig` validation, the trainer outside the copied method and the refusals below read
# by name (the copy reads its fields exactly as TRL's `_compute_loss` does, which the fingerprint covers). A release
# without one of them would fail after the model loaded, so their presence is checked with the sources.
TRL_CONFIG_FIELDS = (
    "beta",
    "delta",
    "epsilon",
    "epsilon_high",
    "gradient_accumulation_steps",
    "importance_sampling_level",
    "loss_type",
    "max_steps",
    "num_generations",
    "num_iterations",
    "steps_per_generation",
    "generation_batch_size",
    "temperature",
    "use_liger_kernel",
    "use_bias_correction_kl",
    "vespo_k_pos",
    "sapo_temperature_pos",
)

# Fingerprints (`source_fingerprint`) of each guarded source in every TRL release the package was tested on (the
# subset of .ci/trl_oldest.sh against that release; CI runs it on the oldest, the main suite on the newest). An entry
# is the output of `python -m cegppo_trl.trl_compat` with that release installed. Code-identical releases have equal
# fingerprints (1.15 has 1.16's, but cannot train on CPU: `TRL_RELEASE_FACTS`); TRL 1.9's `_compute_loss` is other code.
TRL_SOURCE_FINGERPRINTS: dict[str, dict[str, str]] = {
    "1.10.0": {
        "GRPOTrainer.compute_loss": "27b90214bf202c1fa9aa039dbbe2667be54d76fe3c2f8f79a59b0baf6ce6d74c",
        "GRPOTrainer._compute_loss": "01cd238ba70736604b7bdd95f56207632d49da4c29116cbadfcd4e08b6d5fe23",
        "GRPOTrainer._generate_and_score_completions": "8b242bb69b957ec8139330d669eea7edd0def5f5c4b05236b3824760e0aa4b1f",
        "GRPOTrainer._calculate_rewards": "3b288b3d259fe1b89cd8140b7e066f4715be9c63d90c09cd201da087305a9023",
        "GRPOTrainer._prepare_inputs": "e1b91d1675400c81c47efebd5c990d2b4a2bd8cbed448e043a00972874b98864",
        "split_tensor_dict": "161c36261cebf4ea778bf0e262581a4a29ddec63f953d0cbf883b2f78407204c",
        "shuffle_sequence_dict": "803e731f4aac5662fc9b81c732e4c108882f6bad878b8918ad812926ac8cfaa4",
    },
    "1.11.0": {
        "GRPOTrainer.compute_loss": "27b90214bf202c1fa9aa039dbbe2667be54d76fe3c2f8f79a59b0baf6ce6d74c",
        "GRPOTrainer._compute_loss": "01cd238ba70736604b7bdd95f56207632d49da4c29116cbadfcd4e08b6d5fe23",
        "GRPOTrainer._generate_and_score_completions": "4620f19c0ea821eac04b1e85a3771bd27068ad8bfc932de41f598fb0137628c8",
        "GRPOTrainer._calculate_rewards": "3b288b3d259fe1b89cd8140b7e066f4715be9c63d90c09cd201da087305a9023",
        "GRPOTrainer._prepare_inputs": "e1b91d1675400c81c47efebd5c990d2b4a2bd8cbed448e043a00972874b98864",
        "split_tensor_dict": "161c36261cebf4ea778bf0e262581a4a29ddec63f953d0cbf883b2f78407204c",
        "shuffle_sequence_dict": "803e731f4aac5662fc9b81c732e4c108882f6bad878b8918ad812926ac8cfaa4",
    },
    "1.12.0": {
        "GRPOTrainer.compute_loss": "27b90214bf202c1fa9aa039dbbe2667be54d76fe3c2f8f79a59b0baf6ce6d74c",
        "GRPOTrainer._compute_loss": "01cd238ba70736604b7bdd95f56207632d49da4c29116cbadfcd4e08b6d5fe23",
        "GRPOTrainer._generate_and_score_completions": "4620f19c0ea821eac04b1e85a3771bd27068ad8bfc932de41f598fb0137628c8",
        "GRPOTrainer._calculate_rewards": "3b288b3d259fe1b89cd8140b7e066f4715be9c63d90c09cd201da087305a9023",
        "GRPOTrainer._prepare_inputs": "e1b91d1675400c81c47efebd5c990d2b4a2bd8cbed448e043a00972874b98864",
        "split_tensor_dict": "161c36261cebf4ea778bf0e262581a4a29ddec63f953d0cbf883b2f78407204c",
        "shuffle_sequence_dict": "803e731f4aac5662fc9b81c732e4c108882f6bad878b8918ad812926ac8cfaa4",
    },
    "1.13.0": {
        "GRPOTrainer.compute_loss": "27b90214bf202c1fa9aa039dbbe2667be54d76fe3c2f8f79a59b0baf6ce6d74c",
        "GRPOTrainer._compute_loss": "01cd238ba70736604b7bdd95f56207632d49da4c29116cbadfcd4e08b6d5fe23",
        "GRPOTrainer._generate_and_score_completions": "4620f19c0ea821eac04b1e85a3771bd27068ad8bfc932de41f598fb0137628c8",
        "GRPOTrainer._calculate_rewards": "3b288b3d259fe1b89cd8140b7e066f4715be9c63d90c09cd201da087305a9023",
        "GRPOTrainer._prepare_inputs": "e1b91d1675400c81c47efebd5c990d2b4a2bd8cbed448e043a00972874b98864",
        "split_tensor_dict": "161c36261cebf4ea778bf0e262581a4a29ddec63f953d0cbf883b2f78407204c",
        "shuffle_sequence_dict": "803e731f4aac5662fc9b81c732e4c108882f6bad878b8918ad812926ac8cfaa4",
    },
    "1.14.0": {
        "GRPOTrainer.compute_loss": "10a102fd553c331cfdf88adcd25c8dff87f8883303e96ea8c331fbe5ee9f1186",
        "GRPOTrainer._compute_loss": "01cd238ba70736604b7bdd95f56207632d49da4c29116cbadfcd4e08b6d5fe23",
        "GRPOTrainer._generate_and_score_completions": "eaf654c0220346a2361ead45bde4b1faa8477bf361773e4e3af12032db4fccb3",
        "GRPOTrainer._calculate_rewards": "4a8f9f800171b5265812e63a7d0bd5c3e46e39c400b914b3ebda11b024220351",
        "GRPOTrainer._prepare_inputs": "e1b91d1675400c81c47efebd5c990d2b4a2bd8cbed448e043a00972874b98864",
        "split_tensor_dict": "161c36261cebf4ea778bf0e262581a4a29ddec63f953d0cbf883b2f78407204c",
        "shuffle_sequence_dict": "803e731f4aac5662fc9b81c732e4c108882f6bad878b8918ad812926ac8cfaa4",
    },
    "1.16.0": {
        "GRPOTrainer.compute_loss": "270b88e863c6965853e8f9c2c3f462c159ee5ad8bee0abca3c4050674376ab18",
        "GRPOTrainer._compute_loss": "01cd238ba70736604b7bdd95f56207632d49da4c29116cbadfcd4e08b6d5fe23",
        "GRPOTrainer._generate_and_score_completions": "354a729d24e5c7df7764e37cb91c090783618e3252d44bf4b3cdb9fd7fd692a4",
        "GRPOTrainer._calculate_rewards": "4a8f9f800171b5265812e63a7d0bd5c3e46e39c400b914b3ebda11b024220351",
        "GRPOTrainer._prepare_inputs": "e1b91d1675400c81c47efebd5c990d2b4a2bd8cbed448e043a00972874b98864",
        "split_tensor_dict": "161c36261cebf4ea778bf0e262581a4a29ddec63f953d0cbf883b2f78407204c",
        "shuffle_sequence_dict": "803e731f4aac5662fc9b81c732e4c108882f6bad878b8918ad812926ac8cfaa4",
    },
}

# What a TRL release does differently from the newest tested one, where the package must act on it (each key says
# which releases a fact covers; `config_refusal` and `missing_trl_kernel` act on them).
TRL_RELEASE_FACTS = {
    # TRL < 1.14's `compute_loss` sends `use_liger_kernel=True` to Liger's fused GRPO loss, which never calls
    # `_compute_loss`: it would train TRL's clipped surrogate under the CE-GPPO name.
    "liger_fused_loss_before": "1.14.0",
    # TRL 1.15's `GRPOTrainer` computes every log-probability with a triton kernel (`trl.kernels.chunked_logprob`),
    # imported only when triton is installed and run only on a GPU: on CPU its own first step fails. Not in the pin.
    "gpu_only_log_probs": "1.15",
}

SKIP_DRIFT_CHECK_ENV = "CEGPPO_SKIP_TRL_DRIFT_CHECK"


def source_fingerprint(source: str) -> str:
    """sha256 of the code of one function's source: its syntax tree, without comments, formatting or docstrings.

    Comments and layout never reach the tree, so a comment or formatting change (TRL 1.14 -> 1.15's `_compute_loss`)
    keeps the fingerprint, while any change of a name, constant, operator or statement changes it. Docstrings are
    dropped too: they are string constants in the tree but cannot change what the function computes, and TRL edits
    them on their own. The tree is written out by `_canonical` rather than `ast.dump`, whose text differs between
    Python versions (empty fields such as 3.12's `type_params=[]`, dropped by `ast.dump` from 3.13).
    """
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()


def _canonical(node: Any) -> str:
    """The tree as text: node types and fields, no positions, empty fields left out (the same on every Python)."""
    if isinstance(node, ast.AST):
        parts = [
            f"{name}={_canonical(value)}"
            for name, value in ast.iter_fields(node)
            if value is not None and value != [] and name != "kind"  # `kind`: the `u` prefix of a string literal
        ]
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return f"[{', '.join(_canonical(item) for item in node)}]"
    return repr(node)  # constants and identifiers: repr keeps 1 apart from 1.0 and "1"


def _guarded_objects() -> dict[str, Any]:
    """The installed TRL's object for each guarded source (None for one it lacks)."""
    from trl import GRPOTrainer
    from trl.trainer import grpo_trainer  # the functions as the trainer module uses them, wherever they come from

    objects = {}
    for name in TRL_GUARDED_SOURCES:
        owner, _, attribute = name.rpartition(".")
        objects[name] = getattr(GRPOTrainer if owner else grpo_trainer, attribute, None)
    return objects


# Fingerprints by function object: a trainer is built many times per process (tests, sweeps) and parsing TRL's
# sources took 0.5 s each time; a patched or reloaded function is a new object and is fingerprinted afresh.
_FINGERPRINT_CACHE: dict[Any, str] = {}


def _fingerprint_of(obj: Any) -> str:
    if obj not in _FINGERPRINT_CACHE:
        _FINGERPRINT_CACHE[obj] = source_fingerprint(inspect.getsource(obj))
    return _FINGERPRINT_CACHE[obj]


def trl_source_fingerprints() -> dict[str, str]:
    """The fingerprint of the installed TRL's source of each of `TRL_GUARDED_SOURCES` (`"missing"`: TRL lacks it)."""
    return {name: "missing" if obj is None else _fingerprint_of(obj) for name, obj in _guarded_objects().items()}


def matching_release(installed: dict[str, str] | None = None) -> str | None:
    """The newest tested release whose guarded sources all have the installed TRL's code, or None."""
    installed = trl_source_fingerprints() if installed is None else installed
    for release in sorted(TRL_SOURCE_FINGERPRINTS, key=Version, reverse=True):
        if installed == TRL_SOURCE_FINGERPRINTS[release]:
            return release
    return None


def trl_source_changes(installed: dict[str, str] | None = None) -> list[str]:
    """The guarded TRL sources that differ from every tested release (an empty list: the code of a tested release).

    Compared with the tested release closest to the installed one (the same version, else the one with the most
    identical sources), so the list names what changed rather than everything that differs from some release.
    """
    import trl

    installed = trl_source_fingerprints() if installed is None else installed
    if matching_release(installed) is not None:
        return []
    reference = TRL_SOURCE_FINGERPRINTS.get(trl.__version__) or max(
        TRL_SOURCE_FINGERPRINTS.values(),
        key=lambda prints: sum(installed[name] == prints.get(name) for name in installed),
    )
    return [name for name in TRL_GUARDED_SOURCES if installed[name] != reference.get(name)]


def supported_trl_requirement() -> str:
    """The `pip install` requirement for a supported TRL (the pin in pyproject.toml, with its upper end tested)."""
    left_out = TRL_RELEASE_FACTS["gpu_only_log_probs"]
    return f"trl>={oldest_tested_release()},!={left_out}.*,<={newest_tested_release()}"


def newest_tested_release() -> str:
    return max(TRL_SOURCE_FINGERPRINTS, key=Version)


def oldest_tested_release() -> str:
    return min(TRL_SOURCE_FINGERPRINTS, key=Version)


def missing_config_fields() -> list[str]:
    """`TRL_CONFIG_FIELDS` the installed `GRPOConfig` lacks."""
    from trl import GRPOConfig

    present = {f.name for f in dataclasses.fields(GRPOConfig)}
    return [name for name in TRL_CONFIG_FIELDS if name not in present]


def missing_trl_kernel(args: Any = None) -> str | None:
    """Why the installed TRL's own `GRPOTrainer` cannot compute log-probabilities in this run, or None."""
    import torch
    import trl
    from trl.trainer import utils

    series = TRL_RELEASE_FACTS["gpu_only_log_probs"]
    if Version(trl.__version__).release[:2] != Version(series).release[:2]:
        return None
    on_cpu = not torch.cuda.is_available() or getattr(args, "use_cpu", False)
    if on_cpu or getattr(utils, "_ChunkedLogProbFunction", None) is None:
        return (
            f"trl {trl.__version__} computes every log-probability with a triton kernel that needs triton and a GPU "
            f"({'no GPU in this run' if on_cpu else 'triton is not installed'}): its GRPOTrainer would fail at the "
            f"first training step. Install a supported TRL (`pip install '{supported_trl_requirement()}'`)."
        )
    return None


def config_refusal(args: Any, release: str, version: str | None = None) -> str | None:
    """Why `args` cannot train CE-GPPO on the code of tested TRL `release` (installed as `version`), or None."""
    if Version(release) < Version(TRL_RELEASE_FACTS["liger_fused_loss_before"]) and getattr(
        args, "use_liger_kernel", False
    ):
        return (
            f"`use_liger_kernel=True` with trl {version or release}: before trl "
            f"{TRL_RELEASE_FACTS['liger_fused_loss_before']}, `GRPOTrainer.compute_loss` sends it to Liger's fused "
            "GRPO loss, which never calls the CE-GPPO loss and would train plain GRPO. Set `use_liger_kernel=False`, "
            f"or install trl>={TRL_RELEASE_FACTS['liger_fused_loss_before']} (newest tested: "
            f"{newest_tested_release()})."
        )
    return None


def check_trl_compatibility(args: Any = None) -> None:
    """Raise before the model loads unless the installed TRL has the code of a tested release and `args` suit it.

    A TRL release outside the tested range whose guarded sources all match a tested release trains, with a warning
    (its code is that release's); any other refuses, naming each changed source and the newest tested release.

    Raises:
        RuntimeError: naming the installed TRL version, each changed source and what it must keep doing (or each
            missing `GRPOConfig` field), the newest tested release, and how to proceed.
        ValueError: `args` asks for something the installed release would silently do differently (e.g.
            `use_liger_kernel` before TRL 1.14), or the installed TRL cannot run here (TRL 1.15 on CPU,
            `missing_trl_kernel`).
    """
    import trl

    installed = trl_source_fingerprints()
    release = matching_release(installed)
    missing = missing_config_fields()
    newest = newest_tested_release()
    tested = f"tested: {oldest_tested_release()} to {newest}"
    if release is not None and not missing:
        if Version(trl.__version__) > Version(newest):
            warnings.warn(
                f"trl {trl.__version__} is newer than the newest release cegppo_trl was tested on ({newest}); every "
                f"TRL source it relies on has the code of trl {release}, so training proceeds. This "
                "combination is not covered by cegppo_trl's tests; a cegppo-trl release that lists it is.",
                stacklevel=3,
            )
        refusal = missing_trl_kernel(args) or (
            None if args is None else config_refusal(args, release, trl.__version__)
        )
        if refusal is not None:
            raise ValueError(refusal)
        return
    if missing:
        details = f"`GRPOConfig` has no field(s) {missing}, which cegppo_trl reads"
    else:
        details = "; ".join(f"`{name}`, which {TRL_GUARDED_SOURCES[name]}" for name in trl_source_changes(installed))
    message = (
        f"cegppo_trl relies on TRL internals that changed in the installed trl {trl.__version__} ({tested}): "
        f"{details}. Training could silently lose a TRL feature or mis-normalise the loss. Install a tested TRL "
        f"(`pip install '{supported_trl_requirement()}'`), or set {SKIP_DRIFT_CHECK_ENV}=1 to train "
        "anyway at your own risk."
    )
    if os.environ.get(SKIP_DRIFT_CHECK_ENV) == "1":
        warnings.warn(message, stacklevel=3)
        return
    raise RuntimeError(message)


if __name__ == "__main__":  # `python -m cegppo_trl.trl_compat`: the entry of the installed release, to paste above
    import trl

    print(f'    "{trl.__version__}": {{')
    for name, fingerprint in trl_source_fingerprints().items():
        print(f'        "{name}": "{fingerprint}",')
    print("    },")
    print(f"# matches tested release: {matching_release()}; GRPOConfig lacks: {missing_config_fields() or 'nothing'}")
