"""Smoke tests of `python -m agentrl_jax.bench.update` at a tiny size (the real run is bench_58m x 1024)."""

import json
import os
import subprocess
import sys

import pytest

from agentrl_jax.bench import common
from agentrl_jax.bench import update as bench_update

TINY = ["--model", "bench_5m", "--batch", "2", "--seq", "64", "--chunk", "32", "--rounds", "1", "--steps", "1",
        "--matmul-n", "256", "--matmul-repeats", "2", "--no-check"]


# bench_5m by hand: hidden 256, 4 layers, 4 heads x 64 (q, o: 256 x 256), 2 KV heads x 64 (k, v: 256 x 128),
# MLP 256 -> 768 (gate, up, down), untied vocabulary 4096 (the LM head 256 x 4096 counts, the input table not).
_PER_LAYER = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768             # 786,432
_MATMUL_PARAMS = 4 * _PER_LAYER + 256 * 4096                           # 4,194,304
_PARAMS = _MATMUL_PARAMS + 4096 * 256 + 4 * (2 * 256 + 2 * 64) + 256   # + input table, norms: 5,245,696
# PaLM's convention per token: 6 N + 12 L n_heads head_dim T, at T = 64.
_FLOPS_PER_TOKEN = 6 * _MATMUL_PARAMS + 12 * 4 * 4 * 64 * 64           # 25,952,256


def test_bench_update_prints_one_json_line_without_tunix(capsys):
  bench_update.main(TINY + ["--no-tunix"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 1
  out = json.loads(lines[0])
  assert out["bench"] == "update" and out["tunix_tok_s"] is None and out["device"]["backend"] == "cpu"
  assert (out["batch"], out["seq"], out["params"]) == (2, 64, _PARAMS)
  assert out["flops_per_token"] == _FLOPS_PER_TOKEN == 25_952_256
  # The reported rates are one measurement seen three ways: they must agree.
  assert out["achieved_gflops"] == pytest.approx(out["tok_s"] * _FLOPS_PER_TOKEN / 1e9, rel=1e-9)
  assert out["mfu"] == pytest.approx(out["achieved_gflops"] / out["peak_gflops"], rel=1e-9)
  assert out["peak_gflops"] >= out["peak_gflops_median"] > 0  # the peak is the best matmul of the run
  assert out["tok_s"] >= out["tok_s_median"] > 0               # best-of-run >= median
  # The matmul-only floor of the step: the same FLOPs in its own time, so the two MFUs scale by the times.
  assert out["mfu_at_step_floor"] == pytest.approx(out["mfu"] * (2 * 64 / out["tok_s"]) / out["xla_step_floor_s"],
                                                   rel=1e-9)


@pytest.mark.slow
def test_bench_update_vs_tunix_subprocess(tunix):
  """The command line as documented, with Tunix: same loss on the same weights and batch."""
  root = common.REPO_ROOT
  res = subprocess.run([sys.executable, "-m", "agentrl_jax.bench.update", *TINY], cwd=root, capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert res.returncode == 0, res.stderr[-3000:]
  lines = res.stdout.strip().splitlines()
  assert len(lines) == 1, res.stdout
  out = json.loads(lines[0])
  assert {"bench", "mfu", "tok_s", "tunix_tok_s"} <= set(out)
  assert out["tunix_tok_s"] > 0 and out["speedup"] > 0 and out["speedup_at_step_floor"] > 0
  assert out["loss_rel_diff"] < 1e-4 and abs(out["entropy"] - out["tunix_entropy"]) < 1e-4


def test_attention_flops_count_what_the_kernel_computes():
  from agentrl_jax.models.config import ModelConfig

  cfg = ModelConfig.bench_58m()  # 8 layers x 8 heads x 64, blocked causal attention in blocks of 256
  # Query blocks of 256 against the keys up to their end: 256 x (256 + 512 + 768 + 1024) = T (T + 256) / 2.
  assert common.attention_pairs(cfg, 1024) == 256 * (256 + 512 + 768 + 1024) == 1024 * 1280 // 2
  assert common.attention_pairs(cfg, 200) == 200 * 200          # one dense block below the block size
  assert common.attention_pairs(cfg, 1024, "dense") == 1024 ** 2  # Tunix's kernel on a CPU: the whole square
  assert common.attention_pairs(cfg, 4096, "splash") == 512 * 512 * 8 * 9 // 2
  assert common.attention_pairs(cfg, 1000, "cudnn") == 1000 * 1001 / 2
  full = common.train_flops_per_token(cfg, 1024, "dense")
  assert common.train_flops_per_token(cfg, 1024) == pytest.approx(
      full - 12 * 8 * 8 * 64 * (1024 - 655360 / 1024), rel=1e-12)
  assert full / common.train_flops_per_token(cfg, 1024) == pytest.approx(1.0672, abs=1e-4)  # 6.7% over, before
  assert "P = 655360 query-key pairs" in common.flops_convention(cfg, 1024)
