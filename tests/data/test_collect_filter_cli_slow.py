"""The documented commands, each a `python -m agentrl_jax.main` subprocess: a tiny SFT run on the teacher's
conversations, then trajectory collection, prompt filtering and the stitched baseline from their configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentrl_jax import testing
from agentrl_jax.tasks import arithmetic, teacher
from agentrl_jax.tools import base as tools_base
from agentrl_jax.tools import executors as tool_executors

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(flags, workdir, log_path):
  proc = testing.launch_main(flags, workdir, log_path=log_path)
  proc.wait(timeout=600)
  assert proc.returncode == 0, open(log_path).read()[-3000:]


def test_collect_filter_and_stitch_commands(tmp_path):
  problems = arithmetic.make_problems(6, levels=(2,), seed=11)
  with tool_executors.make_executor(tools_base.ToolConfig(timeout_s=10)) as executor:
    convs = teacher.conversations(problems[:4], executor, seed=0, p_mistake=0.0)
  for c in convs:
    c["tools"] = []
  teacher_data = teacher.write_sft_parquet(str(tmp_path / "teacher.parquet"), convs)
  prompts = arithmetic.write_rl_parquet(str(tmp_path / "prompts.parquet"), problems)
  main(["--config=configs/sft_tiny.py:overfit", f"--config.data.path={teacher_data}", "--config.export_hf=False"],
       tmp_path / "sft", tmp_path / "sft.log")
  policy = [f"--config.model.checkpoint={tmp_path / 'sft' / 'checkpoints'}", f"--config.data.train_path={prompts}"]

  main(["--config=configs/collect_trajectories.py:smoke", *policy, "--config.collect.n=4"], tmp_path / "collect",
       tmp_path / "collect.log")
  summary = json.load(open(tmp_path / "collect" / "collect_summary.json"))
  assert summary["episodes"] == 24 and 1 <= summary["prompts_with_kept"] <= 4, summary
  assert (tmp_path / "collect" / "trajectories.parquet").exists()

  main(["--config=configs/filter_prompts.py:smoke", *policy, "--config.filter.temperature=0.0",
        "--config.filter.min_pass_rate=1.0", "--config.filter.include_min=True", "--config.filter.include_max=True"],
       tmp_path / "filter", tmp_path / "filter.log")
  rates = [json.loads(line)["pass_rate"] for line in open(tmp_path / "filter" / "pass_rates.jsonl")]
  assert rates == [1.0] * 4 + [0.0] * 2
  assert json.load(open(tmp_path / "filter" / "filter_summary.json"))["kept"] == 4

  # No model in this job (launch_main's tokenizer flag has no field to set), so a plain subprocess.
  out = subprocess.run([sys.executable, "-m", "agentrl_jax.main", "--config=configs/stitch_solutions.py:smoke",
                        f"--workdir={tmp_path / 'stitch'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  stitched = json.load(open(tmp_path / "stitch" / "stitch_summary.json"))
  assert stitched["rows"] == 16 and stitched["stitched"] + stitched["decision/nothing_to_compute"] == 16
  assert "skipped" in out.stderr and "nothing_to_compute" in out.stderr
