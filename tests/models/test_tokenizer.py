"""Tiny tokenizer with Qwen's special tokens and the hermes chat template."""

from agentrl_jax import testing
from agentrl_jax.models import tokenizer as tok_lib

SCHEMA = {"type": "function", "function": {"name": "code_interpreter", "description": "Run Python code",
                                           "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                          "required": ["code"]}}}


def test_special_tokens_are_single_ids():
  tok = testing.tiny_tokenizer()
  for t in tok_lib.SPECIAL_TOKENS + tok_lib.ADDED_TOKENS:
    ids = tok.encode(t, add_special_tokens=False)
    assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
  assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
  assert len(tok) == 512


def test_chat_template_hermes_format_round_trip():
  tok = testing.tiny_tokenizer()
  msgs = [{"role": "user", "content": "What is 2+3?"},
          {"role": "assistant", "content": "Let me run code.",
           "tool_calls": [{"type": "function", "function": {"name": "code_interpreter",
                                                            "arguments": {"code": "print(2+3)"}}}]},
          {"role": "tool", "content": "5"},
          {"role": "assistant", "content": "The answer is \\boxed{5}."}]
  text = tok_lib.render_chat(tok, msgs, tools=[SCHEMA])
  assert text.startswith("<|im_start|>system\n# Tools")
  assert '"name": "code_interpreter"' in text.split("\n</tools>")[0]
  assert ('<|im_start|>assistant\nLet me run code.\n<tool_call>\n{"name": "code_interpreter", "arguments": '
          '{"code": "print(2+3)"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n'
          '</tool_response><|im_end|>\n<|im_start|>assistant\nThe answer is \\boxed{5}.<|im_end|>\n') in text
  ids = tok.encode(text, add_special_tokens=False)
  assert tok.decode(ids) == text
  assert text.endswith("<|im_end|>\n")
  gen = tok_lib.render_chat(tok, msgs[:1], add_generation_prompt=True)
  assert gen == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"


def test_tool_response_text():
  tok = testing.tiny_tokenizer()
  assert tok_lib.tool_response_text(tok, ["5"]) == (
      "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
