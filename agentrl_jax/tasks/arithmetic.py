"""The embedded procedural task family: arithmetic problems a tiny model can learn on a CPU.

Problems come in difficulty levels, so a model-aware filter and a curriculum have something to choose from:

* level 0, `copy`:   "Write 7."                      -> 7     (format only; no tool needed)
* level 1, `add`:    "Compute 3+5."                  -> 8     (one-digit sums: answerable without the tool)
* level 2, `mul`:    "Compute 37*41."                -> 1517  (the tool makes it exact)
* level 3, `expr`:   "Compute (12+7)*(30-4)."        -> 494   (several operations)

Rows are written in the recipe's RL parquet schema (`prompt`, `data_source`, `reward_model.ground_truth`,
`extra_info`), so the embedded default runs through the same data, reward and rollout code as real data.
The `data_source` is `toy_arith` (the math reward, in its strict or equiv mode).
"""

from __future__ import annotations

import dataclasses
import random

DATA_SOURCE = "toy_arith"
LEVELS = (0, 1, 2, 3)


@dataclasses.dataclass(frozen=True)
class Problem:
  """One arithmetic problem.

  Attributes:
    question: the user message.
    expression: a Python expression whose value is the answer (what a tool call would evaluate).
    answer: the exact answer as text.
    level: difficulty level (see module docstring).
  """

  question: str
  expression: str
  answer: str
  level: int


def make_problem(rng: random.Random, level: int) -> Problem:
  """Draws one problem of the given level from `rng`."""
  if level == 0:
    n = rng.randint(0, 99)
    return Problem(f"Write {n}.", str(n), str(n), 0)
  if level == 1:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    expr = f"{a}+{b}"
  elif level == 2:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    expr = f"{a}*{b}"
  elif level == 3:
    a, b, c, d = (rng.randint(2, 40) for _ in range(4))
    op1, op2 = rng.choice("+-*"), rng.choice("+-")
    expr = f"({a}{op1}{b})*({c}{op2}{d})"
  else:
    raise ValueError(f"make_problem: level must be one of {LEVELS}, got {level}")
  return Problem(f"Compute {expr}.", expr, str(eval(expr, {"__builtins__": {}})), level)  # noqa: S307 (own text)


def make_problems(n: int, *, levels: tuple[int, ...] = LEVELS, seed: int = 0) -> list[Problem]:
  """`n` problems with levels drawn uniformly from `levels`; deterministic in `seed`."""
  for level in levels:
    if level not in LEVELS:
      raise ValueError(f"make_problems: unknown level {level}; levels are {LEVELS}")
  rng = random.Random(seed)
  return [make_problem(rng, rng.choice(levels)) for _ in range(n)]


# How many distinct problems each level has (levels 2 and 3 are effectively unbounded at these sizes).
LEVEL_SPACE = {0: 100, 1: 100, 2: 90 * 90, 3: 39 ** 4 * 3 * 2}


def make_splits(sizes: dict[str, int], *, level_weights: dict[int, float] | None = None,
                seed: int = 0) -> dict[str, list[Problem]]:
  """Disjoint problem sets, one per named split, deterministic in `seed`.

  No question appears twice, neither within a split nor across splits, so a held-out split never overlaps what
  SFT, the prompt filter or RL see. Splits are filled in the order of `sizes` from one stream of draws: each
  draw picks a level by `level_weights` (default uniform over `LEVELS`) among the levels not yet exhausted.

  Args:
    sizes: split name -> number of problems, e.g. `{"heldout": 128, "sft": 256, "rl": 2048}`.
    level_weights: level -> relative frequency (levels left out are never drawn).
    seed: the stream's seed.

  Raises:
    ValueError: an unknown level, a negative size, or more problems asked of the levels than they have.
  """
  weights = dict(level_weights or {level: 1.0 for level in LEVELS})
  for level, w in weights.items():
    if level not in LEVELS or not w >= 0:
      raise ValueError(f"make_splits: level_weights needs levels in {LEVELS} with weights >= 0, got {weights}")
  if any(n < 0 for n in sizes.values()):
    raise ValueError(f"make_splits: sizes must be >= 0, got {sizes}")
  room = sum(LEVEL_SPACE[level] for level, w in weights.items() if w > 0)
  if sum(sizes.values()) > room:
    raise ValueError(f"make_splits: {sum(sizes.values())} problems asked but levels {sorted(weights)} hold {room}")
  rng = random.Random(seed)
  seen: set[str] = set()
  used = {level: 0 for level in weights}
  out: dict[str, list[Problem]] = {}
  for name, n in sizes.items():
    split: list[Problem] = []
    while len(split) < n:
      open_levels = [lv for lv, w in weights.items() if w > 0 and used[lv] < LEVEL_SPACE[lv]]
      level = rng.choices(open_levels, weights=[weights[lv] for lv in open_levels])[0]
      p = make_problem(rng, level)
      if p.question in seen:
        continue
      seen.add(p.question)
      used[level] += 1
      split.append(p)
    out[name] = split
  return out


def rl_rows(problems: list[Problem], *, start_index: int = 0) -> list[dict]:
  """Rows in the recipe's RL parquet schema."""
  return [{
      "prompt": [{"role": "user", "content": p.question}],
      "data_source": DATA_SOURCE,
      "reward_model": {"style": "rule", "ground_truth": p.answer},
      "extra_info": {"index": start_index + i, "level": p.level, "expression": p.expression},
  } for i, p in enumerate(problems)]


def write_rl_parquet(path: str, problems: list[Problem]) -> str:
  """Writes `rl_rows(problems)` to a parquet file (the format `agentrl_jax.data` builds from)."""
  import pandas as pd

  pd.DataFrame(rl_rows(problems)).to_parquet(path)
  return path
