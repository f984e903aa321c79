"""Model-aware prompt filtering: pass rates from k outcomes, the band, and the RL-schema output (with a
deterministic stand-in for the policy; the job end to end on a trained toy policy is in
tests/data/test_collect_filter_jobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl_jax import data, testing
from agentrl_jax.data import collect
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.rl import filter_prompts as fp


def record(i, **extra):
  return PromptRecord([{"role": "user", "content": f"Compute {i}+1."}], "toy_arith", str(i + 1),
                      {"index": i, **extra}, index=i)


def styled(r):
  return PromptRecord([{"role": "user", "content": "STYLED " + r.prompt[0]["content"]}], r.data_source,
                      r.ground_truth, r.extra_info, r.index)


# The stand-in policy: prompt i is solved by a known number of its k = 4 samples; prompt 5 is "too long".
SOLVED = {0: 0, 1: 1, 2: 2, 3: 4, 4: 3, 6: 4, 7: 0}


def stand_in(batch, b):
  out = []
  for r in batch:
    assert r.prompt[0]["content"].startswith("STYLED ")  # the policy sees the styled prompt
    if r.index == 5:
      out.append("prompt has 99 tokens > max_prompt_len 64")
    else:
      out.append(fp.Outcomes(correct=np.arange(4) < SOLVED[r.index], tool_calls=np.full(4, b),
                             response_tokens=np.full(4, 10 * r.index)))
  return out


@pytest.mark.parametrize("band, kept", [
    (fp.PassRateBand(), [1, 2, 4]),                                          # (0, 1): drop always / never solved
    (fp.PassRateBand(0.25, 0.75, True, True), [1, 2, 4]),
    (fp.PassRateBand(0.25, 0.75, False, True), [2, 4]),
    (fp.PassRateBand(0.0, 0.5, True, False), [0, 1, 7]),
    (fp.PassRateBand(1.0, 1.0, True, True), [3, 6]),
])
def test_pass_rates_and_band_with_a_stand_in_policy(band, kept):
  raw = [record(i) for i in range(8)]
  entries = list(fp.estimate(raw, [styled(r) for r in raw], stand_in, band=band, prompts_per_batch=3))
  assert [e["index"] for e in entries] == list(range(8))
  rates = {e["index"]: e["pass_rate"] for e in entries}
  assert rates == {0: 0.0, 1: 0.25, 2: 0.5, 3: 1.0, 4: 0.75, 5: None, 6: 1.0, 7: 0.0}
  assert [e["index"] for e in entries if e["kept"]] == kept
  assert entries[5]["skipped"].startswith("prompt has 99 tokens") and not entries[5]["kept"]
  assert entries[4]["correct"] == 3 and entries[4]["k"] == 4
  assert [e["tool_calls_mean"] for e in entries] == [0.0, 0.0, 0.0, 1.0, 1.0, None, 2.0, 2.0]  # batch numbers
  assert entries[2]["response_tokens_mean"] == 20.0


def test_band_edges_and_validation():
  band = fp.PassRateBand()
  assert not band.contains(0.0) and band.contains(1 / 16) and band.contains(15 / 16) and not band.contains(1.0)
  assert str(band) == "(0, 1)" and str(fp.PassRateBand(0.2, 0.8, True, False)) == "[0.2, 0.8)"
  with pytest.raises(ValueError, match="low <= high"):
    fp.PassRateBand(0.8, 0.2)
  with pytest.raises(ValueError, match="empty"):
    fp.PassRateBand(0.5, 0.5)
  with pytest.raises(ValueError, match="max_pass_rate"):
    fp.FilterConfig(min_pass_rate=0.6, max_pass_rate=0.4)
  for field, value in (("k", 0), ("temperature", -1.0), ("top_p", 1.5), ("prompts_per_batch", 0)):
    with pytest.raises(ValueError, match=field):
      fp.FilterConfig(**{field: value})


def test_kept_rows_are_the_original_prompts_in_the_rl_schema(tmp_path):
  raw = [record(0, tags=["a"]), record(1)]
  rows = [fp.rl_row(r, rate, 16) for r, rate in zip(raw, (0.25, 0.5))]
  path = collect.write_parquet(str(tmp_path / "kept.parquet"), rows, nested=("prompt", "reward_model", "extra_info"))
  got = data.prepare(data.SourceConfig(path=path, schema="rl", data_dir=str(tmp_path / "tfds"))).records()
  assert [g.prompt for g in got] == [r.prompt for r in raw]            # unstyled, as stored
  assert [g.ground_truth for g in got] == ["1", "2"] and got[0].data_source == "toy_arith"
  assert got[0].extra_info == {"index": 0, "tags": ["a"], "pass_rate": 0.25, "pass_rate_k": 16}
  assert got[1].extra_info["pass_rate"] == 0.5


def test_filter_configs_load():
  config = testing.load_config("filter_prompts")
  assert config.job == "filter" and config.filter.k == 16 and config.filter.temperature == 1.0
  assert config.model.size == "qwen3_4b" and "rl" not in config
  cfg = fp.FilterConfig(**config.filter)
  assert str(cfg.band) == "(0, 1)"
  smoke = testing.load_config("filter_prompts", "smoke")
  assert smoke.model.size == "tiny_qwen3" and smoke.filter.k == 4 and smoke.data.toy_problems > 0
  with pytest.raises(ValueError, match="unknown arg"):
    testing.load_config("filter_prompts", "x")
