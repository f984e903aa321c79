"""The real Qwen2.5 / Qwen3 vocabulary through the project's code paths: ids and encodings (against tiktoken on the
same BPE ranks), the chat templates, the agent loop's stop tokens and tool-response text, SFT masks, and the
collection's exact-render check."""

from __future__ import annotations

import base64
import unicodedata

from hypothesis import assume, given, settings, strategies as st
import numpy as np
import pytest

from agentrl_jax.data import collect
from agentrl_jax.models import qwen_tokenizer
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.rollout import chat
from agentrl_jax.rollout.parser import parse_tool_calls
from agentrl_jax.sft import masking
from agentrl_jax.tools.code_interpreter import TOOL_SCHEMA
from tests.data.test_collect_trajectories import make_episode

CALL = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(37*41)"}}}
CONVERSATION = [{"role": "user", "content": "Compute 37*41."},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "tool", "content": "1517"},
                {"role": "assistant", "content": "The answer is \\boxed{1517}."}]


@pytest.fixture(scope="module", params=qwen_tokenizer.FAMILIES)
def tok(request):
  return qwen_tokenizer.load(request.param)


@pytest.fixture(scope="module")
def qwen3():
  return qwen_tokenizer.load("qwen3")


@pytest.fixture(scope="module")
def tiktoken_encoding():
  import tiktoken

  with open(qwen_tokenizer.ranks_path(), "rb") as f:
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}
  return tiktoken.Encoding("qwen", pat_str=qwen_tokenizer.PATTERN, mergeable_ranks=ranks, special_tokens={})


def test_special_and_added_tokens_sit_at_the_checkpoints_ids(tok):
  ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>",
                                                    "</tool_call>", "<|file_sep|>")}
  assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                 "</tool_call>": 151658, "<|file_sep|>": 151664}
  for t in ids:
    assert tok.encode(t, add_special_tokens=False) == [ids[t]]  # one added token each, never split
  assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643 and tok.bos_token_id is None
  assert tok.decode([151657, 198, 151658]) == "<tool_call>\n</tool_call>"  # non-special: kept when decoding
  assert tok.decode([151644, 151645], skip_special_tokens=True) == ""


def test_qwen3_adds_its_tool_response_and_think_tokens(qwen3):
  assert len(qwen3) == 151669
  assert [qwen3.convert_tokens_to_ids(t) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")] \
      == [151665, 151666, 151667, 151668]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_encoding_equals_tiktoken_on_the_same_ranks(qwen3, tiktoken_encoding, text):
  text = text.replace("<|", "< |")  # special-token syntax is not plain text for either side
  assume(not any(t in text for t in qwen3.get_added_vocab()))  # nor are Qwen3's added tokens (<think>, ...)
  assert qwen3.encode(text, add_special_tokens=False) == tiktoken_encoding.encode(unicodedata.normalize("NFC", text))


def test_encoding_of_task_and_code_text(qwen3, tiktoken_encoding):
  for text in ("Compute (12+7)*(30-4). The answer is \\boxed{494}.", "def f(x):\n    return x ** 2  # 平方\n\n",
               "Traceback (most recent call last):\n  File \"/tmp/main.py\", line 1\n", "  a\tb\r\nc   "):
    assert qwen3.encode(text, add_special_tokens=False) == tiktoken_encoding.encode(text)
  assert [qwen3.decode([i]) for i in qwen3.encode("1517", add_special_tokens=False)] == ["1", "5", "1", "7"]


def test_qwen3_template_renders_the_tool_conversation(qwen3):
  text = tok_lib.render_chat(qwen3, CONVERSATION)
  assert text == ("<|im_start|>user\nCompute 37*41.<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                  '{"name": "code_interpreter", "arguments": {"code": "print(37*41)"}}\n</tool_call><|im_end|>\n'
                  "<|im_start|>user\n<tool_response>\n1517\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is \\boxed{1517}.<|im_end|>\n")
  prompt = tok_lib.render_chat(qwen3, CONVERSATION[:1], tools=[TOOL_SCHEMA], add_generation_prompt=True)
  assert prompt.startswith("<|im_start|>system\n# Tools\n") and prompt.endswith("<|im_start|>assistant\n")


def test_agent_loop_stops_and_tool_responses_with_the_real_vocabulary(tok):
  end, tool_end = chat.stop_token_ids(tok)
  assert 151645 in end and tool_end == (151658,)
  text = tok_lib.tool_response_text(tok, ["1517"])
  assert text == "<|im_end|>\n<|im_start|>user\n<tool_response>\n1517\n</tool_response><|im_end|>\n" \
                 "<|im_start|>assistant\n"
  renderer = chat.ToolResponseRenderer(tok)
  chunk = renderer.chunk(151658, ["1517"])
  assert chunk[0] == 151658 and tok.decode(chunk[1:]) == text
  generated = tok.encode('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(37*41)"}}\n'
                         "</tool_call>", add_special_tokens=False)
  assert generated[-1] == 151658  # the sampler pauses on this one token
  (call,) = parse_tool_calls(tok.decode(generated), ("code_interpreter",))
  assert call.ok and call.code == "print(37*41)"


def test_sft_masks_train_exactly_the_assistant_turns(qwen3):
  enc = masking.encode_conversation(qwen3, CONVERSATION)
  assert qwen3.decode(enc.tokens) == tok_lib.render_chat(qwen3, CONVERSATION)
  trained = qwen3.decode(enc.tokens[enc.loss_mask])
  assert trained == ('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(37*41)"}}\n'
                     "</tool_call><|im_end|><think>\n\n</think>\n\nThe answer is \\boxed{1517}.<|im_end|>")
  assert not enc.loss_mask[enc.tokens == 151644].any()  # no <|im_start|> (headers) is trained


def test_collection_render_check_with_qwen3(qwen3):
  """Qwen3's template writes a `<think>` block into the last assistant turn: an episode whose model wrote one
  renders back exactly; one that did not is caught (SFT would train on text the model never produced)."""
  prompt = CONVERSATION[:1]
  call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(37*41)"}}\n</tool_call>'
  for final, exact in (("<think>\n\n</think>\n\nThe answer is \\boxed{1517}.<|im_end|>", True),
                       ("The answer is \\boxed{1517}.<|im_end|>", False)):
    episode = make_episode(qwen3, prompt, [(call, [("ok", "1517")]), (final, None)])
    messages = collect.episode_messages(episode, prompt, qwen3)
    problem, token_exact = collect.check_render(qwen3, messages, [], episode)
    assert (problem == "") == exact, problem
    assert token_exact == exact
    if exact:
      assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"code": "print(37*41)"}
      np.testing.assert_array_equal(episode.response_ids[:len(qwen3.encode(call, add_special_tokens=False))],
                                    qwen3.encode(call, add_special_tokens=False))


