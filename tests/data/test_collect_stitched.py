"""The `stitched` baseline builder: computations found in plain solutions, fabricated code RUN in the real
sandbox, the tool turn spliced in before the answer, the SFT schema; rows with nothing to compute are skipped."""

from __future__ import annotations

import json
import os

import pytest

from agentrl_jax import data, testing
from agentrl_jax.data import collect, stitched
from agentrl_jax.sft import masking
from agentrl_jax.tools import base, executors


@pytest.fixture(scope="module")
def executor():
  ex = executors.make_executor(base.ToolConfig(timeout_s=10))
  yield ex
  ex.close()


load = testing.load_config


@pytest.mark.parametrize("text, found", [
    ("We compute 37*41 = 1517.", [("37*41", "1517", "print(37 * 41)")]),
    (r"so $\frac{9}{3} + 0.4 = 3.4$ hours", [(r"\frac{9}{3} + 0.4", "3.4", "print(9 / 3 + 0.4)")]),
    (r"$2\cdot\binom{7}{2} = 42$", [(r"2\cdot\binom{7}{2}", "42", "import math\nprint(2 * math.comb(7, 2))")]),
    (r"\(\sqrt{3^2+4^2} = 5\)", [(r"\sqrt{3^2+4^2}", "5", "import math\nprint(math.sqrt(3 ** 2 + 4 ** 2))")]),
    ("then 2^{13} - (-128) + 1 = 8321", [("2^{13} - (-128) + 1", "8321", "print(2 ** 13 - (-128) + 1)")]),
    ("(-2)^2 = 4 and 5! = 120", [("(-2)^2", "4", "print((-2) ** 2)"),
                                 ("5!", "120", "import math\nprint(math.factorial(5))")]),
    ("22/7 = 3.142857 is close", [("22/7", "3.142857", "print(22 / 7)")]),
    ("$9s+18-9s=18=1.6s^{2} + 3.2s$ and $(2s-5)(2s+9) = 0$", []),   # unknowns
    ("so 2 + 2 = 5 in this story", []),                             # not what the text says
    ("x = 3, and 12 = 12", []),                                     # nothing computed
    ("3*4 = 12.5 or 3*4 = 12*1", []),                               # wrong; and a right side that goes on
])
def test_find_computations(text, found):
  got = stitched.find_computations(text)
  assert [(c.expression, c.stated, c.code) for c in got] == found
  for c in got:
    assert text[c.start:c.end].startswith(c.expression) and text[c.start:c.end].endswith(c.stated)


def test_choose_prefers_the_final_answer():
  comps = stitched.find_computations("First 2+3 = 5, then 6*7 = 42, then 42-2 = 40, check 1+1 = 2.")
  assert stitched.choose(comps, "42").expression == "6*7"
  assert stitched.choose(comps, "999").expression == "1+1"
  assert stitched.choose(comps, None).expression == "1+1"
  assert stitched.choose([], "42") is None


def test_stitch_runs_the_fabricated_code_for_the_tool_output(executor):
  prompt = [{"role": "user", "content": "What is 0.1 + 0.2, to one decimal?"}]
  solution = "Adding the tenths: 0.1+0.2 = 0.3. So the sum is 0.3.\nThe answer is \\boxed{0.3}."
  cfg = stitched.StitchConfig()
  got = stitched.stitch(prompt, solution, answer="0.3", cfg=cfg, executor=executor)
  assert got.reason == stitched.STITCHED
  call = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(0.1 + 0.2)"}}}
  assert got.messages == [
      prompt[0],
      {"role": "assistant", "content": "Adding the tenths:\n\nLet me compute this with code.", "tool_calls": [call]},
      {"role": "tool", "content": "0.30000000000000004"},   # what Python printed, not what the text states
      {"role": "assistant", "content": "0.1+0.2 = 0.3. So the sum is 0.3.\nThe answer is \\boxed{0.3}."},
  ]
  stated = stitched.stitch(prompt, solution, answer="0.3", cfg=stitched.StitchConfig(output_mode="stated"))
  assert stated.messages[2] == {"role": "tool", "content": "0.3"}  # fully fabricated: nothing ran
  no_box = stitched.stitch(prompt, "So 0.1+0.2 = 0.3.", answer="0.3", cfg=cfg, executor=executor)
  assert no_box.messages[1]["content"] == "Let me compute this with code."
  assert no_box.messages[-1]["content"] == "So 0.1+0.2 = 0.3.\n\nThe answer is \\boxed{0.3}."
  # SFT takes it: assistant turns trained, the tool turn masked.
  enc = masking.encode_conversation(testing.tiny_tokenizer(), got.messages)
  assert 0 < enc.num_trained < len(enc)


