"""The embedded arithmetic task and its scripted teacher (real sandbox execution)."""


import pytest

from agentrl_jax import data, testing
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.tasks import arithmetic, teacher
from agentrl_jax.tasks import tokenizer as task_tokenizer
from agentrl_jax.tools import base, executors


@pytest.fixture(scope="module")
def executor():
  ex = executors.make_executor(base.ToolConfig(timeout_s=10))
  yield ex
  ex.close()


def test_problems_are_deterministic_and_correct():
  a = arithmetic.make_problems(50, seed=3)
  assert a == arithmetic.make_problems(50, seed=3)
  assert a != arithmetic.make_problems(50, seed=4)
  assert {p.level for p in a} == set(arithmetic.LEVELS)
  for p in a:
    assert str(eval(p.expression)) == p.answer  # noqa: S307
  assert {p.level for p in arithmetic.make_problems(20, levels=(2,), seed=0)} == {2}
  with pytest.raises(ValueError, match="unknown level 7"):
    arithmetic.make_problems(1, levels=(7,))


def test_rl_rows_build_through_the_data_pipeline(tmp_path):
  problems = arithmetic.make_problems(12, seed=0)
  path = arithmetic.write_rl_parquet(str(tmp_path / "toy.parquet"), problems)
  prep = data.prepare(data.SourceConfig(path=path, schema="rl", data_dir=str(tmp_path / "tfds")))
  assert prep.num_examples == 12
  batch = next(iter(data.prompt_batches(prep.data_source, data.PipelineConfig(batch_size=12, seed=0, shuffle=False),
                                        style=data.PromptStyle(rules=(("toy_", "plain"),)))))
  assert [r.ground_truth for r in batch] == [p.answer for p in problems]
  assert batch[0].prompt == [{"role": "user", "content": problems[0].question}]
  assert batch[0].data_source == arithmetic.DATA_SOURCE


def test_teacher_tool_call_matches_chat_template(executor):
  tok = testing.tiny_tokenizer()
  problems = [p for p in arithmetic.make_problems(40, seed=1) if p.level >= 2][:3]
  convs = teacher.conversations(problems, executor, seed=0, p_mistake=0.0)
  assert len(convs) == 3
  for p, c in zip(problems, convs):
    text = tok_lib.render_chat(tok, c["messages"], tools=c["tools"])
    assert teacher.tool_call_text(p.expression) + "<|im_end|>" in text
    assert f"<tool_response>\n{p.answer}\n</tool_response>" in text  # the REAL output of the sandbox
    assert text.endswith(f"The answer is \\boxed{{{p.answer}}}.<|im_end|>\n")


def test_teacher_mistakes_show_real_errors_then_recover(executor):
  problems = [p for p in arithmetic.make_problems(60, seed=2) if p.level >= 2][:6]
  convs = teacher.conversations(problems, executor, seed=0, p_mistake=1.0)
  assert len(convs) == 6
  for c in convs:
    tool_msgs = [m["content"] for m in c["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 2
    assert "SyntaxError" in tool_msgs[0] or "NameError" in tool_msgs[0]
    assert c["messages"][-1]["content"].startswith("The answer is \\boxed{")


def test_sft_parquet_builds_through_the_data_pipeline(tmp_path, executor):
  convs = teacher.conversations(arithmetic.make_problems(10, seed=5), executor, seed=0)
  path = teacher.write_sft_parquet(str(tmp_path / "sft.parquet"), convs)
  prep = data.prepare(data.SourceConfig(path=path, schema="sft", data_dir=str(tmp_path / "tfds")))
  assert prep.num_examples == len(convs)
  batch = next(iter(data.conversation_batches(prep.data_source, data.PipelineConfig(batch_size=len(convs), seed=0,
                                                                                    shuffle=False))))
  assert [c.messages[0]["content"] for c in batch] == [c["messages"][0]["content"] for c in convs]
  assert batch[0].tools[0]["function"]["name"] == "code_interpreter"


def test_tokenizer_corpus_compresses_task_text(tmp_path):
  tok = tok_lib.build_tiny_tokenizer(tmp_path / "tok", vocab_size=1024, corpus=task_tokenizer.corpus(300))
  call = teacher.tool_call_text("37*41")
  assert len(tok.encode(call, add_special_tokens=False)) < 0.5 * len(call)
