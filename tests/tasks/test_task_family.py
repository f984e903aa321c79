"""The embedded task family as the main job uses it: disjoint splits, the two teacher styles through the real
sandbox, and the task tokenizer (Qwen's special tokens, single digits, built once and cached)."""

import collections
import os
import random

import pytest

from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.tasks import arithmetic, teacher
from agentrl_jax.tasks import tokenizer as task_tokenizer
from agentrl_jax.tools import base, executors


@pytest.fixture(scope="module")
def executor():
  ex = executors.make_executor(base.ToolConfig(timeout_s=10))
  yield ex
  ex.close()


def test_splits_are_disjoint_deterministic_and_weighted():
  sizes = {"heldout": 120, "sft": 150, "rl": 600}
  weights = {0: 0.1, 1: 0.2, 2: 0.35, 3: 0.35}
  splits = arithmetic.make_splits(sizes, level_weights=weights, seed=3)
  assert {k: len(v) for k, v in splits.items()} == sizes
  keys = [p.key for split in splits.values() for p in split]
  assert len(keys) == len(set(keys))  # nothing repeats in any rendering, within or across splits
  assert splits == arithmetic.make_splits(sizes, level_weights=weights, seed=3)
  assert splits != arithmetic.make_splits(sizes, level_weights=weights, seed=4)
  levels = collections.Counter(p.level for p in splits["rl"])
  assert levels[2] > 2 * levels[0] and levels[3] > 2 * levels[0]
  for p in splits["rl"]:
    assert str(eval(p.expression)) == p.answer  # noqa: S307 (own text)


def test_splits_use_other_levels_when_one_runs_out():
  every_copy = [str(n) for n in range(100, 100_000)]  # level 0 has no problem left
  splits = arithmetic.make_splits({"a": 150}, level_weights={0: 1.0, 2: 0.01}, seed=0, exclude=every_copy)
  assert collections.Counter(p.level for p in splits["a"]) == {2: 150}


def test_frequent_style_calls_per_operation_and_reads_every_result_back(executor):
  p = arithmetic.Problem("Compute (12+7)*(30-4).", "(12+7)*(30-4)", "494", 3)
  conv = teacher.conversation(p, executor, random.Random(0), p_mistake=0.0, style="frequent")
  codes = [m["tool_calls"][0]["function"]["arguments"]["code"] for m in conv["messages"] if m.get("tool_calls")]
  assert codes == ["print(12+7)", "print(30-4)", "print(19*26)"]  # the last step uses the printed numbers
  assert [m["content"] for m in conv["messages"] if m["role"] == "tool"] == ["19", "26", "494"]
  assert conv["messages"][-1]["content"] == "The answer is \\boxed{494}."
  direct = teacher.conversation(arithmetic.Problem("Write 7.", "7", "7", 0), executor, random.Random(0),
                                style="frequent")
  assert [m["content"] for m in direct["messages"] if m["role"] == "tool"] == ["7"]
  deliberative = teacher.conversation(p, executor, random.Random(0), p_mistake=0.0)
  assert sum(bool(m.get("tool_calls")) for m in deliberative["messages"]) == 1
  with pytest.raises(ValueError, match="style"):
    teacher.conversation(p, executor, random.Random(0), style="often")


def test_task_tokenizer_is_cached_and_spells_numbers_digit_by_digit(tmp_path, monkeypatch):
  monkeypatch.setenv("AGENTRL_JAX_CACHE", str(tmp_path))
  first = task_tokenizer.cached_dir()
  assert first.startswith(str(tmp_path)) and os.path.isfile(os.path.join(first, "tokenizer.json"))
  mtime = os.path.getmtime(os.path.join(first, "tokenizer.json"))
  assert task_tokenizer.cached_dir() == first  # not rebuilt
  assert os.path.getmtime(os.path.join(first, "tokenizer.json")) == mtime
  tok = task_tokenizer.load()
  for special in (*tok_lib.SPECIAL_TOKENS, *tok_lib.ADDED_TOKENS):
    assert len(tok.encode(special, add_special_tokens=False)) == 1, special
  pieces = [tok.decode([i]) for i in tok.encode("print(3741*12)", add_special_tokens=False)]
  assert pieces[pieces.index("3"):pieces.index("3") + 4] == ["3", "7", "4", "1"]
  call = teacher.tool_call_text("37*41")
  assert tok.decode(tok.encode(call, add_special_tokens=False)) == call
  assert len(tok.encode(call, add_special_tokens=False)) < 0.5 * len(call)
  assert tok.eos_token == tok_lib.IM_END and tok.pad_token == tok_lib.ENDOFTEXT
