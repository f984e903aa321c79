"""Slow sandbox checks (run with `-m slow`): many hostile programs at once, and sustained load, in both modes."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from agentrl_jax.tools import sandbox
from agentrl_jax.tools.base import ToolConfig
from tests.tools.sandbox_testing import boot_time, leftovers, needs_bwrap
from tests.tools.test_tools_sandbox import HOSTILE

pytestmark = [pytest.mark.slow, needs_bwrap]


def test_hostile_programs_all_at_once_are_contained():
  names = sorted(HOSTILE) * 3
  records: list[dict] = [{} for _ in names]
  cfg = ToolConfig(timeout_s=3.0, memory_mb=256)
  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(len(names)) as threads:
    futures = [threads.submit(sandbox.run_python, HOSTILE[n][0], timeout_s=3.0, memory_mb=256, cfg=cfg,
                              on_start=records[i].update) for i, n in enumerate(names)]
    results = [f.result() for f in futures]
  ended = boot_time()
  wall = time.monotonic() - start
  for name, r, rec in zip(names, results, records):
    # 39 programs (fork bombs and busy loops among them) on 2 cores: a benign one may be starved into a timeout.
    assert r.status in HOSTILE[name][1] | {"timeout"}, (name, r.status, r.stderr[-300:])
    assert r.wall_s <= 3.0 + 3.0, (name, r.wall_s)
    assert leftovers(rec["pid-namespace"], ended) == []
  # All ran concurrently on 2 cores: bounded by the timeout plus the teardown, not by the sum.
  assert wall < 3.0 + 15.0


def test_hostile_programs_at_once_through_a_worker_pool():
  names = sorted(HOSTILE) * 2
  with sandbox.LocalExecutor(ToolConfig(timeout_s=3.0, memory_mb=256, max_concurrency=8)) as executor:
    records: list[dict] = [{} for _ in names]
    with concurrent.futures.ThreadPoolExecutor(8) as threads:
      futures = [threads.submit(executor.run, HOSTILE[n][0], on_start=records[i].update) for i, n in enumerate(names)]
      results = [f.result() for f in futures]
    ended = boot_time()
    for name, r, rec in zip(names, results, records):
      assert r.status in HOSTILE[name][1] | {"timeout"}, (name, r.status, r.stderr[-300:])
      assert leftovers(rec["pid-namespace"], ended) == []
    assert executor.run("print(1)").stdout == "1\n"  # the workers survived it all


@pytest.mark.parametrize("mode", ["per_call", "worker"])
def test_sustained_load_through_the_pool(mode):
  with sandbox.LocalExecutor(ToolConfig(timeout_s=10.0, memory_mb=256, max_concurrency=4, local_mode=mode)) as executor:
    start = time.monotonic()
    results = executor.run_batch([f"print({i} ** 2)" for i in range(400)])
    per_call = (time.monotonic() - start) / 400
  assert [r.stdout for r in results] == [f"{i ** 2}\n" for i in range(400)]
  print(f"sandbox throughput ({mode}): {1 / per_call:.1f} calls/s at concurrency 4")
