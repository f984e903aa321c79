"""The main job's `:smoke` variant as a user runs it (`python -m agentrl_jax.main --config=configs/default.py:smoke`):
every stage runs, a run killed during RL resumes (finished stages reused, RL from its checkpoint), the summary
has every key, the table prints, and the held-out split never reaches SFT, the filter or RL.

One module-scoped run is shared by the tests (the killed run and its resumption share a compilation cache)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGES = ["data", "teacher", "sft", "eval_sft", "filter", "rl", "eval_rl"]
METRIC_KEYS = {"avg@2", "pass@2", "maj@2", "tool_calls_per_response", "tool_success_rate", "response_len_mean",
               "greedy@1"}


# As on a machine without torch (a runtime install), where transformers announces that at import.
_NO_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['main'] + sys.argv[1:]; "
             "runpy.run_module('agentrl_jax.main', run_name='__main__', alter_sys=True)")


def _start(workdir, log):
  # No JAX_PLATFORMS: the config's jax_platforms keeps JAX off the TPU probe (libtpu is installed here).
  env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
  env.pop("XLA_FLAGS", None)
  env.pop("JAX_PLATFORMS", None)
  return subprocess.Popen([sys.executable, "-c", _NO_TORCH, "--config=configs/default.py:smoke",
                           f"--workdir={workdir}"], cwd=REPO, env=env, stdout=open(log, "w"),
                          stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A smoke run SIGKILLed once its RL stage has written a checkpoint, then rerun to the end."""
  workdir = tmp_path_factory.mktemp("pipeline") / "run"
  first = _start(workdir, workdir.parent / "first.log")
  ckpt = workdir / "rl" / "checkpoints"
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline and first.poll() is None:
    if ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir()):
      break
    time.sleep(0.2)
  assert first.poll() is None, open(workdir.parent / "first.log").read()[-3000:]
  first.send_signal(signal.SIGKILL)
  first.wait()
  markers = {s: os.path.getmtime(workdir / s / "stage.json") for s in STAGES[:5]}
  assert not (workdir / "rl" / "stage.json").exists()
  second = _start(workdir, workdir.parent / "second.log")
  assert second.wait(timeout=300) == 0, open(workdir.parent / "second.log").read()[-3000:]
  return workdir, open(workdir.parent / "second.log").read(), markers


def test_every_stage_ran_and_the_killed_run_resumed(run):
  workdir, out, markers = run
  for stage in STAGES:
    assert (workdir / stage / "stage.json").exists(), stage
  for stage, mtime in markers.items():  # finished stages were not redone
    assert os.path.getmtime(workdir / stage / "stage.json") == mtime, stage
    assert f"{stage}: " in out and "done earlier, reused" in out
  assert "rl: GRPO-TCR with the code tool (resuming)" in out
  log = open(workdir / "pipeline.log").read()
  assert "rl: resumed at step" in log
  rows = [json.loads(line) for line in open(workdir / "rl" / "metrics.jsonl")]
  train = [r["step"] for r in rows if "reward/mean" in r]
  curve = [r["step"] for r in rows if "eval/toy_arith/avg@2" in r]
  assert train == [1, 2] and curve == [0, 1, 2], rows  # resumed where it stopped: no step logged twice


def test_summary_has_every_key_and_the_table_prints(run):
  workdir, out, _ = run
  summary = json.load(open(workdir / "summary.json"))
  for arm in ("sft", "rl"):
    assert set(summary[arm]) == METRIC_KEYS, summary[arm]
    for key in ("avg@2", "pass@2", "maj@2", "greedy@1"):
      assert 0.0 <= summary[arm][key] <= 1.0
      lo, hi = summary["ci95"][arm][key]
      assert lo <= summary[arm][key] <= hi
    assert summary[arm]["avg@2"] <= summary[arm]["pass@2"]
  for key in ("avg@2", "pass@2", "maj@2", "greedy@1", "response_len_mean"):
    d = summary["delta"][key]
    assert d["problems"] == 8 and d["change"] == pytest.approx(summary["rl"][key] - summary["sft"][key])
    assert d["ci95"][0] <= d["change"] <= d["ci95"][1]
  assert sum(level["problems"] for level in summary["by_level"].values()) == 8
  assert set(summary["stages"]) == set(STAGES)
  for t in summary["stages"].values():
    assert {"wall_s", "compile_s", "compiled_programs", "cache_hits"} <= set(t)
  assert summary["wall_s"] > 0 and summary["plots"][0] == "rl_curves.png"
  for plot in summary["plots"]:
    assert (workdir / plot).stat().st_size > 1000
  assert "| avg@2 " in out and "| pass@2 (unbiased)" in out and "| total " in out and "95% CI of change" in out
  assert (workdir / "report.md").exists()
  for stage in ("sft", "rl"):
    assert any((workdir / stage / "tensorboard").iterdir())
  # Third-party logs go to the log file, not the console: TFDS, Orbax, transformers' import-time notice; and no
  # TPU backend is probed at all.
  log = open(workdir / "pipeline.log").read()
  for noise in ("Downloading and preparing", "PyTorch was not found"):
    assert noise not in out and noise in log
  assert "orbax" not in out.lower()
  for probe in ("backend 'tpu'", "libtpu", "TPU_ACCELERATOR_TYPE", "InitGoogle"):
    assert probe not in out and probe not in log


