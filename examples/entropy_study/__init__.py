"""Entropy studies of CE-GPPO: research code beside the library, not part of the `cegppo_trl` package.

Run from the repository root (each module is a command line; `--help` lists its options):

- `python -m examples.entropy_study.addition`: the first study, on the quickstart's tiny Llama and 2-digit addition
  (one right answer per prompt, completions of at most 4 tokens).
- `python -m examples.entropy_study.digits`: the second study, on a multi-solution task with 17-token completions
  ("write 16 digits whose sum is S"), with the entropy controller, diversity probes and a stability grid.

Results and their discussion: docs/entropy-study.md.
"""
