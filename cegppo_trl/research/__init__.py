"""The research layer: instruments for studying CE-GPPO, opt-in and off the default training path.

The core (`cegppo_trl` outside `research/` and `demos/`) imports nothing from here; import the modules by name:
`trainer` (`ResearchCEGPPOTrainer`: the entropy `controller`, the entropy β rule and the predictor of `diagnostics`),
`probe` (`cegppo probe`), `stats` (paired statistics), `baselines` (the methods as `CEGPPOConfig` fields).
"""
