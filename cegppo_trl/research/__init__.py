"""The research layer: instruments for studying CE-GPPO, used by the entropy studies and by no training run.

The core (`cegppo_trl` outside `research/` and `demos/`) imports nothing from here. Import the modules by name
(nothing is imported here):

- `probe`: the β-response probe (`cegppo probe`, `run_probe`): how (β1, β2) move entropy on a model, measured from
  shared branch points.
- `stats`: paired statistics over branch points or seeds (`sign_flip_p`, `t_interval`, `holm`).
- `baselines`: CE-GPPO and the paper's baselines as `CEGPPOConfig` fields (`method_config`, `METHODS`).
"""
