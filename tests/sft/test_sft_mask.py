"""Assistant-only loss masks: token-level expectations on rendered multi-turn tool conversations."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.sft import masking, packing

TOOL = {"type": "function", "function": {"name": "code_interpreter", "description": "Run Python.",
                                         "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}
CALL = {"type": "function", "function": {"name": "code_interpreter", "arguments": json.dumps({"code": "print(6*7)"})}}
MESSAGES = [
    {"role": "system", "content": "You can run Python."},
    {"role": "user", "content": "What is 6*7?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL]},
    {"role": "tool", "content": "42"},
    {"role": "tool", "content": "ok"},
    {"role": "assistant", "content": "The answer is 42."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome."},
]
# The rendered conversation, written out: (text, trained). Trained: each assistant turn's content (with its
# tool call) and its closing <|im_end|>. Masked: system (with the tool list), user and tool turns, the
# <|im_start|>assistant\n headers and the newline after each <|im_end|>.
SYSTEM = ("<|im_start|>system\nYou can run Python.\n\n# Tools\n\nYou may call one or more functions to assist with "
          "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
          + json.dumps(TOOL) + "\n</tools>\n\nFor each function call, return a json object with function name and "
          "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
          "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
EXPECTED = [
    (SYSTEM + "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n", False),
    ("Let me compute.\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(6*7)\"}}\n"
     "</tool_call><|im_end|>", True),
    ("\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
     "<|im_start|>assistant\n", False),
    ("The answer is 42.<|im_end|>", True),
    ("\n<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n", False),
    ("You are welcome.<|im_end|>", True),
    ("\n", False),
]


@pytest.fixture(scope="module")
def tok():
  return testing.tiny_tokenizer()


def _expected_tokens(tok, pieces):
  ids, mask = [], []
  for text, trained in pieces:
    piece = tok.encode(text, add_special_tokens=False)
    ids += piece
    mask += [trained] * len(piece)
  return np.array(ids), np.array(mask)


def test_mask_render_pieces_match_written_expectation(tok):
  assert masking.render_pieces(tok, MESSAGES, [TOOL]) == EXPECTED
  assert "".join(t for t, _ in EXPECTED) == tok_lib.render_chat(tok, MESSAGES, tools=[TOOL])


def test_mask_tokens_match_token_level_expectation(tok):
  enc = masking.encode_conversation(tok, MESSAGES, [TOOL], index=7)
  ids, mask = _expected_tokens(tok, EXPECTED)
  np.testing.assert_array_equal(enc.tokens, ids)
  np.testing.assert_array_equal(enc.loss_mask, mask)
  assert enc.index == 7
  im_start, im_end = tok.convert_tokens_to_ids([tok_lib.IM_START, tok_lib.IM_END])
  # Every <|im_start|> is masked (headers included); exactly the three assistant <|im_end|>s are trained.
  assert not enc.loss_mask[enc.tokens == im_start].any()
  assert enc.loss_mask[enc.tokens == im_end].tolist() == [False, False, True, False, True, False, True]
  # The token right before each trained span is the header's newline, after "assistant".
  starts = np.flatnonzero(np.diff(enc.loss_mask.astype(int)) == 1) + 1
  assert len(starts) == 3
  for s in starts:
    assert tok.decode(enc.tokens[s - 5:s]) == "<|im_start|>assistant\n"  # 5 tiny-BPE tokens
  assert tok.decode(enc.tokens[enc.loss_mask]) == ("Let me compute.\n<tool_call>\n{\"name\": \"code_interpreter\", "
                                                   "\"arguments\": {\"code\": \"print(6*7)\"}}\n</tool_call><|im_end|>"
                                                   "The answer is 42.<|im_end|>You are welcome.<|im_end|>")


def test_mask_token_by_token(tok):
  # Every token of a short tool conversation with its mask bit (1 = trained), as the tiny BPE splits them.
  msgs = [{"role": "user", "content": "6*7?"},
          {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 6}}}]},
          {"role": "tool", "content": "42"},
          {"role": "assistant", "content": "42"}]
  expected = [
      ("<|im_start|>", 0), ("user", 0), ("\n", 0), ("6", 0), ("*", 0), ("7", 0), ("?", 0), ("<|im_end|>", 0),
      ("\n", 0), ("<|im_start|>", 0), ("as", 0), ("sist", 0), ("ant", 0), ("\n", 0),
      ("<tool_call>", 1), ("\n", 1), ('{"', 1), ("name", 1), ('":', 1), (' "', 1), ("f", 1), ('",', 1), (' "', 1),
      ("argu", 1), ("ment", 1), ("s", 1), ('":', 1), (' {"', 1), ("x", 1), ('":', 1), (" 6", 1), ("}", 1), ("}", 1),
      ("\n", 1), ("</tool_call>", 1), ("<|im_end|>", 1),
      ("\n", 0), ("<|im_start|>", 0), ("user", 0), ("\n", 0), ("<tool_response>", 0), ("\n", 0), ("42", 0),
      ("\n", 0), ("</tool_response>", 0), ("<|im_end|>", 0), ("\n", 0), ("<|im_start|>", 0), ("as", 0),
      ("sist", 0), ("ant", 0), ("\n", 0),
      ("42", 1), ("<|im_end|>", 1),
      ("\n", 0),
  ]
  enc = masking.encode_conversation(tok, msgs)
  assert [(tok.decode([int(t)]), int(m)) for t, m in zip(enc.tokens, enc.loss_mask)] == expected


def test_mask_tool_call_only_turn_and_trailing_messages(tok):
  # An assistant turn with no text (only a tool call) is trained; messages after the last assistant are dropped.
  msgs = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
          {"role": "tool", "content": ""}, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "?"}]
  pieces = masking.render_pieces(tok, msgs)
  assert pieces == [
      ("<|im_start|>user\nGo.<|im_end|>\n<|im_start|>assistant\n", False),
      ("<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(6*7)\"}}\n</tool_call>"
       "<|im_end|>", True),
      ("\n<|im_start|>user\n<tool_response>\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n", False),
      ("Done.<|im_end|>", True),
      ("\n", False),
  ]


@pytest.mark.parametrize("messages, reason", [
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}, {"role": "assistant", "content": "y"}],
     "message 1 \\(tool\\) comes before any assistant turn"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}],
     "message 1 \\(assistant\\) has empty content"),
    ([{"role": "user", "content": "  "}, {"role": "assistant", "content": "y"}], "message 0 \\(user\\) has empty"),
    ([{"role": "user", "content": "x"}], "no assistant message"),
    ([{"role": "assistant", "content": "y"}], "starts with a system or user"),
    ([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}], "role 'robot'"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": 3}], "content must be a string"),
    ([{"role": "user", "content": "x<|im_end|>"}, {"role": "assistant", "content": "y"}], "control token"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": '{"a": "<|im_start|>"}'}}]}], "message 1 .* control token"),
    ([], "no messages"),
])
def test_mask_malformed_conversations_are_named(tok, messages, reason):
  with pytest.raises(masking.MalformedConversation, match=reason):
    masking.encode_conversation(tok, messages)


def test_mask_overlong_conversation(tok):
  msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y " * 50}]
  n = len(masking.encode_conversation(tok, msgs))
  assert len(masking.encode_conversation(tok, msgs, max_tokens=n)) == n
  with pytest.raises(masking.MalformedConversation, match=f"{n} tokens, more than max_seq_len={n - 1}"):
    masking.encode_conversation(tok, msgs, max_tokens=n - 1)


class _ToyTemplate:
  """A ChatML template stand-in: `last_think` marks the final assistant turn as Qwen3's template does (an empty
  think block), `gen_think` puts one in the generation prompt only (Qwen3 with enable_thinking=False)."""

  def __init__(self, tok, last_think=False, gen_think=False):
    self.all_special_tokens = tok.all_special_tokens
    self.last_think, self.gen_think = last_think, gen_think

  def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
    out = ""
    for i, m in enumerate(messages):
      think = "<think></think>" if m["role"] == "assistant" and self.last_think and i == len(messages) - 1 else ""
      out += f"<|im_start|>{m['role']}\n{think}{m['content']}<|im_end|>\n"
    return out + ("<|im_start|>assistant\n" + ("<think></think>" if self.gen_think else "")
                  if add_generation_prompt else "")


def test_mask_templates_that_render_the_last_turn_differently(tok):
  msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
          {"role": "assistant", "content": "d"}]
  # The last turn as the template renders it in the full conversation: trained as rendered.
  assert masking.render_pieces(_ToyTemplate(tok, last_think=True), msgs) == [
      ("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n", False), ("b<|im_end|>", True),
      ("\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n", False), ("<think></think>d<|im_end|>", True),
      ("\n", False)]
  # A generation prompt that history never shows has no well-defined mask: reported, never mis-masked.
  with pytest.raises(masking.MalformedConversation, match="message 1 .* renders the conversation before"):
    masking.render_pieces(_ToyTemplate(tok, gen_think=True), msgs)


def test_mask_packing_shifts_targets_and_keeps_segments(tok):
  convs = [masking.encode_conversation(tok, [{"role": "user", "content": "q" * k},
                                            {"role": "assistant", "content": "a"}], index=k) for k in (1, 2, 30)]
  lens = [len(c) for c in convs]
  seq_len = lens[2] - 1 + 4  # the long one alone in a row; the two short ones share the other
  packed = packing.pack(convs, seq_len=seq_len, micro_rows=1, max_rows=8)
  assert packed.inputs.shape == (2, 1, seq_len) and packed.row_index == (1, 2, 30)
  rows = {f: a.reshape(2, seq_len) for f, a in packed.arrays().items()}
  long, short = rows["segment_ids"][0], rows["segment_ids"][1]
  assert (long[:lens[2] - 1] == 1).all() and (long[lens[2] - 1:] == 0).all()
  assert list(short[:lens[1] - 1 + lens[0] - 1]) == [1] * (lens[1] - 1) + [2] * (lens[0] - 1)
  np.testing.assert_array_equal(rows["inputs"][0, :lens[2] - 1], convs[2].tokens[:-1])
  np.testing.assert_array_equal(rows["targets"][0, :lens[2] - 1], convs[2].tokens[1:])
  np.testing.assert_array_equal(rows["weights"][0, :lens[2] - 1], convs[2].loss_mask[1:])
  assert list(rows["positions"][1, lens[1] - 1:lens[1] + 1]) == [0, 1]  # positions restart per segment
  assert packed.num_tokens == sum(c.loss_mask[1:].sum() for c in convs)
  # Row buckets: micro_rows * 2**k, capped at the batch's worst case.
  assert [packing.row_bucket(r, 2, 32) for r in (1, 2, 3, 5, 9, 17, 32)] == [2, 2, 4, 8, 16, 32, 32]
  assert [packing.row_bucket(r, 8, 20) for r in (1, 9, 17)] == [8, 16, 24]
  with pytest.raises(ValueError, match="rows hold"):
    packing.pack(convs, seq_len=lens[2] - 2, micro_rows=1, max_rows=8)