def test_stitch_skips_nothing_to_compute_and_failed_runs(executor):
  got = stitched.stitch([{"role": "user", "content": "Name a prime."}], "Seven is prime, so \\boxed{7}.",
                        answer="7", cfg=stitched.StitchConfig(), executor=executor)
  assert got.messages is None and got.reason == stitched.NOTHING_TO_COMPUTE and "expression = number" in got.detail
  bad = stitched.Computation("1/0", "1", "print(1/0)", 1.0, 0, 5)
  got = stitched.stitch([{"role": "user", "content": "q"}], "1/0 = 1", answer=None, cfg=stitched.StitchConfig(),
                        executor=executor, computation=bad)
  assert got.reason == stitched.RUN_FAILED and "ZeroDivisionError" in got.detail


def test_stitch_job_on_toy_solutions_writes_the_sft_schema(tmp_path):
  config = load("stitch_solutions", "smoke")
  result = collect.run(config, str(tmp_path))  # the collect job with builder = "stitched"
  report = [json.loads(line) for line in open(tmp_path / "stitch_report.jsonl")]
  skipped = [r for r in report if r["decision"] == stitched.NOTHING_TO_COMPUTE]
  assert len(report) == 16 and skipped and len(result.rows) == 16 - len(skipped)
  assert result.summary["decision/nothing_to_compute"] == len(skipped)
  assert json.load(open(tmp_path / "stitch_summary.json"))["stitched"] == len(result.rows)
  prep = data.prepare(data.SourceConfig(path=str(tmp_path / "stitched.parquet"), schema="sft",
                                        data_dir=str(tmp_path / "tfds")))
  convs = prep.records()
  assert len(convs) == len(result.rows) and convs[0].tools[0]["function"]["name"] == "code_interpreter"
  for conv, row, entry in zip(convs, result.rows, [r for r in report if r["decision"] == stitched.STITCHED]):
    _, first, tool, last = conv.messages
    code = first["tool_calls"][0]["function"]["arguments"]["code"]
    assert code == entry["code"] and tool["content"] == entry["output"] == row["ground_truth"]  # real output
    assert last["content"].endswith(f"The answer is \\boxed{{{row['ground_truth']}}}.")


def test_stitch_job_reads_plain_sft_conversations(tmp_path):
  rows = [{"messages": [{"role": "user", "content": "3 times 5?"},
                        {"role": "assistant", "content": "3*5 = 15, so \\boxed{15}."}]},
          {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}]
  path = tmp_path / "plain.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = load("stitch_solutions", **{"data.train_path": str(path), "data.train_schema": "sft",
                                       "stitch.advertise_tools": False})
  result = collect.run(config, str(tmp_path))
  assert result.summary["stitched"] == 1 and result.summary["decision/nothing_to_compute"] == 1
  assert result.rows[0]["tools"] == "[]"
  assert [m["role"] for m in result.rows[0]["messages"]] == ["user", "assistant", "tool", "assistant"]
  assert result.rows[0]["messages"][2]["content"] == "15"


def test_stitch_job_on_real_aime2024_solutions(tmp_path):
  config = load("stitch_solutions", "aime2024", **{"stitch.limit": 6})
  if not os.path.exists(config.data.train_path):
    pytest.skip(f"real AIME 2024 data not found at {config.data.train_path} (../shared/data is absent)")
  result = collect.run(config, str(tmp_path))
  assert result.summary["rows"] == 6 and result.rows
  for row in result.rows:
    tool = row["messages"][2]
    code = row["messages"][1]["tool_calls"][0]["function"]["arguments"]["code"]
    assert tool["role"] == "tool" and tool["content"].strip() and "print(" in code
    assert "\\boxed{" in row["messages"][-1]["content"]
