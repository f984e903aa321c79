"""The embedded procedural task family: arithmetic problems a tiny model can learn on a CPU.

Problems come in difficulty levels, so a model-aware filter and a curriculum have something to choose from:

* level 0, `copy`:   "Write 4821."                   -> 4821    (format only; no tool needed)
* level 1, `add`:    "Compute 372+58."               -> 430     (the tool makes it exact)
* level 2, `mul`:    "Compute 37*413."               -> 15281   (the tool makes it exact)
* level 3, `expr`:   "Compute (12+7)*(30-4)."        -> 494     (several operations)

Every level holds at least 85,000 distinct problems (`LEVEL_SPACE`), counted by canonical form (`canonical`):
operand order of `+` and `*`, redundant parentheses, spacing and the question's wording do not make a new
problem. Splits (`make_splits`) and fresh evaluation sets (`make_fresh`) are disjoint by canonical form, so a
held-out problem is one no earlier stage has seen in any rendering. Beyond level 0 an exact answer takes
multi-digit arithmetic that a model of the CPU demo's size cannot do in its head: it has to call the code tool.

Rows are written in the recipe's RL parquet schema (`prompt`, `data_source`, `reward_model.ground_truth`,
`extra_info`), so the embedded default runs through the same data, reward and rollout code as real data.
The `data_source` is `toy_arith` (the math reward, in its strict or equiv mode).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import random
import re
from collections.abc import Iterable
from agentrl_jax.tools import pyast

DATA_SOURCE = "toy_arith"
LEVELS = (0, 1, 2, 3)
LEVEL_NAMES = {0: "copy", 1: "add", 2: "mul", 3: "expr"}

# Operand ranges per level (inclusive).
COPY_DIGITS = (3, 4, 5)   # level 0: a number of 3, 4 or 5 digits (each length equally likely)
ADD_RANGE = (10, 999)     # level 1: a + b, both in range
MUL_SMALL = (10, 99)      # level 2: a * b, one factor two-digit ...
MUL_LARGE = (10, 999)     # ... the other up to three digits (in either order)
EXPR_RANGE = (2, 40)      # level 3: (a op b) * (c op d), op in + - * then + -

# Distinct problems per level by canonical form; level 3 counted by enumerating all 39**4 * 6 renderings
# (tests/tasks/test_task_space.py recounts each level).
LEVEL_SPACE = {
    0: 10 ** 5 - 10 ** (COPY_DIGITS[0] - 1),
    1: (ADD_RANGE[1] - ADD_RANGE[0] + 1) * (ADD_RANGE[1] - ADD_RANGE[0] + 2) // 2,
    2: 90 * 900 + 90 * 91 // 2,  # {two-digit, three-digit} pairs + unordered {two-digit, two-digit} pairs
    3: 4_443_231,
}


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

  @property
  def key(self) -> str:
    """The canonical form (`canonical(self.expression)`): equal for every rendering of the same problem."""
    return canonical(self.expression)


# ---------------------------------------------------------------------------------------------------- canonical form
def _canon(node: ast.AST) -> str:
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return str(node.value)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return f"-{_canon(node.operand)}"
  if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
    op = type(node.op)
    terms, stack = [], [node]
    while stack:  # flatten a chain of one commutative, associative operator: a+(b+c) == (c+a)+b
      n = stack.pop()
      if isinstance(n, ast.BinOp) and type(n.op) is op:
        stack += [n.left, n.right]
      else:
        terms.append(_canon(n))
    return "(" + ("+" if op is ast.Add else "*").join(sorted(terms)) + ")"
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
    return f"({_canon(node.left)}-{_canon(node.right)})"
  raise ValueError(f"canonical: unsupported syntax {ast.dump(node)}")


def canonical(expression: str) -> str:
  """The canonical form of an arithmetic expression: integers, unary minus, `+ - *` and parentheses.

  Sums and products are flattened and their operands sorted, parentheses are implied by the tree, spacing is
  ignored: `canonical("37*(2+5)") == canonical("( 5+2 ) * 37")`. A bare number is its own canonical form.

  Raises:
    ValueError: the text is not such an expression.
  """
  try:
    tree = pyast.parse(expression.strip(), mode="eval").body
  except SyntaxError as e:
    raise ValueError(f"canonical: not an expression: {expression!r} ({e.msg})") from None
  return _canon(tree)


_WORDING = re.compile(r"^\s*(?:write|compute|calculate|evaluate|what is)\s*:?\s*(.+?)\s*[.?!]?\s*$", re.IGNORECASE)


def canonical_question(question: str) -> str:
  """The canonical form of a question of this family in any wording ("Compute 3+5.", "What is 5 + 3?" ...).

  Raises:
    ValueError: the question is not of this family.
  """
  m = _WORDING.match(question)
  if not m:
    raise ValueError(f"canonical_question: not a question of the arithmetic family: {question!r}")
  return canonical(m.group(1))


# ---------------------------------------------------------------------------------------------------- generation
def _evaluate(expression: str) -> int:
  return eval(expression, {"__builtins__": {}})  # noqa: S307 (text built by make_problem)


def make_problem(rng: random.Random, level: int) -> Problem:
  """Draws one problem of the given level from `rng`."""
  if level == 0:
    digits = rng.choice(COPY_DIGITS)
    n = rng.randint(10 ** (digits - 1), 10 ** digits - 1)
    return Problem(f"Write {n}.", str(n), str(n), 0)
  if level == 1:
    a, b = rng.randint(*ADD_RANGE), rng.randint(*ADD_RANGE)
    expr = f"{a}+{b}"
  elif level == 2:
    a, b = rng.randint(*MUL_SMALL), rng.randint(*MUL_LARGE)
    if rng.random() < 0.5:
      a, b = b, a
    expr = f"{a}*{b}"
  elif level == 3:
    a, b, c, d = (rng.randint(*EXPR_RANGE) for _ in range(4))
    op1, op2 = rng.choice("+-*"), rng.choice("+-")
    expr = f"({a}{op1}{b})*({c}{op2}{d})"
  else:
    raise ValueError(f"make_problem: level must be one of {LEVELS}, got {level}")
  return Problem(f"Compute {expr}.", expr, str(_evaluate(expr)), level)


def make_problems(n: int, *, levels: tuple[int, ...] = LEVELS, seed: int = 0) -> list[Problem]:
  """`n` problems with levels drawn uniformly from `levels` (repeats possible); deterministic in `seed`."""
  for level in levels:
    if level not in LEVELS:
      raise ValueError(f"make_problems: unknown level {level}; levels are {LEVELS}")
  rng = random.Random(seed)
  return [make_problem(rng, rng.choice(levels)) for _ in range(n)]


def make_splits(sizes: dict[str, int], *, level_weights: dict[int, float] | None = None, seed: int = 0,
                exclude: Iterable[str] = ()) -> dict[str, list[Problem]]:
  """Problem sets disjoint by canonical form, one per named split, deterministic in `seed`.

  No problem appears twice in any rendering, neither within a split nor across splits, and none whose
  canonical form is in `exclude`, so a held-out split never overlaps what SFT, the prompt filter or RL see,
  and a fresh evaluation set can leave out every problem of a run. Splits are filled in the order of `sizes`
  from one stream of draws: each draw picks a level by `level_weights` (default uniform over `LEVELS`) among
  the levels not yet exhausted.

  Args:
    sizes: split name -> number of problems, e.g. `{"heldout": 512, "sft": 256, "rl": 768}`.
    level_weights: level -> relative frequency (levels left out are never drawn).
    seed: the stream's seed.
    exclude: canonical forms (`canonical`, `Problem.key`) that must not be drawn.

  Raises:
    ValueError: an unknown level, a negative size, or more problems asked of the levels than they have.
  """
  weights = dict(level_weights or {level: 1.0 for level in LEVELS})
  for level, w in weights.items():
    if level not in LEVELS or not w >= 0:
      raise ValueError(f"make_splits: level_weights needs levels in {LEVELS} with weights >= 0, got {weights}")
  if any(n < 0 for n in sizes.values()):
    raise ValueError(f"make_splits: sizes must be >= 0, got {sizes}")
  seen = set(exclude)
  room = {level: LEVEL_SPACE[level] for level in weights}
  for key in seen:  # excluded problems take room from their level
    level = level_of(key)
    if level in room:
      room[level] -= 1
  total = sum(room[level] for level, w in weights.items() if w > 0)
  if sum(sizes.values()) > total:
    raise ValueError(f"make_splits: {sum(sizes.values())} problems asked but levels {sorted(weights)} hold {total}"
                     " (after exclusions)")
  rng = random.Random(seed)
  out: dict[str, list[Problem]] = {}
  for name, n in sizes.items():
    split: list[Problem] = []
    while len(split) < n:
      open_levels = [lv for lv, w in weights.items() if w > 0 and room[lv] > 0]
      level = rng.choices(open_levels, weights=[weights[lv] for lv in open_levels])[0]
      p = make_problem(rng, level)
      if p.key in seen:
        continue
      seen.add(p.key)
      room[level] -= 1
      split.append(p)
    out[name] = split
  return out


def make_fresh(n: int, *, level_weights: dict[int, float] | None = None, seed: int = 0,
               exclude: Iterable[str] = ()) -> list[Problem]:
  """`n` distinct problems none of whose canonical forms is in `exclude` (`make_splits` with one split)."""
  return make_splits({"fresh": n}, level_weights=level_weights, seed=seed, exclude=exclude)["fresh"]


def level_of(key: str) -> int | None:
  """The level whose problems have the canonical form `key`, or None if none has (by its shape alone)."""
  if re.fullmatch(r"\d+", key):
    return 0
  if re.fullmatch(r"\(\d+\+\d+\)", key):
    return 1
  if re.fullmatch(r"\(\d+\*\d+\)", key):
    return 2
  return 3 if key.startswith("(") else None


def level_counts(problems: Iterable[Problem]) -> dict[int, int]:
  """Problems per level (every level listed)."""
  counts = collections.Counter(p.level for p in problems)
  return {level: counts.get(level, 0) for level in LEVELS}


# ---------------------------------------------------------------------------------------------------- rows
def rl_rows(problems: list[Problem], *, start_index: int = 0) -> list[dict]:
  """Rows in the recipe's RL parquet schema (the canonical form in `extra_info.key`)."""
  return [{
      "prompt": [{"role": "user", "content": p.question}],
      "data_source": DATA_SOURCE,
      "reward_model": {"style": "rule", "ground_truth": p.answer},
      "extra_info": {"index": start_index + i, "level": p.level, "expression": p.expression, "key": p.key},
  } for i, p in enumerate(problems)]


def write_rl_parquet(path: str, problems: list[Problem]) -> str:
  """Writes `rl_rows(problems)` to a parquet file (the format `agentrl_jax.data` builds from)."""
  import pandas as pd

  pd.DataFrame(rl_rows(problems)).to_parquet(path)
  return path


def read_rl_parquet(path: str) -> list[Problem]:
  """The problems of a file `write_rl_parquet` wrote (or any RL-schema file of this family: the expression is
  read from the question when `extra_info` lacks it).

  Raises:
    ValueError: a row that is not a problem of this family (naming the file and row).
  """
  import pandas as pd

  out = []
  for i, row in enumerate(pd.read_parquet(path).to_dict("records")):
    try:
      question = row["prompt"][0]["content"]
      extra = row.get("extra_info") or {}
      expression = extra.get("expression") or _WORDING.match(question).group(1)
      key = canonical(expression)
      level = extra.get("level")
      out.append(Problem(question, expression, str(row["reward_model"]["ground_truth"]),
                         int(level) if level is not None else level_of(key)))
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
      raise ValueError(f"read_rl_parquet: {path} row {i} is not an arithmetic problem ({e})") from None
  return out
