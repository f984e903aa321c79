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
  rows = [json.loads(line) for line in open(tmp_path / "eval_rollouts.jsonl")]
  assert len(rows) == metrics["AIME2024/n_samples"]
  # The metrics are those of the written rows: avg@2 and (unbiased) pass@1 are the mean accuracy, pass@2 the
  # share of problems with a correct sample, tool calls the mean per row.
  by_problem: dict[int, list[bool]] = {}
  for row in rows:
    by_problem.setdefault(row["index"], []).append(row["acc"])
  assert sorted(len(accs) for accs in by_problem.values()) == [2] * len(by_problem)
  mean_acc = sum(row["acc"] for row in rows) / len(rows)
  assert metrics["AIME2024/avg@2"] == pytest.approx(mean_acc)
  assert metrics["AIME2024/pass@1"] == pytest.approx(mean_acc)
  assert metrics["AIME2024/pass@2"] == pytest.approx(sum(any(a) for a in by_problem.values()) / len(by_problem))
  assert 0.0 <= metrics["AIME2024/avg@2"] <= metrics["AIME2024/pass@2"] <= 1.0
  assert metrics["all/tool_calls_mean"] == pytest.approx(sum(row["num_tool_calls"] for row in rows) / len(rows))
  first = rows[0]
  assert first["data_source"] == "AIME2024" and first["ground_truth"].isdigit()
  assert "Every morning Aya" in first["transcript"]  # the real first problem of AIME 2024 I
  assert json.load(open(tmp_path / "eval_metrics.json")) == pytest.approx(metrics)
