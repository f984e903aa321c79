"""The ablations' comparison: each arm's held-out change with its interval, the paired difference to the baseline
arm, the verdict over seeds; and (slow) `configs/ablations.py:smoke` end to end."""

import json

import pytest

from agentrl_jax import testing
from agentrl_jax.pipeline import ablations


def _arm(sft, rl, lo, hi, entropy, clip):
  return {"sft": {"avg@4": sft, "tool_calls_per_response": 1.0}, "rl": {"avg@4": rl, "tool_calls_per_response": 0.9,
                                                                         "tool_success_rate": 0.95,
                                                                         "response_len_mean": 60.0},
          "delta": {"avg@4": {"change": rl - sft, "ci95": [lo, hi]}},
          "curves": {"entropy": [[1, 0.2], [2, entropy]], "clip_frac_high": [[1, clip], [2, clip]],
                     "clip_high_reachable": [[1, 10 * clip], [2, 30 * clip]]}}


def test_table_shows_intervals_differences_and_the_verdict():
  results = {"real": {0: _arm(0.5, 0.7, 0.15, 0.25, 0.1, 1e-3), 1: _arm(0.4, 0.6, 0.12, 0.28, 0.1, 2e-3)},
             "clip_sym": {0: _arm(0.5, 0.6, 0.05, 0.15, 0.05, 0.0), 1: _arm(0.4, 0.62, 0.1, 0.3, 0.06, 0.0)}}
  pairs = {"b": {"0": {"change": -0.1, "ci95": [-0.14, -0.06]}, "1": {"change": 0.02, "ci95": [-0.02, 0.06]}}}
  text = ablations.table(results, [0, 1], 4, pairs)
  assert "| clip 0.2 / 0.28 | 0 | 0.500 | 0.700 | +0.200 [+0.150, +0.250] | (baseline) |" in text
  assert "| clip 0.2 / 0.2 | 0 | 0.500 | 0.600 | +0.100 [+0.050, +0.150] | -0.100 [-0.140, -0.060] |" in text
  assert "| 0.050 | 0.00e+00 | 0.00e+00 |" in text and "| 0.100 | 1.00e-03 | 2.00e-02 |" in text
  assert ("(b) after RL, baseline arm ahead (95% CI of the difference below 0) on 1 of 2 seeds (0); behind on 0 "
          "(none); not separated on 1 (1)") in text


@pytest.mark.slow
def test_ablations_smoke_end_to_end(tmp_path):
  """Two arms at the pipeline's smoke size: the clipping arm reuses the baseline's stages up to the filter."""
  config = testing.load_config("ablations", "smoke")
  out = ablations.run(config, str(tmp_path))
  assert set(out["results"]) == {"real", "clip_sym"}
  assert (tmp_path / "clip_sym-s0" / "sft").is_symlink() and not (tmp_path / "clip_sym-s0" / "rl").is_symlink()
  pair = out["versus_baseline"]["b"]["0"]
  assert pair["problems"] == 8 and pair["ci95"][0] <= pair["change"] <= pair["ci95"][1]
  saved = json.loads((tmp_path / "ablations.json").read_text())
  assert saved["results"]["real"]["0"]["delta"]["avg@2"]["ci95"] is not None
  assert "RL - SFT [95% CI]" in (tmp_path / "ablations.md").read_text()


def _two_seed_smoke(**fields):
  config = testing.load_config("ablations", "smoke")
  with config.unlocked():
    config.seeds, config.processes = (0, 1), 2
    for key, value in fields.items():
      config[key] = value
  return config


def test_a_failing_seed_process_is_named_with_its_console(tmp_path):
  """Seeds in processes of their own: a seed that fails stops nothing else, and the error names it and where its
  console went (here every arm names a config field that does not exist, so each child fails at once)."""
  config = _two_seed_smoke(arms=("broken",))
  with config.unlocked():
    config.arm_overrides.broken = [["rl.no_such_field", 1]]
  with pytest.raises(RuntimeError, match=r"seeds \[0, 1\] failed"):
    ablations.run(config, str(tmp_path))
  for seed in (0, 1):
    console_text = (tmp_path / f"seed{seed}.console.txt").read_text()
    assert "names no field of the pipeline config" in console_text


@pytest.mark.slow
def test_seeds_in_processes_end_to_end(tmp_path):
  """Two seeds side by side at the smoke size: each seed's arm runs in its own process and the table covers both."""
  out = ablations.run(_two_seed_smoke(arms=("real",)), str(tmp_path))
  assert sorted(out["results"]["real"]) == ["0", "1"]
  for seed in (0, 1):
    assert (tmp_path / f"real-s{seed}" / "summary.json").exists()
    assert "=== ablations: arm 'real' seed" in (tmp_path / f"seed{seed}.console.txt").read_text()


def test_a_seed_consoles_stage_lines_are_followed_without_progress_bars(tmp_path):
  path = tmp_path / "seed0.console.txt"
  path.write_text("old line\n")
  follower = ablations._ConsoleFollower(str(path))  # starts at the end: a rerun does not repeat the last run
  with open(path, "a") as f:
    f.write("pipeline: x\n[6/7] rl: GRPO-TCR\nrl:   5%|#  |\rrl:  10%|## |\r\n      last step: reward 0.5\n"
            "| table | row |\n=== ablations: arm 'real'\n[7/7] ev")
  assert follower.new_lines() == ["[6/7] rl: GRPO-TCR", "      last step: reward 0.5", "=== ablations: arm 'real'"]
  with open(path, "a") as f:
    f.write("al_rl: evaluate\n")
  assert follower.new_lines() == ["[7/7] eval_rl: evaluate"]
