"""The evaluation job end to end on the real AIME 2024 file (../shared/data), with a tiny model and the tool loop."""

import json
import os

import pytest

from agentrl_jax import testing
from agentrl_jax.evaluation import runner

def test_eval_job_on_real_aime2024(tmp_path):
  config = testing.load_config("eval_demystify", "aime2024")
  path = config.eval.sources[0]["path"]
  if not os.path.exists(path):
    pytest.skip(f"real AIME 2024 data not found at {path} (../shared/data is absent in this checkout)")
  with config.unlocked():
    config.eval.sources[0]["limit"] = 6
  metrics = runner.run(config, str(tmp_path))
  assert metrics["AIME2024/n_problems"] + metrics["eval/skipped_prompts"] == 6
  assert metrics["AIME2024/n_samples"] == 2 * metrics["AIME2024/n_problems"]
  for key in ("AIME2024/avg@2", "AIME2024/pass@2", "AIME2024/pass@1", "all/tool_calls_mean"):
    assert key in metrics and 0.0 <= metrics[key] <= max(1.0, metrics[key])
  rows = [json.loads(line) for line in open(tmp_path / "eval_rollouts.jsonl")]
  assert len(rows) == metrics["AIME2024/n_samples"]
  first = rows[0]
  assert first["data_source"] == "AIME2024" and first["ground_truth"].isdigit()
  assert "Every morning Aya" in first["transcript"]  # the real first problem of AIME 2024 I
  assert json.load(open(tmp_path / "eval_metrics.json")) == pytest.approx(metrics)
