"""Helpers shared by the code tool and reward tests: bubblewrap availability and leftover-process checks."""

from __future__ import annotations

import glob
import os
import time

import pytest

from agentrl_jax.tools import sandbox
from agentrl_jax.tools.base import ToolConfig

# CI must not pass by skipping: with CI=true a missing sandbox prerequisite fails the tests that need it.
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
needs_bwrap = pytest.mark.skipif(sandbox.bwrap_path() is None and not CI,
                                 reason="bubblewrap is not installed (launch/setup.sh installs it when root)")


def missing(reason: str) -> None:
  """Skips the test for a missing sandbox prerequisite; under CI=true fails it instead."""
  if CI:
    pytest.fail(f"{reason} (CI=true: a missing sandbox prerequisite fails the run)")
  pytest.skip(reason)


def processes_in_pid_namespace(inode: int, started_before: float | None = None) -> list[int]:
  """Host pids of the processes living in the pid namespace with this inode.

  The kernel reuses namespace inodes once a namespace is gone (other sandboxes on a shared machine get them), so
  with `started_before` (seconds since boot, `boot_time()` right after the call) only processes that started
  before then count: a leftover of the call did.
  """
  ticks = os.sysconf("SC_CLK_TCK")
  pids = []
  for path in glob.glob("/proc/[0-9]*"):
    try:
      if os.stat(os.path.join(path, "ns", "pid")).st_ino != inode:
        continue
      with open(os.path.join(path, "stat")) as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
    except (OSError, ValueError, IndexError):
      continue
    if started_before is None or start <= started_before:
      pids.append(int(os.path.basename(path)))
  return pids


def leftovers(inode: int, started_before: float, grace_s: float = 3.0) -> list[int]:
  """`processes_in_pid_namespace`, polled until empty for up to `grace_s`: when a sandbox's pid 1 exits, the
  kernel kills the rest of its namespace, and on a loaded host the last of them can take a moment to be reaped;
  and a namespace's inode number is reused at once, so a sandbox started meanwhile (another test's, with
  pytest-xdist) can show up under it until it ends. A daemon that escaped would stay."""
  deadline = time.monotonic() + grace_s
  while (pids := processes_in_pid_namespace(inode, started_before)) and time.monotonic() < deadline:
    time.sleep(0.05)
  return pids


def boot_time() -> float:
  """Seconds since boot, the clock of /proc/PID/stat's start time."""
  return time.clock_gettime(time.CLOCK_BOOTTIME)


def local_pool(concurrency: int = 2, **cfg) -> sandbox.LocalExecutor:
  """A local executor (skips the test when bubblewrap is missing)."""
  if sandbox.bwrap_path() is None:
    missing("bubblewrap is not installed")
  return sandbox.LocalExecutor(ToolConfig(**{"timeout_s": 10.0, "memory_mb": 512, **cfg},
                                          max_concurrency=concurrency))


def bwrap_children() -> list[int]:
  """Our child processes (running or zombie) that are bubblewrap."""
  out = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      with open(f"/proc/{pid}/comm") as f:
        comm = f.read().strip()
    except OSError:
      continue
    if int(fields[1]) == os.getpid() and comm == "bwrap":
      out.append(int(pid))
  return out
