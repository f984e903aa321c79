"""The persistent compilation cache: its keys depend on the program, not on where the cache lives."""

import os
import subprocess
import sys

PROGRAM = """
import sys
import jax, jax.numpy as jnp
from agentrl_jax import compile_stats
compile_stats.enable_compilation_cache(sys.argv[1])
jax.jit(lambda x: jnp.tanh(x) * 3 + 1)(jnp.ones(7))
"""


def _entries(cache_dir) -> set[str]:
  return {f for f in os.listdir(cache_dir) if f.startswith("jit_")}


def test_cache_keys_do_not_depend_on_the_cache_path(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  for name in ("a", "b/nested"):
    subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / name)], env=env, check=True, timeout=120)
  a, b = _entries(tmp_path / "a"), _entries(tmp_path / "b/nested")
  assert any(e.startswith("jit__lambda-") for e in a)
  # The same programs, under the same keys: a moved or copied cache (workdir) hits.
  assert a == b
