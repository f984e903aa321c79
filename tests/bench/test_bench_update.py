"""Smoke tests of `python -m agentrl_jax.bench.update` at a tiny size (the real run is bench_58m x 1024)."""

import json
import os
import subprocess
import sys

import pytest

from agentrl_jax.bench import common
from agentrl_jax.bench import update as bench_update

TINY = ["--model", "bench_5m", "--batch", "2", "--seq", "64", "--chunk", "32", "--rounds", "1", "--steps", "1",
        "--matmul-n", "256", "--matmul-repeats", "2"]


def test_bench_update_prints_one_json_line_without_tunix(capsys):
    bench_update.main(TINY + ["--no-tunix"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["bench"] == "update" and out["tunix_tok_s"] is None
    assert out["tok_s"] > 0 and 0 < out["mfu"] and out["peak_gflops"] > 0
    assert out["flops_per_token"] == common.train_flops_per_token(
        bench_update.ModelConfig.bench_5m(), 64)


@pytest.mark.slow
@pytest.mark.skipif(common.tunix_python() is None, reason=".venv-tunix is missing")
def test_bench_update_vs_tunix_subprocess():
    """The command line as documented, with Tunix: same loss on the same weights and batch."""
    root = common.REPO_ROOT
    res = subprocess.run([sys.executable, "-m", "agentrl_jax.bench.update", *TINY], cwd=root, capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    out = json.loads(lines[0])
    assert {"bench", "mfu", "tok_s", "tunix_tok_s"} <= set(out)
    assert out["tunix_tok_s"] > 0 and out["speedup"] > 0
    assert out["loss_rel_diff"] < 1e-4 and abs(out["entropy"] - out["tunix_entropy"]) < 1e-4
