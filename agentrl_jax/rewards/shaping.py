"""Reward shaping on top of the outcome reward: DAPO's overlong penalty and the recipe's tool-call shaping.

    shaped = shaping.shape(result.score, n_tool_calls=3, response_tokens=19000, cfg=ShapingConfig())

Order (the recipe's): tool-call shaping inside the score function, then the overlong penalty added on top.
Pure Python scalars here; `overlong_penalty` also takes numpy / jax arrays for a whole batch.

Tool-call shaping in the reference (Gen-Verse/Open-AgentRL) is in effect a constant: its score function computes
`tool_call_reward = (num_turns - 2) / 2 * 0.1` from `extra_info.get("num_turns", 0)` (recipe/demystify/reward.py,
lines 172-175), but the recipe runs the `dapo` reward manager (recipe/demystify/grpo_tcr_qwen3_4b.sh, lines 43 and
129), which passes the dataset row's `extra_info` unchanged (verl/workers/reward_manager/dapo.py, lines 95-102);
only the `naive` manager adds `num_turns` (verl/workers/reward_manager/naive.py, lines 84-85). So num_turns is 0,
the bonus is -0.1 whatever the calls, and every wrong answer scores min(-0.6, -1 - 0.1) = -1.1. Had num_turns
arrived (user + assistant turns + 1: verl/experimental/agent_loop/tool_agent_loop.py, line 223), k tool calls
would give 2k + 2 turns, i.e. +0.1 per call: what `tool_call_shaping` computes, from the calls the executor
actually ran (`rollout.Episode.counted_calls`), so emitting `<tool_call>` text that never runs earns nothing.
"""

from __future__ import annotations

import dataclasses

# The values of ShapingConfig.tool_call_count (the same names as rollout.episode.CALL_COUNTS; rewards does not
# import rollout).
TOOL_CALL_COUNTS = ("executed", "ok", "answered")


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
  """Shaping settings (defaults: the recipe's GRPO-TCR run).

  Attributes:
    max_response_tokens: the response budget L_max, in tokens, tool-output tokens included (recipe: 20480).
    overlong_buffer_tokens: the soft zone before L_max where the penalty ramps up (recipe: 4096); 0 disables.
    overlong_penalty_factor: penalty at L_max (recipe: 1.0).
    tool_call_bonus: reward per tool call added to a WRONG response's score (recipe: 0.1); 0 disables.
    tool_call_cap: the shaped score of a wrong response never exceeds this (recipe: -0.6).
    tool_call_count: which calls count (`rollout.episode.CALL_COUNTS`): 'executed' (default: programs the executor
      ran, whatever their outcome), 'ok' (ran and exited 0), or 'answered' (every call answered, malformed and
      skipped ones included: gameable, for comparison only).
  """

  max_response_tokens: int = 20480
  overlong_buffer_tokens: int = 4096
  overlong_penalty_factor: float = 1.0
  tool_call_bonus: float = 0.1
  tool_call_cap: float = -0.6
  tool_call_count: str = "executed"

  def __post_init__(self):
    if self.max_response_tokens < 1:
      raise ValueError(f"ShapingConfig.max_response_tokens must be >= 1, got {self.max_response_tokens}")
    if not 0 <= self.overlong_buffer_tokens < self.max_response_tokens:
      raise ValueError("ShapingConfig.overlong_buffer_tokens must be in [0, max_response_tokens), got "
                       f"{self.overlong_buffer_tokens}")
    if self.overlong_penalty_factor < 0:
      raise ValueError(f"ShapingConfig.overlong_penalty_factor must be >= 0, got {self.overlong_penalty_factor}")
    if self.tool_call_bonus < 0:
      raise ValueError(f"ShapingConfig.tool_call_bonus must be >= 0, got {self.tool_call_bonus}")
    if self.tool_call_count not in TOOL_CALL_COUNTS:
      raise ValueError(f"ShapingConfig.tool_call_count must be one of {TOOL_CALL_COUNTS}, got "
                       f"{self.tool_call_count!r}")


def overlong_penalty(response_tokens, max_response_tokens: int = 20480, buffer_tokens: int = 4096,
                     factor: float = 1.0):
  """DAPO soft overlong punishment, in tokens (tool-output tokens count: they fill the same context).

  expected = max_response_tokens - buffer_tokens; penalty = min(-(L - expected) / buffer_tokens * factor, 0).
  So 0 up to `expected`, falling linearly to -factor at `max_response_tokens`.

  Args:
    response_tokens: response length L (an int, or an int array [B]).
    max_response_tokens: L_max.
    buffer_tokens: width of the penalty ramp; 0 = no penalty.
    factor: penalty at L_max.

  Returns:
    The penalty (<= 0), same shape as `response_tokens`.
  """
  if buffer_tokens <= 0:
    return response_tokens * 0.0
  expected = max_response_tokens - buffer_tokens
  exceed = response_tokens - expected
  raw = -exceed / buffer_tokens * factor
  # `raw * (raw < 0)` is min(raw, 0) for numpy and jax arrays alike (traceable under jit).
  return min(raw, 0.0) if isinstance(raw, (int, float)) else raw * (raw < 0)


def tool_call_shaping(score: float, n_tool_calls: int, bonus: float = 0.1, cap: float = -0.6) -> float:
  """The recipe's tool-call reward for WRONG responses: min(cap, score + bonus * n_tool_calls) when score < 0.

  A wrong response that used the tool scores a little higher than one that did not, but never above `cap`, so
  it stays below any correct (or partially correct) response. Correct responses are unchanged. In the reference
  the bonus is a constant -0.1 (its reward manager never passes the turn count; see the module docstring); here
  `n_tool_calls` is the number of calls the executor ran.

  Args:
    score: the outcome score.
    n_tool_calls: counted tool calls of the response (negative values count as 0).
    bonus: reward per call.
    cap: upper bound of a shaped wrong score.
  """
  if score >= 0:
    return float(score)
  return float(min(cap, score + bonus * max(0, int(n_tool_calls))))


def shape(score: float, *, n_tool_calls: int, response_tokens: int, cfg: ShapingConfig = ShapingConfig()) -> float:
  """Outcome score -> training reward: tool-call shaping, then the overlong penalty added."""
  shaped = tool_call_shaping(score, n_tool_calls, cfg.tool_call_bonus, cfg.tool_call_cap) if cfg.tool_call_bonus \
      else float(score)
  return shaped + float(overlong_penalty(response_tokens, cfg.max_response_tokens, cfg.overlong_buffer_tokens,
                                         cfg.overlong_penalty_factor))
