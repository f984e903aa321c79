"""Smoke runs of the sampler and rollout benchmarks at a tiny size (~10 s each; the real runs are in their
docstrings): the numbers they print must be consistent with each other and with what the run did. The Tunix side
has its own test, skipped (with the reason) where .venv-tunix is missing."""

import contextlib
import io
import json

import pytest

from agentrl_jax.bench import common
from agentrl_jax.bench import rollout as bench_rollout
from agentrl_jax.bench import sampler as bench_sampler
from agentrl_jax.models.config import ModelConfig

SAMPLER_ARGV = ["--sizes", "tiny_qwen3", "--new-tokens", "8", "--prompt-len", "8", "--batch", "4", "--segment-len",
                "8", "--rounds", "1", "--repeats", "1", "--matmul-n", "256", "--mem-mb", "32", "--no-check"]


def _json_lines(main, argv):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    main(argv)
  return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


def _check_sampler_line(line):
  assert line["bench"] == "sampler" and line["size"] == "tiny_qwen3"
  assert line["device"] == {"backend": "cpu", "device_kind": "cpu", "device_count": 8}
  assert line["params"] == ModelConfig.tiny_qwen3().param_count()
  assert (line["batch"], line["prompt_len"], line["new_tokens"], line["rounds"]) == (4, 8, 8, 1)
  # One round: throughput, step time and the ratios are the same measurements, so they must agree.
  assert line["ours_tok_s"] == pytest.approx(line["batch"] / (line["ours_step_ms"] / 1e3), rel=1e-9)
  assert line["roofline_frac"] == pytest.approx(line["ideal_step_ms"] / line["ours_step_ms"], rel=1e-9)
  assert line["roofline_frac_at_step_floor"] == pytest.approx(line["ideal_step_ms"] / line["xla_step_floor_ms"])
  assert line["speedup_hf"] == pytest.approx(line["ours_tok_s"] / line["hf_tok_s"], rel=1e-9)
  assert line["ideal_step_ms"] > 0 and line["xla_step_floor_ms"] > 0 and line["hf_threads"] >= 1
  # The sampler compiles a bounded number of functions (prefill and decode), not one per step or row.
  assert 1 <= line["traces"] <= 3


def test_sampler_bench_smoke():
  (line,) = _json_lines(bench_sampler.main, SAMPLER_ARGV + ["--no-tunix"])
  _check_sampler_line(line)
  assert line["tunix_tok_s"] is None


def test_sampler_bench_smoke_with_tunix(tunix):
  (line,) = _json_lines(bench_sampler.main, SAMPLER_ARGV)
  _check_sampler_line(line)
  assert line["tunix_tok_s"] > 0
  assert line["tunix_device"]["backend"] == line["device"]["backend"]  # the peer runs on our backend
  assert line["speedup_tunix"] == pytest.approx(line["ours_tok_s"] / line["tunix_tok_s"], rel=1e-9)


def test_sampler_ideal_counts_the_bytes_a_step_reads():
  """Memory-bound ideal (infinite peak, 1 byte/s): an untied input table is not read, only B of its rows."""
  from agentrl_jax.models.config import ModelConfig

  cfg = ModelConfig.bench_5m()
  b, plen, new = 4, 8, 3
  weights = 4.0 * (cfg.param_count() - cfg.vocab_size * cfg.hidden_size + b * cfg.hidden_size)
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4.0
  want = weights + sum(weights + b * (plen + step) * kv_per_token for step in range(1, new))
  assert bench_sampler.ideal_seconds(cfg, b, plen, new, peak=1e30, bw=1.0) == want


def test_rollout_bench_smoke():
  argv = ["--size", "tiny_qwen3", "--groups", "2", "--n", "2", "--tool-turns", "2", "--rounds", "1",
          "--tool-latency", "0.01", "--segment-len", "16", "--no-check"]
  # A first run without the persistent cache leaves its programs in the process's in-memory caches (as an earlier
  # test or benchmark in the same process does); the cached run must still compile, store and reload every one.
  (uncached,) = _json_lines(bench_rollout.main, argv + ["--no-compile-cache"])
  assert "warm_cache_programs" not in uncached and uncached["compiled_programs"] > 0
  (line,) = _json_lines(bench_rollout.main, argv)
  assert line["compiled_programs"] == uncached["compiled_programs"]  # the warm-up compiles as a fresh process
  assert line["bench"] == "rollout" and line["episodes"] == 4 and line["device"]["backend"] == "cpu"
  assert line["transcripts_match"]
  # Every scripted episode made its tool calls and ended its last turn itself.
  assert line["num_tool_calls"] == line["episodes"] * line["tool_turns"] and line["stop_reasons"] == ["end"]
  # Each token is prefilled once (the re-prefill loop prefills every turn again); padding only adds slots.
  assert line["prefilled_tokens"] == line["expected_prefill_tokens"]
  assert line["reprefill_prefilled_tokens"] > line["prefilled_tokens"]
  assert line["ours_padded_prefill_tokens"] >= line["prefilled_tokens"]
  assert line["reprefill_padded_prefill_tokens"] >= line["reprefill_prefilled_tokens"]
  # Timed rounds reuse the warm-up's compiled functions (pause and re-prefill are deterministic; overlap follows
  # tool timing and is only reported).
  assert line["traces_in_rounds"] == 0 and line["traces_in_rounds_overlap"] >= 0
  # Compile work from JAX's events: the warm-up built programs; the rerun loaded every one from the cache.
  assert line["compiled_programs"] > 0 and 0 < line["compile_s"] < line["warmup_s"][line["default_mode"]]
  assert line["warm_cache_programs"] == line["warm_cache_hits"] > 0
  mode = line["default_mode"]
  assert line["ours_episodes_s"] == line[f"{mode}_episodes_s"]
  assert line["speedup"] == pytest.approx(line["ours_episodes_s"] / line["reprefill_episodes_s"], rel=1e-9)


def test_the_peer_process_runs_on_our_backend(tmp_path, monkeypatch):
  """A side process (Tunix's venv) inherits this process's backend through JAX_PLATFORMS, whatever it is, and
  reports the backend it got: no forced CPU peer against an accelerator run."""
  import sys

  worker = tmp_path / "worker.py"
  worker.write_text("import json, os\nprint(json.dumps({'platforms': os.environ.get('JAX_PLATFORMS')}), flush=True)\n"
                    "import sys\nfor line in sys.stdin:\n  break\n")
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  assert common.jax_platforms() == "cpu"  # this process's backend, named as JAX_PLATFORMS spells it
  side = common.SideProcess(sys.executable, str(worker), [])
  try:
    assert side.first == {"platforms": "cpu"}
  finally:
    side.close()
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert common.jax_platforms() == "cpu"
  assert common.backend_info() == {"backend": "cpu", "device_kind": "cpu", "device_count": 8}
