"""Tokenizers and chat rendering.

Real checkpoints bring their own tokenizer and chat template (loaded from a local directory with
`transformers.AutoTokenizer`; nothing downloads). For tests and the CPU demo, `build_tiny_tokenizer` trains a
small byte-level BPE locally that carries Qwen's special tokens and a chat template rendering Qwen's hermes
tool-call format, so the same code paths run on both.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Callable

import transformers

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
THINK, THINK_END = "<think>", "</think>"
# Control tokens (never produced by the byte-level pre-tokenizer) and the tool/think markers, which Qwen
# registers as added (non-special) tokens so that decoding keeps them.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ADDED_TOKENS = (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, THINK, THINK_END)

# Qwen's hermes-style chat template (the format of Qwen2.5/Qwen3's own templates, without their default system
# prompt and thinking handling): tools listed in the system turn, calls as <tool_call>{json}</tool_call>,
# tool results as <tool_response> blocks inside one user turn.
CHAT_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' + (message.content or '') }}
        {%- for tool_call in (message.tool_calls or []) %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if (loop.first and message.content) or (not loop.first) %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""".strip()

# Training text for the tiny tokenizer: chat scaffolding, Python and math, so typical demo text encodes in few
# tokens. Any text still encodes (byte-level BPE has all 256 bytes).
_TINY_CORPUS = [
    "Let me compute this with Python. The answer is \\boxed{42}.",
    "import math\nprint(sum(range(10)))\nfor i in range(3):\n    x = i * 2\n",
    "def f(x):\n    return x * x + 1\n\nresult = f(3)\nprint(result)\n",
    "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\nNameError: name 'x' is not defined",
    '{"name": "code_interpreter", "arguments": {"code": "print(1 + 2)"}}',
    "The sum of the digits is 7, so the final answer is 7. Therefore the result is correct.",
    "Question: what is 12 + 30? Please reason step by step, and put your final answer within \\boxed{}.",
    "system user assistant tool stdout stderr error output result answer number value list string",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 + - * / = ( ) [ ] { } : , . ' \" # % < >",
]


def load_tokenizer(path: str | os.PathLike) -> transformers.PreTrainedTokenizerBase:
  """Loads a tokenizer (and its chat template) from a local directory; never touches the network."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise ValueError(f"tokenizer directory {path!r} does not exist")
  return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def build_tiny_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 512, corpus: list[str] | None = None, *,
                         individual_digits: bool = False) -> transformers.PreTrainedTokenizerBase:
  """Trains a byte-level BPE with Qwen's special tokens and hermes chat template; saves it to `out_dir`.

  Args:
    out_dir: where the tokenizer files go (`tokenizer.json`, `tokenizer_config.json`, ...).
    vocab_size: total size including the special and added tokens.
    corpus: training text (default: a small generic chat/Python/math corpus).
    individual_digits: split numbers into single digits before BPE, as Qwen2/Qwen3's pre-tokenizer does, so
      every number is spelled digit by digit (regular for arithmetic and for copying numbers).

  Deterministic for a given corpus and vocab size. Returns the tokenizer reloaded with `AutoTokenizer`.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  n_fixed = 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
  if vocab_size < n_fixed + 16:
    raise ValueError(f"build_tiny_tokenizer: vocab_size must be >= {n_fixed + 16}, got {vocab_size}")
  tok = Tokenizer(models.BPE())
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                       if individual_digits else byte_level)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(ADDED_TOKENS), special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator((corpus or _TINY_CORPUS) * 4, trainer)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None, bos_token=None,
      additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
  fast.add_tokens(list(ADDED_TOKENS), special_tokens=False)
  out_dir = os.fspath(out_dir)
  fast.save_pretrained(out_dir)
  return load_tokenizer(out_dir)


def cache_root() -> str:
  """Where locally built tokenizers are cached: `$AGENTRL_JAX_CACHE/tokenizers`, else
  `$XDG_CACHE_HOME/agentrl_jax/tokenizers`, else `~/.cache/agentrl_jax/tokenizers`."""
  if os.environ.get("AGENTRL_JAX_CACHE"):
    return os.path.join(os.environ["AGENTRL_JAX_CACHE"], "tokenizers")
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "agentrl_jax", "tokenizers")


def cached_build(name: str, build: Callable[[str], object]) -> str:
  """The directory `cache_root()/name`, made on first use by `build(tmp_dir)` and renamed into place atomically
  (concurrent builders of a deterministic build agree: the first rename wins, the others' copies are dropped).
  `name` must identify everything the build depends on (callers put a hash of their inputs in it)."""
  root = cache_root()
  out = os.path.join(root, name)
  if os.path.isfile(os.path.join(out, "tokenizer.json")):
    return out
  os.makedirs(root, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".build-", dir=root)
  try:
    build(tmp)
    try:
      os.rename(tmp, out)
    except OSError:
      if not os.path.isfile(os.path.join(out, "tokenizer.json")):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def render_chat(tokenizer, messages: list[dict], *, tools: list[dict] | None = None,
                add_generation_prompt: bool = False) -> str:
  """Renders messages through the tokenizer's own chat template (with `tools=` schemas)."""
  return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)


def tool_response_text(tokenizer, contents: list[str]) -> str:
  """The text that follows an assistant tool-call turn: its `<|im_end|>`, the tool results and the next
  assistant header, as the chat template renders them.

  Found by rendering a reference conversation (user, an assistant turn holding a sentinel, the tool results,
  the generation prompt) and taking what follows the sentinel, so any template that follows the ChatML layout
  works, real Qwen checkpoints' own included: Qwen3's renders the conversation's last assistant turn with a
  `<think>` block, which is why the assistant turn is never the last message here.
  """
  sentinel = "AGENTRL_TURN_SENTINEL"
  messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": sentinel}]
  full = render_chat(tokenizer, messages + [{"role": "tool", "content": c} for c in contents],
                     add_generation_prompt=True)
  # The model itself stops at </tool_call>, so the continuation starts with the turn's closing marker.
  i = full.find(sentinel)
  if i < 0 or full.count(sentinel) != 1 or not full.startswith(IM_END, i + len(sentinel)):
    raise ValueError("chat template renders tool turns in a way tool_response_text cannot split")
  return full[i + len(sentinel):]


@functools.cache
def tiny_tokenizer_dir(vocab_size: int = 512) -> str:
  """Builds (once per process) the tiny BPE tokenizer of `build_tiny_tokenizer` in a temporary directory (removed
  at exit); returns the directory. For tests and benchmarks on random-weight models."""
  out = tempfile.mkdtemp(prefix=f"agentrl_jax_tiny_tokenizer_{vocab_size}_")
  atexit.register(shutil.rmtree, out, ignore_errors=True)
  build_tiny_tokenizer(out, vocab_size=vocab_size)
  return out


def tiny_tokenizer(vocab_size: int = 512) -> transformers.PreTrainedTokenizerBase:
  """The tokenizer of `tiny_tokenizer_dir`."""
  return load_tokenizer(tiny_tokenizer_dir(vocab_size))
