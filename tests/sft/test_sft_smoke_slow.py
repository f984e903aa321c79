"""The documented smoke command runs end to end (`configs/sft_qwen3_4b.py:smoke` through `agentrl_jax.main`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentrl_jax import checkpoint

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sft_smoke_config_runs_via_main(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
  out = subprocess.run([sys.executable, "-m", "agentrl_jax.main", "--config=configs/sft_qwen3_4b.py:smoke",
                        f"--workdir={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "skipping conversation at row" in out.stderr  # the toy set's malformed rows: reported, not fatal
  metrics = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[-1]["skipped_conversations"] > 0
  assert (tmp_path / "hf" / "model.safetensors").exists() and (tmp_path / "hf" / "tokenizer.json").exists()
  with checkpoint.Checkpointer(tmp_path / "checkpoints") as ckpt:
    assert ckpt.latest_step() == metrics[-1]["step"]
