"""Shared fixtures: a tiny local Llama, a char tokenizer, a CE-GPPO trainer factory (no Hub, CPU only), one torch
thread. Helpers that tests import live in tests/helpers/ (the reference loss, hand-made batches)."""

from __future__ import annotations

import functools
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One torch thread per test process (and the processes it launches), unless OMP_NUM_THREADS says otherwise: the models
# here are tiny, and with two threads on two cores that another job shares every small op waits for the other thread
# (measured: tests/test_split_invariance.py + test_trainer_betas.py took 77-81 s with 2 threads and 6.5-7.4 s with 1,
# paired, on the 2-core CPU with a background job, 2026-12-01).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from helpers.batches import base_config_kwargs, count_ones_reward  # noqa: E402

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer  # noqa: E402
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def prompt_dataset():
    return Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(32)]})


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """A tiny Llama with its char tokenizer (and chat template) saved to disk, for tests that go through the CLI."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_char_tokenizer()
    build_tiny_llama(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def data_file(tmp_path_factory) -> str:
    """16 additions as a `.jsonl` file with `prompt` and `solution` columns."""
    path = tmp_path_factory.mktemp("data") / "add.jsonl"
    rows = [{"prompt": f"{i}+{i % 5}=", "solution": str(i + i % 5)} for i in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def make_trainer(tmp_path, tokenizer, prompt_dataset):
    """Factory: `make_trainer(trainer_cls=CEGPPOTrainer, config_cls=CEGPPOConfig, **config_overrides)`."""

    def _make(trainer_cls=CEGPPOTrainer, config_cls=CEGPPOConfig, reward_funcs=count_ones_reward, model=None, **kw):
        args = config_cls(**base_config_kwargs(tmp_path, **kw))
        model = model if model is not None else build_tiny_llama(tokenizer, seed=0)
        return trainer_cls(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=prompt_dataset,
            processing_class=tokenizer,
        )

    return _make


@pytest.fixture
def make_research_trainer(make_trainer):
    """`make_trainer` for `cegppo_trl.research`'s trainer and config (the entropy studies' options)."""
    from cegppo_trl.research.trainer import ResearchCEGPPOConfig, ResearchCEGPPOTrainer

    return functools.partial(make_trainer, trainer_cls=ResearchCEGPPOTrainer, config_cls=ResearchCEGPPOConfig)


@pytest.fixture
def one_torch_thread():
    """Tiny models on two shared cores: with two threads every small op waits on the other thread (much slower when
    another job shares the cores). Tests that train for many steps use one thread, as the quickstart does."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def ddp_two_process_run(tmp_path_factory):
    """tests/helpers/mp_train.py's job as 2-process DDP on CPU (torchrun, gloo), both loss types: the reference that
    one process, two nodes and DeepSpeed ZeRO-2/3 are compared with. Run once per session."""
    from helpers.mp_launch import TORCHRUN, free_port, run

    tmp = tmp_path_factory.mktemp("ddp")
    torchrun = [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", str(free_port())]
    return run(torchrun, tmp, ACCELERATE_USE_CPU="1")