def _questions(rows):
  return {row["prompt"][0]["content"] for row in rows}


def test_heldout_never_reaches_sft_filter_or_rl(run):
  workdir, _, _ = run
  heldout = _questions(pd.read_parquet(workdir / "data" / "heldout.parquet").to_dict("records"))
  assert len(heldout) == 8
  sft = pd.read_parquet(workdir / "teacher" / "trajectories.parquet")
  sft_questions = {m[0]["content"] for m in sft["messages"]}
  assert sft_questions and not sft_questions & heldout
  pool = _questions(pd.read_parquet(workdir / "data" / "rl.parquet").to_dict("records"))
  filtered = _questions(pd.read_parquet(workdir / "filter" / "filtered.parquet").to_dict("records"))
  assert filtered <= pool and not pool & heldout
  trained = [json.loads(line)["transcript"] for line in open(workdir / "rl" / "samples.jsonl")
             if json.loads(line).get("kind") == "train"]
  assert trained and not any(q in t for t in trained for q in heldout)


@pytest.mark.slow  # the longest default test (~2 min alone, 4 under load): the same stages as the smoke run above
def test_smoke_with_the_real_qwen3_vocabulary(tmp_path):
  """Every stage with Qwen3's tokenizer and chat template (151k-token vocabulary, `</tool_call>` = 151658)."""
  from agentrl_jax import testing
  from agentrl_jax.pipeline import job

  config = testing.load_config("default", "smoke_qwen3", **{"compile_cache_dir": str(tmp_path / "cache")})
  summary = job.run(config, str(tmp_path / "run"))
  assert set(summary["sft"]) == METRIC_KEYS and set(summary["rl"]) == METRIC_KEYS
  meta = json.load(open(tmp_path / "run" / "sft" / "config.json"))
  assert "qwen3-" in meta["model"]["tokenizer_path"]
  sample = json.loads(open(tmp_path / "run" / "sft" / "samples.jsonl").readline())
  assert sample["text"].startswith("<|im_start|>user\n") and "<think>\n\n</think>\n\n" in sample["text"]


def test_fresh_problems_exclude_the_run_and_print_the_table(run, tmp_path, capsys):
  """configs/eval_embedded.py on the smoke run: a fresh set none of whose problems (in any rendering) is in the
  run's splits, both checkpoints evaluated, the change with its interval printed and written."""
  from agentrl_jax import testing
  from agentrl_jax.pipeline import fresh_eval
  from agentrl_jax.tasks import arithmetic

  workdir, _, _ = run
  config = testing.load_config("eval_embedded", "smoke", **{"run": str(workdir), "seed": 7,
                                                            "compile_cache_dir": str(workdir / "jax_cache")})
  result = fresh_eval.run(config, str(tmp_path))
  seen = {p.key for split in ("heldout", "sft", "rl") for p in arithmetic.read_rl_parquet(workdir / "data" /
                                                                                          f"{split}.parquet")}
  fresh = arithmetic.read_rl_parquet(tmp_path / "fresh.parquet")
  assert len(fresh) == 6 and not {p.key for p in fresh} & seen
  assert result["excluded"]["distinct_problems"] == len(seen)
  for metric in ("avg@2", "greedy@1", "tool_success_rate"):
    c = result["changes"][metric]
    assert c["problems"] == 6 and (c["ci95"] is None or c["ci95"][0] <= c["change"] <= c["ci95"][1])
  out = capsys.readouterr().out
  assert "| avg@2 " in out and "95% CI of change" in out and "by level" in out
  assert (tmp_path / "sft" / "eval_rollouts.jsonl").exists() and (tmp_path / "rl" / "greedy").is_dir()
  with pytest.raises(ValueError, match="neither a run directory"):
    fresh_eval.excluded_keys([str(tmp_path / "nowhere")])


def test_fresh_problems_for_one_exported_hf_policy(run, tmp_path, capsys):
  """One policy, a HF directory exported from the smoke run: its values with their intervals; the run given as
  an exclusion only."""
  from agentrl_jax import checkpoint, testing
  from agentrl_jax.pipeline import fresh_eval

  workdir, _, _ = run
  hf = checkpoint.main([str(workdir / "rl" / "checkpoints"), str(tmp_path / "hf")])
  config = testing.load_config("eval_embedded", "smoke", **{
      "after": hf, "after_label": "HF", "exclude": str(workdir), "seed": 3,
      "compile_cache_dir": str(workdir / "jax_cache")})
  result = fresh_eval.run(config, str(tmp_path / "fresh"))
  assert set(result["values"]) == {"HF"} and "changes" not in result
  assert result["excluded"]["sources"] == [str(workdir)] and result["excluded"]["distinct_problems"] == 40
  v = result["values"]["HF"]["avg@2"]
  assert v["ci95"][0] <= v["value"] <= v["ci95"][1]
  assert "|       HF |" in capsys.readouterr().out
