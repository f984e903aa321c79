"""Tokens and assistant-only loss masks of multi-turn conversations, by incremental chat-template rendering.

A conversation is rendered with the tokenizer's own chat template (tools included), whole and incrementally:

    full    = render(messages)                                   # the text trained on
    before  = render(messages[:a], add_generation_prompt=True)   # ... <|im_start|>assistant\n   (per assistant a)

`before` must be a prefix of `full` (the template renders history the same once later turns exist, and its
generation prompt is how it renders an assistant header); then assistant turn `a` starts at `len(before)` and
ends with its closing `<|im_end|>`, the first one after that start (message contents may not contain control
tokens, so it cannot come from the text itself). Trained (mask 1): each assistant turn's content, tool calls
and closing `<|im_end|>`. Masked: system, user and tool turns, the `<|im_start|>assistant\n` headers, the
newline after `<|im_end|>`. A template whose renders do not extend each other, or that rewrites an assistant
turn's content once later turns exist (Qwen3 drops the reasoning of turns before the last user message), is
reported, never mis-masked.

The turn's end comes from `full` rather than from `render(messages[:a + 1])` because some templates (Qwen3's)
render the *last* assistant turn differently from the same turn as history; `full` is what is trained on.

Each piece is tokenized on its own and the pieces are concatenated: the same token boundaries a rollout
produces (prompt tokenized with the generation header, the model's own tokens, tool responses appended), so
SFT trains on the sequences the policy later generates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl_jax.models import tokenizer as tok_lib

ROLES = ("system", "user", "assistant", "tool")


class MalformedConversation(ValueError):
  """A conversation SFT cannot train on; the trainer logs the reason, skips it and counts it."""


@dataclasses.dataclass(frozen=True)
class EncodedConversation:
  """One conversation as tokens.

  Attributes:
    tokens: `[L]` int32 token ids of the rendered conversation.
    loss_mask: `[L]` bool, True on the assistant tokens trained on (content and the closing `<|im_end|>`).
    index: the conversation's row index in its source (for messages and samples).
  """

  tokens: np.ndarray
  loss_mask: np.ndarray
  index: int = -1

  def __post_init__(self):
    if self.tokens.shape != self.loss_mask.shape or self.tokens.ndim != 1:
      raise ValueError(f"EncodedConversation: tokens {self.tokens.shape} and loss_mask {self.loss_mask.shape} "
                       "must be matching 1-D arrays")

  def __len__(self) -> int:
    return int(self.tokens.shape[0])

  @property
  def num_trained(self) -> int:
    return int(self.loss_mask.sum())


def _check(messages: Sequence[dict[str, Any]], special: Sequence[str]) -> None:
  """Structural checks; raises MalformedConversation naming the message index."""
  if not messages:
    raise MalformedConversation("no messages")
  if messages[0].get("role") not in ("system", "user"):
    raise MalformedConversation(f"message 0 is {messages[0].get('role')!r}; a conversation starts with a "
                                "system or user message")
  seen_assistant = False
  for i, m in enumerate(messages):
    role = m.get("role") if isinstance(m, dict) else None
    if role not in ROLES:
      raise MalformedConversation(f"message {i}: role {role!r} is not one of {ROLES}")
    content = m.get("content")
    if content is None and role == "assistant":
      content = ""
    if not isinstance(content, str):
      raise MalformedConversation(f"message {i} ({role}): content must be a string, got {type(content).__name__}")
    if role == "tool" and not seen_assistant:
      raise MalformedConversation(f"message {i} (tool) comes before any assistant turn")
    if role == "user" and not content.strip():
      raise MalformedConversation(f"message {i} (user) has empty content")
    if role == "assistant":
      seen_assistant = True
      if not content.strip() and not m.get("tool_calls"):
        raise MalformedConversation(f"message {i} (assistant) has empty content and no tool calls")
    calls = [c.get("function") or c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    texts = [content] + [str(c.get(k, "")) for c in calls for k in ("name", "arguments")]
    for s in special:
      if any(s in t for t in texts):
        raise MalformedConversation(f"message {i} ({role}) contains the control token {s!r}")
  if not seen_assistant:
    raise MalformedConversation("no assistant message")


def render_pieces(tokenizer, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
                  *, end_of_turn: str = tok_lib.IM_END) -> list[tuple[str, bool]]:
  """The rendered conversation as `(text, trained)` pieces, alternating masked and trained.

  Messages after the last assistant turn carry no loss and are dropped.

  Raises:
    MalformedConversation: bad structure (see `encode_conversation`), or a template whose incremental renders
      are not prefixes of the full render.
  """
  _check(messages, [t for t in tokenizer.all_special_tokens if t])
  messages = [dict(m, content=m.get("content") or "") if m["role"] == "assistant" else m for m in messages]
  assistants = [a for a, m in enumerate(messages) if m["role"] == "assistant"]
  messages = messages[:assistants[-1] + 1]
  tools = list(tools) if tools else None
  render = lambda ms, gen=False: tok_lib.render_chat(tokenizer, list(ms), tools=tools,  # noqa: E731
                                                     add_generation_prompt=gen)
  full = render(messages)
  pieces: list[tuple[str, bool]] = []
  pos = 0  # end of the previous trained piece in `full`
  for a in assistants:
    start = len(before := render(messages[:a], gen=True))
    if start < pos or not full.startswith(before):
      raise MalformedConversation(
          f"message {a} (assistant): the chat template renders the conversation before this turn differently "
          "once later turns exist (or its generation prompt differs from its assistant header), so the mask "
          "is undefined")
    end = full.find(end_of_turn, start)
    if end < 0:
      raise MalformedConversation(f"message {a} (assistant): rendered turn has no {end_of_turn!r}")
    end += len(end_of_turn)
    if _squash(messages[a]["content"]) not in _squash(full[start:end]):
      raise MalformedConversation(
          f"message {a} (assistant): the chat template rewrites this turn once later turns exist (Qwen3's drops "
          "the <think> reasoning of turns before the last user message), so training on the full render would "
          "teach text the model never wrote; give each user question its own conversation")
    pieces += [(full[pos:start], False), (full[start:end], True)]
    pos = end
  pieces.append((full[pos:], False))  # after the last assistant turn: its trailing newline
  return [p for p in pieces if p[0]]


def _squash(text: str) -> str:
  """Text without whitespace: templates re-space what they render (Qwen3 puts newlines around reasoning)."""
  return "".join(text.split())


def encode_conversation(tokenizer, messages: Sequence[dict[str, Any]],
                        tools: Sequence[dict[str, Any]] | None = None, *, max_tokens: int | None = None,
                        index: int = -1) -> EncodedConversation:
  """Tokens and assistant-only loss mask of one conversation.

  Args:
    tokenizer: a HF tokenizer with a ChatML chat template (Qwen's, or `models.tokenizer.tiny_tokenizer()`).
    messages: system / user / assistant / tool messages; assistant messages may carry `tool_calls`.
    tools: JSON tool schemas rendered into the system turn.
    max_tokens: reject longer conversations (they would not fit a packed row).
    index: carried into the result.

  Raises:
    MalformedConversation: no assistant message; a first message that is not system or user; an unknown role;
      non-string content; a tool turn before any assistant turn; an empty user turn; an assistant turn with
      neither content nor tool calls; a control token (e.g. `<|im_end|>`) inside content or a tool call; a
      template that does not render incrementally (see `render_pieces`); more than `max_tokens` tokens.
  """
  ids, mask = [], []
  for text, trained in render_pieces(tokenizer, messages, tools):
    piece = tokenizer.encode(text, add_special_tokens=False)
    ids.extend(piece)
    mask.extend([trained] * len(piece))
  if max_tokens is not None and len(ids) > max_tokens:
    raise MalformedConversation(f"{len(ids)} tokens, more than max_seq_len={max_tokens}")
  return EncodedConversation(np.asarray(ids, np.int32), np.asarray(mask, bool), index)


TRUNCATIONS = ("right", "left")


def truncate(conv: EncodedConversation, max_tokens: int, side: str = "right") -> EncodedConversation:
  """The first (`right`: the end is cut) or last (`left`) `max_tokens` tokens with their mask, as verl's
  multi-turn SFT dataset truncates (`data.truncation`); a conversation that fits is returned as is.

  Raises:
    ValueError: unknown `side` or `max_tokens` < 1.
  """
  if side not in TRUNCATIONS:
    raise ValueError(f"truncate: side must be one of {TRUNCATIONS}, got {side!r}")
  if max_tokens < 1:
    raise ValueError(f"truncate: max_tokens must be >= 1, got {max_tokens}")
  if len(conv) <= max_tokens:
    return conv
  keep = slice(0, max_tokens) if side == "right" else slice(len(conv) - max_tokens, len(conv))
  return EncodedConversation(conv.tokens[keep], conv.loss_mask[keep], conv.index)
