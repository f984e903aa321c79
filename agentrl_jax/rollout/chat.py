"""Chat-format pieces the agent loop needs: stop tokens of a tokenizer and the tool-response token chunk."""

from __future__ import annotations

import functools

from agentrl_jax.models import tokenizer as tokenizer_lib


def token_id(tokenizer, text: str) -> int | None:
  """The id of a single-token string (a special or added token), or None if it is not one token."""
  ids = tokenizer.encode(text, add_special_tokens=False)
  return ids[0] if len(ids) == 1 else None


def stop_token_ids(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """`(end_token_ids, tool_end_token_ids)`: `<|im_end|>` (+ EOS if distinct), and `</tool_call>`.

  Raises:
    ValueError: the tokenizer has no single `<|im_end|>` or `</tool_call>` token (not a ChatML/hermes model).
  """
  im_end, tool_end = token_id(tokenizer, tokenizer_lib.IM_END), token_id(tokenizer, tokenizer_lib.TOOL_CALL_END)
  if im_end is None or tool_end is None:
    raise ValueError(f"tokenizer: {tokenizer_lib.IM_END} and {tokenizer_lib.TOOL_CALL_END} must be single tokens")
  end = [im_end]
  for t in (tokenizer.eos_token_id, token_id(tokenizer, tokenizer_lib.ENDOFTEXT)):
    if t is not None and t not in end:
      end.append(t)
  return tuple(end), (tool_end,)


class ToolResponseRenderer:
  """Renders tool results into the token chunk that follows a tool call, through the chat template.

  The template is rendered once per number of results with placeholder contents (`tool_response_text`), then
  reused by substitution: rendering jinja per call would cost more host time than the tokens' prefill.
  """

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self.im_end = token_id(tokenizer, tokenizer_lib.IM_END)

  @functools.cache
  def _pieces(self, k: int) -> list[str]:
    marks = [f"\x00AGENTRL_TOOL_{i}\x00" for i in range(k)]
    text = tokenizer_lib.tool_response_text(self.tokenizer, marks)
    pieces = []
    for m in marks:
      head, text = text.split(m, 1)
      pieces.append(head)
    return pieces + [text]

  def text(self, contents: list[str]) -> str:
    """The text after an assistant tool-call turn: `<|im_end|>`, the tool results, the next assistant header."""
    pieces = self._pieces(len(contents))
    out = [pieces[0]]
    for c, p in zip(contents, pieces[1:]):
      out += [c, p]
    return "".join(out)

  def chunk(self, pending_token: int, contents: list[str]) -> list[int]:
    """Tokens to append to the cache: the row's pending token (its last drawn token, `</tool_call>` or
    `<|im_end|>`), then the tool-response tokens (without a second `<|im_end|>`)."""
    text = self.text(contents)
    if pending_token == self.im_end and text.startswith(tokenizer_lib.IM_END):
      text = text[len(tokenizer_lib.IM_END):]
    return [int(pending_token)] + list(self.tokenizer.encode(text, add_special_tokens=False))
