"""The recipe as one job: data -> real teacher trajectories -> SFT -> eval -> model-aware filter -> GRPO-TCR ->
eval -> report, each stage the project's own job code in its own workdir (`configs/default.py`)."""
