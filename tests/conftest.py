"""Shared pytest set-up: 8 fake CPU devices for sharding tests (must happen before JAX initialises)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
