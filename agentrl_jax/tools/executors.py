"""Picks the code executor a `ToolConfig` names. Lives above the backends so that the interface (`base.py`)
never imports its implementations.

    from agentrl_jax import tools
    with tools.make_executor(tools.ToolConfig(timeout_s=10)) as executor:
      executor.submit("print(2 ** 10)").result().stdout   # '1024\\n'
"""

from __future__ import annotations

from agentrl_jax.tools import sandbox, sandbox_fusion
from agentrl_jax.tools.base import PoolExecutor, ToolConfig


def make_executor(cfg: ToolConfig) -> PoolExecutor:
  """Builds the executor `cfg.backend` names.

  Raises:
    RuntimeError: the local backend cannot isolate programs here (no working bubblewrap) and
      `cfg.allow_unsandboxed` is False; the message says how to fix it.
  """
  if cfg.backend == "sandbox_fusion":
    return sandbox_fusion.SandboxFusionExecutor(cfg)
  return sandbox.LocalExecutor(cfg)