def test_qwen3_rewriting_earlier_turns_is_refused_and_single_question_reasoning_is_kept(qwen3):
  """Qwen3's template drops the `<think>` block of assistant turns before the last user message once a later
  message exists: the full render (what SFT trains on) would then teach an answer without the reasoning the
  data holds. Refused with the reason; the recipe's one-question tool-use conversations keep every turn's
  reasoning and train exactly the assistant turns."""
  first = [{"role": "user", "content": "Compute 2+3."},
           {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n\\boxed{5}"}]
  second = [{"role": "user", "content": "And 37*41?"},
            {"role": "assistant", "content": "<think>\ncall the tool\n</think>\n\n", "tool_calls": [CALL]},
            {"role": "tool", "content": "1517"},
            {"role": "assistant", "content": "<think>\nthe tool said 1517\n</think>\n\nThe answer is \\boxed{1517}."}]
  full = tok_lib.render_chat(qwen3, first + second)
  assert "add them" not in full and "the tool said 1517" in full  # the template rewrote the first turn
  with pytest.raises(masking.MalformedConversation, match="message 1 .*rewrites this turn"):
    masking.encode_conversation(qwen3, first + second)
  for conv in (first, second):
    enc = masking.encode_conversation(qwen3, conv)
    assert qwen3.decode(enc.tokens) == tok_lib.render_chat(qwen3, conv)
  trained = qwen3.decode(enc.tokens[enc.loss_mask])
  assert trained == ("<think>\ncall the tool\n</think>\n\n"
                     '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(37*41)"}}\n</tool_call>'
                     "<|im_end|><think>\nthe tool said 1517\n</think>\n\nThe answer is \\boxed{1517}.<|im_end|>")


def test_a_template_that_rewrites_history_inconsistently_is_refused(qwen3):
  """A template whose render of the history changes once later turns exist (here: an earlier assistant turn
  is replaced by a summary) would train on text nobody wrote: refused with the reason, never mis-masked."""
  import copy

  tok = copy.copy(qwen3)
  tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                       "{% if m.role == 'assistant' and not loop.last %}(earlier answer){% else %}{{ m.content }}"
                       "{% endif %}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  conv = [{"role": "user", "content": "Compute 2+3."}, {"role": "assistant", "content": "\\boxed{5}"},
          {"role": "user", "content": "And 2+4?"}, {"role": "assistant", "content": "\\boxed{6}"}]
  with pytest.raises(masking.MalformedConversation, match="message 1 .*rewrites this turn"):
    masking.encode_conversation(tok, conv)
