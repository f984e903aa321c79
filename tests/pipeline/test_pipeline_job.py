"""The pipeline job's bookkeeping without the model stages: stage markers, reuse, refusal of a changed config,
and the report's table."""

import json

import pytest

from agentrl_jax import testing
from agentrl_jax.pipeline import job, report


def _config(**overrides):
  return testing.load_config("default", "smoke", **{"stages": ["data"], **overrides})


def test_finished_stage_is_reused_and_a_changed_config_refused(tmp_path, capsys):
  job.run(_config(), str(tmp_path))
  marker = tmp_path / "data" / "stage.json"
  first = json.loads(marker.read_text())
  assert first["result"]["splits"]["heldout"]["problems"] == 8
  assert first["timing"]["wall_s"] > 0
  job.run(_config(), str(tmp_path))
  assert "done earlier, reused" in capsys.readouterr().out
  assert json.loads(marker.read_text()) == first
  with pytest.raises(ValueError, match=r"stage 'data' .*differs in task"):
    job.run(_config(**{"task.heldout_problems": 9}), str(tmp_path))
  # Fields no stage reads (the name, the cache location) do not count as a change.
  renamed = _config(compile_cache_dir=str(tmp_path / "cache"))
  renamed.name = "renamed"
  job.run(renamed, str(tmp_path))


def test_interrupted_stage_resumes_only_under_the_same_config(tmp_path):
  (tmp_path / "data").mkdir()
  inputs = job.stage_inputs(_config(seed=7), "data")
  (tmp_path / "data" / "stage_config.json").write_text(json.dumps({"inputs": inputs}))
  with pytest.raises(ValueError, match="differs in seed"):
    job.run(_config(), str(tmp_path))


def test_stage_inputs_chain_through_earlier_stages():
  base = _config()
  changed = _config(**{"sft.num_epochs": 9})
  assert job.stage_inputs(base, "teacher") == job.stage_inputs(changed, "teacher")
  for stage in ("sft", "eval_sft", "filter", "rl", "eval_rl"):
    assert job.stage_inputs(base, stage) != job.stage_inputs(changed, stage), stage
  clip = _config(**{"rl.loss.clip_high": 0.2})
  assert job.stage_inputs(base, "filter") == job.stage_inputs(clip, "filter")
  assert job.stage_inputs(base, "rl") != job.stage_inputs(clip, "rl")


def test_lora_is_an_input_of_the_rl_stage_only_when_on():
  """LoRA off records nothing (a run from before the block existed compares equal); on, it changes the RL stage
  and the ones after it, not the SFT checkpoint or the filter it starts from, and reaches the RL job's config."""
  from agentrl_jax.pipeline import stages

  base, on = _config(), _config(**{"lora.rank": 8})
  assert "lora" not in job.stage_inputs(base, "rl")
  assert job.stage_inputs(base, "filter") == job.stage_inputs(on, "filter")
  assert job.stage_inputs(base, "rl") != job.stage_inputs(on, "rl")
  assert job.stage_inputs(on, "rl")["lora"]["rank"] == 8
  results = {"sft": {"checkpoint": "/x"}, "filter": {"output": "/y"},
             "data": {"splits": {"heldout_curve": {"path": "/z"}}}}
  assert stages.rl_config(on, "/w", results).lora.rank == 8


def test_table_shows_before_after_intervals_and_missing_values():
  summary = {"k": 4, "heldout_problems": 16, "eval_temperature": 1.0, "wall_s": 12.5, "compile_s": 3.0,
             "sft": {"avg@4": 0.25, "pass@4": 0.5, "maj@4": 0.25, "tool_calls_per_response": 1.0,
                     "tool_success_rate": None, "response_len_mean": 40.0},
             "rl": {"avg@4": 0.5, "pass@4": 0.625, "maj@4": 0.5, "tool_calls_per_response": 0.75,
                    "tool_success_rate": 0.9, "response_len_mean": 35.5},
             "delta": {"avg@4": {"before": 0.25, "after": 0.5, "change": 0.25, "ci95": [0.125, 0.375]}},
             "by_level": {"2": {"before": 0.0, "after": 0.5, "change": 0.5, "ci95": [0.25, 0.75], "problems": 4}},
             "stages": {"sft": {"wall_s": 10.0, "compile_s": 3.0, "compiled_programs": 4, "reused": True}}}
  text = report.table(summary)
  assert "| avg@4                      |    0.250 |    0.500 |   +0.250 |   [+0.125, +0.375] |" in text
  assert "| tool calls / response      |     1.00 |     0.75 |    -0.25 |                n/a |" in text
  assert "| tool success rate          |      n/a |    0.900 |      n/a |                n/a |" in text
  assert "| 2 (mul)            |        4 |    0.000 |    0.500 |   +0.500 |   [+0.250, +0.750] |" in text
  assert "(earlier run)" in text and "| total      |     12.5 |" in text


def test_fields_added_later_match_stages_recorded_before_them():
  """A stage recorded before the mesh's context axis and the model's context strategy / cache dtype existed
  (the SFT stage of an earlier run) matches today's config that leaves them at their defaults; set, they count."""
  sft = job.stage_inputs(_config(), "sft")
  assert "context" not in sft["mesh"] and not {"context_strategy", "kv_cache_dtype"} & set(sft["model"])
  cp = job.stage_inputs(_config(**{"mesh.context": 2, "model.context_strategy": "ulysses"}), "sft")
  assert cp["mesh"]["context"] == 2 and cp["model"]["context_strategy"] == "ulysses"
  assert cp != sft
