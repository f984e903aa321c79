"""An in-process stand-in for the sandbox executor (tests, benchmarks): same `Executor` protocol, no isolation.

    executor = stub_executor(lambda code: ExecResult("ok", stdout="4\\n"), latency_s=0.05)

NEVER use it for model-written code outside tests: `python_eval` runs code in this process.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable

from agentrl_jax.tools.base import ExecResult, PoolExecutor


def stub_executor(fn: Callable[[str], ExecResult], *, latency_s: float = 0.0, max_concurrency: int = 256
                  ) -> PoolExecutor:
  """A thread-pool executor whose programs are answered by `fn(code)` after `latency_s` seconds (a sleep, so
  concurrent calls overlap as real sandboxed processes would)."""

  def run_one(code: str, stdin: str) -> ExecResult:
    del stdin
    t0 = time.perf_counter()
    if latency_s:
      time.sleep(latency_s)
    res = fn(code)
    return ExecResult(res.status, res.stdout, res.stderr, res.exit_code, time.perf_counter() - t0)

  return PoolExecutor(run_one, max_concurrency, "stub-executor")


def python_eval(code: str) -> ExecResult:
  """Runs trusted test code in-process, capturing stdout (single-threaded tests only: redirects sys.stdout)."""
  out = io.StringIO()
  try:
    with contextlib.redirect_stdout(out):
      exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
  except Exception as e:  # pylint: disable=broad-except
    return ExecResult("error", out.getvalue(), f"{type(e).__name__}: {e}", 1)
  return ExecResult("ok", out.getvalue(), "", 0)
