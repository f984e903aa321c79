"""Ahead-of-time pre-flight of a config on a TPU slice, from any host (a CPU laptop or CI box is enough).

    python -m agentrl_jax.aot --config=configs/demystify_qwen3_4b.py --topology=v5p:2x2x2 [--config.a.b=...]

builds the run's meshes over the chips of a real TPU slice (`jax.experimental.topologies`, with `libtpu`
installed) and compiles, with the real TPU compiler (XLA:TPU and Mosaic for the Pallas kernels), every program a
run of that config compiles, at the config's true shapes (`programs.for_config`). For each program it reports
the compile CPU seconds, the generated code size, the per-chip HBM the compiler plans (arguments, outputs,
temporaries) against the chip's HBM, the compiler's own cost analysis, and a roofline step-time estimate from
the chip's data-sheet peak and bandwidth (`programs.Estimate`). A program that does not fit fails the command,
naming the program, the bytes it needs, and the largest rollout rows or micro-batch that fit.

This is what MaxText's `train_compile.py` does for one training step, for every program of the recipe: the
parameter and optimizer inits, SFT step, RL update, log-prob scoring, rollout prefill / decode / extend for every
cache capacity the run can reach, and the evaluation's rollout programs. A program's HBM is the compiler's plan
plus what stays resident beside it (AdamW moments, a KL term's reference parameters). A program whose lowered
module equals an earlier one's (the evaluation's cache initialisation) is marked `same_as` it and keeps its own
compile cost (a run compiles each jitted function).
"""

from agentrl_jax.aot.report import CompiledProgram, compile_all, format_table, main

__all__ = ["CompiledProgram", "compile_all", "format_table", "main"]
