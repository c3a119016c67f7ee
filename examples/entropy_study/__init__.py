"""Entropy studies of CE-GPPO: research code beside the library, not part of the `cegppo_trl` package.

Run from the repository root (each module is a command line; `--help` lists its options):

- `python -m examples.entropy_study.addition`: the first study, on the quickstart's tiny Llama and 2-digit addition
  (one right answer per prompt, completions of at most 4 tokens).
- `python -m examples.entropy_study.digits`: the second study, on a task with many right answers ("write 4 digits
  whose sum is S, each followed by the running total", 19-23 tokens, 84-670 correct answers per prompt), with the
  entropy controller, diversity probes and a stability grid.
- `python -m examples.entropy_study.confirm`: the third study, confirming the left-side guard against the β1
  collapse (`delta_low` / `delta_low_mode`) on settings it was not developed on, on both tasks.
- `python -m examples.entropy_study.random_reward`: the clipping rule alone against entropy, on SmolLM2-135M-Instruct
  with a reward independent of the text (five (β1, β2) arms, three seeds).
- `python -m examples.entropy_study.probe_study`: the β-response probe (`cegppo probe`) on SmolLM2-135M-Instruct,
  six (β1, β2) arms branched from the same states at 12 branch points (examples/entropy_study/RESULTS.md).
- `python -m examples.entropy_study.mechanism`: why β2 lowered entropy there, β2 on one class of right-clipped tokens
  at a time (`log p < -H` or not) at two temperatures, and `gppo_beta_rule="entropy"` against the paper's rule.

Results and their discussion: examples/entropy_study/RESULTS.md.
"""
