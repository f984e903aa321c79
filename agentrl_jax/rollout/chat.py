"""Chat-format pieces the agent loop needs: stop tokens of a tokenizer and the tool-response token chunk.

Tool output is data, never chat structure: before it enters the context, every control string of the tokenizer
and the template (`<|im_end|>`, `<|im_start|>`, `</tool_response>`, `<tool_call>`, `<think>`, every added token)
is neutralised in it (`neutralise`: its `<` written `&lt;`), so a program printing `</tool_response>` or
`<|im_end|>` cannot close its block or open a turn, in the tokens or in the text; `ToolResponseRenderer.chunk`
checks the resulting ids hold exactly the template's own control tokens.
"""

from __future__ import annotations

import functools
import re

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


def control_strings(tokenizer) -> tuple[str, ...]:
  """The strings a tool's output must not contain verbatim: the chat format's markers and every token the
  tokenizer adds to its vocabulary (special or not), longest first."""
  strings = set(tokenizer_lib.SPECIAL_TOKENS + tokenizer_lib.ADDED_TOKENS)
  strings.update(t for t in getattr(tokenizer, "get_added_vocab", dict)() if isinstance(t, str) and len(t) > 1)
  return tuple(sorted(strings, key=lambda t: (-len(t), t)))


def neutralise(text: str, strings: tuple[str, ...]) -> str:
  """`text` with each of `strings` defused: a leading `<` written `&lt;` (else a zero-width space after the first
  character), so neither the tokenizer nor a reader of the transcript sees the control string."""
  if not text or not strings:
    return text
  pattern = re.compile("|".join(re.escape(t) for t in strings))
  return pattern.sub(lambda m: "&lt;" + m.group(0)[1:] if m.group(0)[0] == "<" else
                     m.group(0)[0] + "\u200b" + m.group(0)[1:], text)


class ToolResponseRenderer:
  """Renders tool results into the token chunk that follows a tool call, through the chat template.

  The template is rendered once per number of results with placeholder contents (`tool_response_text`), then
  reused by substitution: rendering jinja per call would cost more host time than the tokens' prefill.
  """

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self.im_end = token_id(tokenizer, tokenizer_lib.IM_END)
    self.controls = control_strings(tokenizer)
    self.control_ids = frozenset(getattr(tokenizer, "all_special_ids", None) or ()) | frozenset(
        getattr(tokenizer, "get_added_vocab", dict)().values())

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
    """The text after an assistant tool-call turn: `<|im_end|>`, the tool results (neutralised), the next
    assistant header."""
    pieces = self._pieces(len(contents))
    out = [pieces[0]]
    for c, p in zip(contents, pieces[1:]):
      out += [neutralise(c, self.controls), p]
    return "".join(out)

  def _encode(self, pending_token: int, text: str) -> list[int]:
    if pending_token == self.im_end and text.startswith(tokenizer_lib.IM_END):
      text = text[len(tokenizer_lib.IM_END):]
    return list(self.tokenizer.encode(text, add_special_tokens=False))

  @functools.cache
  def _template_controls(self, pending_token: int, k: int) -> tuple[int, ...]:
    ids = self._encode(pending_token, self.text([""] * k))
    return tuple(t for t in ids if t in self.control_ids)

  def chunk(self, pending_token: int, contents: list[str]) -> list[int]:
    """Tokens to append to the cache: the row's pending token (its last drawn token, `</tool_call>` or
    `<|im_end|>`), then the tool-response tokens (without a second `<|im_end|>`).

    Should the neutralised output still produce a control token (a tokenizer whose control strings escaped
    `control_strings`), every `<` and `|` of the output is escaped instead; if even that fails, ValueError.
    """
    want = self._template_controls(int(pending_token), len(contents))
    ids = self._encode(pending_token, self.text(contents))
    if tuple(t for t in ids if t in self.control_ids) != want:
      harsh = [c.replace("<", "&lt;").replace("|", "&#124;") for c in contents]
      ids = self._encode(pending_token, self.text(harsh))
      if tuple(t for t in ids if t in self.control_ids) != want:
        raise ValueError("tool output produces a chat control token even fully escaped; refusing to render it")
    return [int(pending_token)] + ids
