"""Helpers shared by the code tool and reward tests: bubblewrap availability and leftover-process checks."""

from __future__ import annotations

import glob
import os

import pytest

from agentrl_jax.tools import sandbox
from agentrl_jax.tools.base import ToolConfig

needs_bwrap = pytest.mark.skipif(sandbox.bwrap_path() is None,
                                 reason="bubblewrap is not installed (launch/setup.sh installs it when root)")


def processes_in_pid_namespace(inode: int) -> list[int]:
  """Host pids of the processes living in the pid namespace with this inode."""
  pids = []
  for path in glob.glob("/proc/[0-9]*"):
    try:
      if os.stat(os.path.join(path, "ns", "pid")).st_ino == inode:
        pids.append(int(os.path.basename(path)))
    except OSError:
      pass
  return pids


def local_pool(concurrency: int = 2, **cfg) -> sandbox.LocalExecutor:
  """A local executor (skips the test when bubblewrap is missing)."""
  if sandbox.bwrap_path() is None:
    pytest.skip("bubblewrap is not installed")
  return sandbox.LocalExecutor(ToolConfig(**{"timeout_s": 10.0, "memory_mb": 512, **cfg},
                                          max_concurrency=concurrency))
