"""The benchmarks' regression guard (`agentrl_jax.bench.guard`): the bounds themselves (fast), and each benchmark
run at its `--smoke` size and held to them (slow: `bash launch/test.sh -m slow`)."""

import json
import os
import subprocess
import sys

import pytest

from agentrl_jax.bench import common, guard
from agentrl_jax.tools import sandbox
from agentrl_jax.tools.base import ToolConfig
from tests.bench.conftest import CI
from tests.tools.sandbox_testing import needs_bwrap


def _sampler_line(step_ms, floor_ms, tunix=None):
  return {"bench": "sampler", "size": "bench_5m", "ours_step_ms": step_ms, "xla_step_floor_ms": floor_ms,
          "speedup_tunix": tunix, "speedup_hf": None}


def _bound(bench, scale, figure):
  (bound,) = [b for b in guard.THRESHOLDS[bench][scale] if b.figure == figure]
  return bound.value


@pytest.mark.parametrize("scale", ["full", "smoke"])
def test_a_decode_step_a_third_slower_fails_the_guard_and_names_the_figure(scale):
  # A healthy run a little inside both bounds ...
  step, tunix = _bound("sampler", scale, "step_over_floor") / 1.05, _bound("sampler", scale, "speedup_tunix") * 1.05
  assert guard.check("sampler", _sampler_line(step, 1.0, tunix=tunix), scale) == []
  # ... with a third of its speed lost: the step takes 1.5x as long, and the speedup over Tunix falls to 2/3.
  failures = guard.check("sampler", _sampler_line(step * 1.5, 1.0, tunix=tunix * 2 / 3), scale)
  assert [f.split(":")[1].split("=")[0].strip() for f in failures] == ["step_over_floor", "speedup_tunix"]
  assert "(bench_5m)" in failures[0] and f"({scale})" in failures[0]


def test_figures_a_run_did_not_measure_are_not_checked():
  assert guard.check("sampler", _sampler_line(1.2, 1.0, tunix=None), "full") == []
  line = {"bench": "update", "model": "bench_58m", "mfu": 0.6, "mfu_at_step_floor": 0.7, "speedup": None}
  assert guard.check("update", line, "full") == []


def test_rollout_exactness_is_part_of_the_guard():
  line = {"speedup": 4.0, "compile_frac_of_round": 0.2, "transcripts_match": True, "prefilled_tokens": 10,
          "expected_prefill_tokens": 10}
  assert guard.check("rollout", line, "full") == []
  assert "prefill_exact" in guard.check("rollout", dict(line, prefilled_tokens=11), "full")[0]
  assert "transcripts_match" in guard.check("rollout", dict(line, transcripts_match=False), "full")[0]
  # the default capacity ladder's compile (0.78-0.81 of a round, measured) passes; a quarter more fails
  assert guard.check("rollout", dict(line, compile_frac_of_round=0.8), "full") == []
  assert "compile_frac_of_round" in guard.check("rollout", dict(line, compile_frac_of_round=1.05), "full")[0]


@pytest.mark.parametrize("bench", sorted(guard.MEASURED))
def test_every_smoke_bound_sits_between_the_measured_value_and_a_third_lost(bench):
  """Each smoke threshold passes what `--smoke` measured on the loaded 2-core machine (`guard.MEASURED`) and
  fails the same figure a third worse (a time 1.5x, a speedup or MFU 2/3 of it); exactness bounds pass only
  exact runs."""
  for bound in guard.THRESHOLDS[bench]["smoke"]:
    if bound.figure in guard.EXACT:
      assert (bound.kind, bound.value) == ("min", 1)
      continue
    measured = guard.MEASURED[bench][bound.figure]
    assert bound.holds(measured), (bench, bound, measured)
    worse = measured * 1.5 if bound.kind == "max" else measured * 2 / 3
    assert not bound.holds(worse), (bench, bound, measured)


# Modules of agentrl_jax/bench that are not benchmarks held to the guard, and why.
NOT_GUARDED = {
    "__init__": "the package", "common": "shared helpers", "guard": "the guard itself",
    "sampler_tunix": "the Tunix peer's worker (runs in .venv-tunix)", "update_tunix": "the Tunix peer's worker",
    "device": "accelerator only (launch/device_bench.sh on a lent GPU), ratios recorded in the closing notes",
    "lora": "a design comparison (the sampler on unmerged adapters or merged weights), not a figure of ours "
            "against a floor or a peer",
    "async_schedule": "a model of the asynchronous schedule (it times nothing), to read bench.async_rl against",
}


def test_every_benchmark_takes_smoke_and_no_check():
  bench_dir = os.path.join(common.REPO_ROOT, "agentrl_jax", "bench")
  mods = sorted(f[:-3] for f in os.listdir(bench_dir) if f.endswith(".py"))
  assert set(NOT_GUARDED) <= set(mods)
  guarded = [m for m in mods if m not in NOT_GUARDED]
  assert sorted(guard.THRESHOLDS) == sorted(guard.FIGURES) == sorted(guarded)
  for mod in guarded:
    src = open(os.path.join(bench_dir, f"{mod}.py")).read()
    assert "guard.parse_args(" in src and f'guard.judge("{mod}"' in src and "guard.exit_on(" in src, mod


def test_the_guard_line_names_the_figures_a_run_left_out():
  line = _sampler_line(1.2, 1.0, tunix=None)
  assert guard.judge("sampler", line, "full") == []
  assert line["guard"] == {"scale": "full", "passed": True, "failures": [], "skipped": ["speedup_tunix", "speedup_hf"]}


def _tunix_args() -> tuple[str, ...]:
  """Nothing with the Tunix venv. Without it `--no-tunix`: the floor ratio alone, the peer's figure skipped (the
  line's `guard.skipped` says so); under CI=true a failure instead, as CI must hold the peer's ratio."""
  if common.tunix_python() is not None:
    return ()
  if CI:
    pytest.fail(f"{common.TUNIX_VENV} is missing under CI=true: the guard would skip the Tunix ratio")
  return ("--no-tunix",)


def _run_smoke(module, *extra):
  res = subprocess.run([sys.executable, "-m", f"agentrl_jax.bench.{module}", "--smoke", *extra],
                       cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=1500,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
  fails = [x for x in res.stderr.splitlines() if "[bench guard] FAIL" in x]
  assert res.returncode == 0, (fails or res.stderr[-3000:], lines)
  assert lines and all(x["guard"]["passed"] and x["guard"]["scale"] == "smoke" for x in lines), lines
  return lines


@pytest.mark.slow
@pytest.mark.bench
def test_sampler_smoke_holds_its_ratios():
  _run_smoke("sampler", *_tunix_args())


@pytest.mark.slow
@pytest.mark.bench
def test_async_rl_smoke_holds_its_ratios():
  _run_smoke("async_rl")


@pytest.mark.slow
@pytest.mark.bench
def test_rollout_smoke_holds_its_ratios():
  _run_smoke("rollout")


@pytest.mark.slow
@pytest.mark.bench
def test_update_smoke_holds_its_ratios():
  _run_smoke("update", *_tunix_args())


@pytest.mark.slow
@pytest.mark.bench
@needs_bwrap
def test_sandbox_smoke_holds_its_ratios():
  with sandbox.LocalExecutor(ToolConfig(timeout_s=5.0, memory_mb=512, max_concurrency=1)) as probe:
    if probe.local_mode != "worker":  # the benchmark compares both modes
      pytest.skip(f"worker mode is not available here: {probe.worker_unavailable}")
  _run_smoke("sandbox")
