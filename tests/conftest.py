"""Shared pytest set-up: 8 fake CPU devices for sharding tests (must happen before JAX initialises), and a
persistent compilation cache shared by the test workers and the subprocesses they start (many tests compile
the same tiny programs; the resume tests compile the same run two or three times)."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The TPU compiler tests load libtpu in both pytest workers (and in the subprocesses they start).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "agentrl_jax_test_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
