"""The embedded task's tokenizer: a small byte-level BPE trained locally on the task's own chat text.

It carries Qwen's chat special tokens (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, `<tool_call>` ...) and the
hermes chat template of `models.tokenizer`, and splits numbers into single digits as Qwen's pre-tokenizer does,
so the demo runs through exactly the code paths a real Qwen checkpoint uses. Training takes about a second; the
result is cached on disk (keyed by a hash of the corpus and settings) and reused by every later process:

    from agentrl_jax.tasks import tokenizer
    tok = tokenizer.load()              # built on first use, then read from the cache
    tokenizer.cached_dir()              # the directory, for `--config.model.tokenizer_path=...`

The cache is `models.tokenizer.cache_root()` (`$AGENTRL_JAX_CACHE/tokenizers` or `~/.cache/agentrl_jax/...`).
"""

from __future__ import annotations

import hashlib
import json
import random

import ml_collections

from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.tasks import arithmetic, teacher
from agentrl_jax.tools.code_interpreter import TOOL_SCHEMA

VOCAB_SIZE = 768
_VERSION = 1  # bump when the corpus or the builder changes in a way the hash does not see
# What the sandbox prints for the teacher's deliberate mistakes and for common model errors, so error turns
# encode compactly too (the exact text comes from the real sandbox at run time).
_ERRORS = (
    'Traceback (most recent call last):\n  File "/tmp/main.py", line 1, in <module>\n    print(12*34 + offset)\n'
    "NameError: name 'offset' is not defined",
    '  File "/tmp/main.py", line 1\n    print(12*34\n         ^\nSyntaxError: \'(\' was never closed',
    "ZeroDivisionError: division by zero", "SyntaxError: invalid syntax", "TypeError: unsupported operand",
    "Tool error: the arguments of code_interpreter are not valid JSON (Expecting value: line 1 column 1 (char 0)).",
    "Tool error: the code passed to code_interpreter is empty.", "(no output)",
)


def corpus(n: int = 400, seed: int = 0) -> list[str]:
  """Training text: chat renderings of task conversations in both teacher styles (tool schema in the system
  turn, calls, tool responses, answers), the bare problems, and typical error outputs."""
  from transformers.utils.chat_template_utils import _compile_jinja_template

  template = _compile_jinja_template(tok_lib.CHAT_TEMPLATE)
  rng = random.Random(seed)
  out = list(_ERRORS)
  for p in arithmetic.make_problems(n, seed=seed):
    style = rng.choice(teacher.STYLES)
    messages = [{"role": "user", "content": p.question}]
    for expression in teacher.steps(p, style):
      messages.append({"role": "assistant", "content": "", "tool_calls": [teacher.call(f"print({expression})")]})
      messages.append({"role": "tool", "content": "1517"})
    messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."})
    out.append(template.render(messages=messages, tools=[TOOL_SCHEMA], add_generation_prompt=False))
    out.append(p.question)
  return out


def cached_dir(vocab_size: int = VOCAB_SIZE) -> str:
  """The tokenizer's directory, trained and written on first use (`models.tokenizer.cached_build`)."""
  text = corpus()
  key = hashlib.sha256(json.dumps([_VERSION, vocab_size, tok_lib.CHAT_TEMPLATE, text]).encode()).hexdigest()[:12]
  return tok_lib.cached_build(f"embedded-{vocab_size}-{key}", lambda d: tok_lib.build_tiny_tokenizer(
      d, vocab_size=vocab_size, corpus=text, individual_digits=True))


def fill_model_block(block: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A job's `model` block with `tokenizer_path` set to this tokenizer when neither it nor `hf_path` names one
  (random-init and our own checkpoints of the embedded task); otherwise the block itself."""
  if block.get("tokenizer_path") or block.get("hf_path"):
    return block
  filled = ml_collections.ConfigDict(block.to_dict())
  filled.tokenizer_path = cached_dir()
  return filled


def load(vocab_size: int = VOCAB_SIZE):
  """The embedded task's tokenizer (`transformers.PreTrainedTokenizerFast`), from the cache."""
  return tok_lib.load_tokenizer(cached_dir(vocab_size))
