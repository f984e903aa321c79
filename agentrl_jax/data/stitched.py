"""The `stitched` SFT baseline: a fabricated tool call spliced into an existing plain-text solution.

The paper's ablation compares SFT on real end-to-end trajectories (`data/collect.py`) with this synthetic kind:
take a solution written without tools, find a computation in it, write `code_interpreter` code for it, and
insert an assistant tool-call turn and its tool turn before the part of the solution that states the result.

    python -m agentrl_jax.main --config=configs/stitch_solutions.py --workdir=DIR \
        --config.data.train_path=solutions.parquet --config.data.train_schema=rl

(`config.builder = "stitched"` makes the `collect` job run this builder.) Per row:

  1. the solution: `extra_info[solution_field]` of a prompt row (e.g. the `solution` of the AIME JSONL), or the
     last assistant message of an `sft` row that has no tool calls (the messages before it are the prompt);
  2. the computations: `expression = number` spans whose left side is a closed numeric expression (digits,
     + - * / ^ !, `\\cdot`, `\\times`, `\\div`, `\\frac`, `\\sqrt`, `\\binom`; no unknowns) whose value is the
     stated number (up to its rounding); the one whose value is the final answer is chosen, else the last;
  3. the code: that expression in Python (`print(9 / 3 + 0.4)`), RUN in the sandbox for the tool output
     (`output_mode="run"`, the default), or the number the solution states used as the output ("stated",
     no execution: the fully fabricated variant);
  4. the conversation: prompt, assistant turn (the solution before the computation's sentence, a bridge sentence,
     the tool call), tool turn (the output), assistant turn (the rest of the solution, plus `\\boxed{answer}`
     when the solution has none and the answer is known).

A row with no solution, nothing to compute or a failed run is skipped, counted and reported with the reason
(`stitch_report.jsonl`, `stitch_summary.json`); the kept rows go to `stitched.parquet` in the SFT schema.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import ml_collections

from agentrl_jax.data import records as rec
from agentrl_jax.rewards import latex, latex_expr
from agentrl_jax.tools.code_interpreter import TOOL_NAME, TOOL_SCHEMA, format_result, prepare_code

log = logging.getLogger(__name__)

STITCHED = "stitched"
NO_SOLUTION = "no_solution"
NOTHING_TO_COMPUTE = "nothing_to_compute"
RUN_FAILED = "run_failed"
OUTPUT_MODES = ("run", "stated")

# `expression = number`: the expression is a run of digits, operators, brackets, spaces and a few LaTeX
# commands that does not start inside a word or a command; the number must not continue as a longer token.
_CMD = r"\\(?:cdot|times|div|dfrac|tfrac|frac|binom|sqrt|left|right)(?![A-Za-z])"
_EQUATION = re.compile(r"(?<![\w\\])((?:" + _CMD + r"|[\d.+\-*/^()!{}\[\] ])+?)\s*=\s*"
                       r"(-?\d+(?:\.\d+)?)(?![\d]|\.\d|\s*[*/^])")
_SENTENCE_END = re.compile(r"[.!?:][ \t]+|\n")
_PREC = {"add": 1, "mul": 2, "div": 2, "neg": 3, "pow": 4}
_MATH_FUNCS = {"sin": "math.sin", "cos": "math.cos", "tan": "math.tan", "arcsin": "math.asin",
               "arccos": "math.acos", "arctan": "math.atan", "sinh": "math.sinh", "cosh": "math.cosh",
               "tanh": "math.tanh", "exp": "math.exp", "ln": "math.log", "log": "math.log", "lg": "math.log10",
               "abs": "abs"}


@dataclasses.dataclass(frozen=True)
class StitchConfig:
  """The `stitch` config block.

  Attributes:
    output_mode: 'run' (execute the fabricated code in the sandbox; its real output is the tool turn) or
      'stated' (the number the solution states is the tool turn; nothing runs).
    solution_field: `extra_info` key holding the solution text of prompt rows.
    bridge: sentence ending the first assistant turn, before the call.
    append_answer: end the last turn with `The answer is \\boxed{<ground truth>}.` when the solution has no
      `\\boxed{}` and the row has a ground truth.
    advertise_tools: write the code tool's schema in `tools` (what a policy trained on the rows is shown).
    max_tool_output_chars: the tool output is cut (head and tail kept) to this, as in the rollout.
    limit: the first `limit` rows only (0 = all).
    output: the SFT parquet, relative to the workdir unless absolute.
  """

  output_mode: str = "run"
  solution_field: str = "solution"
  bridge: str = "Let me compute this with code."
  append_answer: bool = True
  advertise_tools: bool = True
  max_tool_output_chars: int = 2048
  limit: int = 0
  output: str = "stitched.parquet"

  def __post_init__(self):
    if self.output_mode not in OUTPUT_MODES:
      raise ValueError(f"StitchConfig.output_mode: must be one of {OUTPUT_MODES}, got {self.output_mode!r}")
    if not self.solution_field:
      raise ValueError("StitchConfig.solution_field: must name an extra_info key")
    if self.max_tool_output_chars < 64:
      raise ValueError(f"StitchConfig.max_tool_output_chars: must be >= 64, got {self.max_tool_output_chars}")
    if self.limit < 0:
      raise ValueError(f"StitchConfig.limit: must be >= 0, got {self.limit}")
    if not self.output:
      raise ValueError("StitchConfig.output: must name a file")


# ------------------------------------------------------------------------------------------------------------
# Computations in a solution
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Computation:
  """One `expression = number` of a solution.

  Attributes:
    expression: the expression as written; stated: the number as written.
    code: the fabricated Python program printing the expression's value.
    value: the expression's exact or float value.
    start, end: the span of `expression = number` in the solution.
  """

  expression: str
  stated: str
  code: str
  value: float
  start: int
  end: int


def _decimal(q: Fraction) -> str:
  """A rational as a Python literal: an integer, an exact decimal, or `(p / q)`."""
  if q.denominator == 1:
    return str(q.numerator)
  d = q.denominator
  while d % 2 == 0:
    d //= 2
  while d % 5 == 0:
    d //= 5
  if d == 1:
    return format(Decimal(q.numerator) / Decimal(q.denominator), "f")
  return f"({q.numerator} / {q.denominator})"


def to_python(node: latex_expr.Node) -> str:
  """Python source of a numeric expression tree (`latex_expr.parse`); ValueError for what has no numeric
  Python form (unknowns, lists, i, infinity)."""
  kind = node[0]
  if kind == "num":
    text = _decimal(node[1])
    return f"({text})" if text.startswith("-") else text
  if kind == "const":
    if node[1] in ("pi", "e"):
      return f"math.{node[1]}"
    raise ValueError(f"no real value: {node[1]}")
  if kind == "neg":
    return "-" + _wrap(node[1], _PREC["neg"], right=False)
  if kind == "add":
    rhs = node[2]
    if rhs[0] == "neg":
      return f"{_wrap(node[1], 1, right=False)} - {_wrap(rhs[1], 1, right=True)}"
    return f"{_wrap(node[1], 1, right=False)} + {_wrap(rhs, 1, right=True)}"
  if kind in ("mul", "div"):
    op = "*" if kind == "mul" else "/"
    return f"{_wrap(node[1], 2, right=False)} {op} {_wrap(node[2], 2, right=True)}"
  if kind == "pow":
    if node[2] == ("div", ("num", Fraction(1)), ("num", Fraction(2))):
      return f"math.sqrt({to_python(node[1])})"
    # ** binds tighter than unary minus on its left and is right-associative.
    return f"{_wrap(node[1], 5, right=False)} ** {_wrap(node[2], 4, right=True)}"
  if kind == "fact":
    return f"math.factorial({to_python(node[1])})"
  if kind == "binom":
    return f"math.comb({to_python(node[1])}, {to_python(node[2])})"
  if kind == "fn" and node[1] in _MATH_FUNCS:
    return f"{_MATH_FUNCS[node[1]]}({to_python(node[2])})"
  raise ValueError(f"no Python form for {kind}")


def _wrap(node: latex_expr.Node, parent: int, *, right: bool) -> str:
  text = to_python(node)
  prec = _PREC.get(node[0], 9)
  if prec < parent or (right and prec == parent and node[0] != "pow") or (right and node[0] == "neg"):
    return f"({text})"
  return text


def _has_operator(node: latex_expr.Node) -> bool:
  return node[0] not in ("num", "neg") or (node[0] == "neg" and _has_operator(node[1]))


def _decimals(number: str) -> int:
  return len(number.split(".")[1]) if "." in number else 0


def find_computations(solution: str) -> list[Computation]:
  """Every `expression = number` of `solution` whose expression is closed and numeric and whose value is the
  stated number (to the stated number's precision), in text order."""
  out = []
  for m in _EQUATION.finditer(solution):
    expression, stated = m.group(1).strip(), m.group(2)
    node = latex_expr.parse(latex.normalize(expression))
    if node is None or not _has_operator(node):
      continue
    value = latex_expr.evaluate(node, {})
    if value is None:
      continue
    value = latex_expr.as_complex(value)
    if abs(value.imag) > 1e-12 or not math.isfinite(value.real):
      continue
    if abs(value.real - float(stated)) > 0.5 * 10 ** -_decimals(stated) + 1e-9 * abs(value.real):
      continue  # not what the text says it is (or a different reading of the symbols)
    try:
      py = to_python(node)
    except ValueError:
      continue
    code = ("import math\n" if "math." in py else "") + f"print({py})"
    start = m.start(1) + (len(m.group(1)) - len(m.group(1).lstrip()))
    out.append(Computation(expression, stated, code, value.real, start, m.end()))
  return out


def sentence_start(text: str, pos: int) -> int:
  """Start of the sentence holding `text[pos]`: after the last newline or `.`/`!`/`?`/`:` + whitespace."""
  starts = [m.end() for m in _SENTENCE_END.finditer(text, 0, pos)]
  return starts[-1] if starts else 0


def choose(computations: Sequence[Computation], answer: str | None) -> Computation | None:
  """The first computation whose value is the final answer, else the last one (the nearest to the answer);
  None if there is none."""
  if not computations:
    return None
  if answer:
    node = latex_expr.parse(latex.normalize(answer))
    target = latex_expr.evaluate(node, {}) if node is not None else None
    if target is not None:
      target = latex_expr.as_complex(target)
      hits = [c for c in computations if abs(c.value - target) <= 1e-9 * max(1.0, abs(target))]
      if hits:
        return hits[0]
  return computations[-1]


# ------------------------------------------------------------------------------------------------------------
# Stitching one solution
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Stitched:
  """The outcome for one row: `messages` when stitched, else the `reason` it was skipped (and a detail)."""

  messages: list[dict[str, Any]] | None
  reason: str
  detail: str = ""
  computation: Computation | None = None
  output: str = ""


def stitch(prompt: Sequence[dict[str, Any]], solution: str, *, answer: str | None, cfg: StitchConfig,
           executor=None, computation: Computation | None = None) -> Stitched:
  """Splices a fabricated tool call and its output into a plain-text solution.

  Args:
    prompt: the messages before the solution (system / user).
    solution: the plain-text assistant solution.
    answer: the final answer if known (chooses the computation; appended as `\\boxed{}` when missing).
    cfg: the stitch settings.
    executor: runs the code (required when `cfg.output_mode == "run"`).
    computation: the computation to splice in (default: `choose(find_computations(solution), answer)`).

  Returns:
    A `Stitched` with the conversation, or the reason (NOTHING_TO_COMPUTE, RUN_FAILED) it was skipped.
  """
  comp = computation or choose(find_computations(solution), answer)
  if comp is None:
    return Stitched(None, NOTHING_TO_COMPUTE, "no `expression = number` with a closed numeric expression")
  if cfg.output_mode == "run":
    if executor is None:
      raise ValueError("stitch: output_mode 'run' needs an executor")
    result = executor.submit(prepare_code(comp.code)).result()
    if result.status != "ok":
      return Stitched(None, RUN_FAILED, f"{result.status}: {format_result(result, 300)}", comp)
    output = format_result(result, cfg.max_tool_output_chars)
  else:
    output = comp.stated
  cut = sentence_start(solution, comp.start)
  before, rest = solution[:cut].rstrip(), solution[cut:].strip()
  if cfg.append_answer and answer and "\\boxed{" not in rest:
    rest = f"{rest}\n\nThe answer is \\boxed{{{answer}}}."
  call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": comp.code}}}
  first = f"{before}\n\n{cfg.bridge}" if before else cfg.bridge
  messages = [dict(m) for m in prompt] + [
      {"role": "assistant", "content": first.strip(), "tool_calls": [call]},
      {"role": "tool", "content": output},
      {"role": "assistant", "content": rest},
  ]
  return Stitched(messages, STITCHED, computation=comp, output=output)


# ------------------------------------------------------------------------------------------------------------
# Sources and the job
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SolutionRow:
  """A row to stitch: its prompt messages, solution text ('' if none), answer, and provenance."""

  prompt: list[dict[str, Any]]
  solution: str
  answer: str | None
  index: int
  data_source: str
  extra_info: dict[str, Any]


def solution_rows(config: ml_collections.ConfigDict, workdir: str, cfg: StitchConfig, *,
                  path: str) -> list[SolutionRow]:
  """The rows of `path` in `config.data.train_schema`: prompt rows with `extra_info[solution_field]` (styled
  as the policy would see them), or `sft` rows whose last assistant message is plain text."""
  from agentrl_jax import data
  from agentrl_jax.rollout import jobs

  if config.data.train_schema == "sft":
    prepared = data.prepare(data.SourceConfig(
        path=path, schema="sft", skip_malformed=config.data.skip_malformed,
        data_dir=config.data.data_dir or os.path.join(workdir, "tfds")))
    out = []
    for conv in prepared.records()[:cfg.limit or None]:
      last = max(i for i, m in enumerate(conv.messages) if m["role"] == "assistant")
      final = conv.messages[last]
      plain = not final.get("tool_calls") and all(m["role"] != "tool" for m in conv.messages)
      out.append(SolutionRow(conv.messages[:last], final.get("content", "") if plain else "", None, conv.index,
                             "sft", {}))
    return out
  prompts = jobs.load_prompts(config, workdir, limit=cfg.limit, path=path)
  out = []
  for raw, styled in zip(prompts.raw, prompts.styled):
    solution = raw.extra_info.get(cfg.solution_field)
    out.append(SolutionRow(styled.prompt, solution if isinstance(solution, str) else "", raw.ground_truth,
                           raw.index, raw.data_source, raw.extra_info))
  return out


def toy_solution_rows(n: int, *, seed: int = 0, levels: Sequence[int] = (0, 1, 2, 3)) -> list[dict[str, Any]]:
  """RL-schema rows of the arithmetic task with plain solutions in `extra_info['solution']` (the `:smoke`
  source); level-0 problems ("Write 7.") have nothing to compute."""
  from agentrl_jax.tasks import arithmetic

  problems = arithmetic.make_problems(n, levels=tuple(levels), seed=seed)
  rows = arithmetic.rl_rows(problems)
  for row, p in zip(rows, problems):
    work = f"The number asked for is {p.answer}." if p.level == 0 else f"We compute {p.expression} = {p.answer}."
    row["extra_info"]["solution"] = f"{work}\nThe answer is \\boxed{{{p.answer}}}."
  return rows


def run(config: ml_collections.ConfigDict, workdir: str):
  """The stitched builder as a job (module docstring); returns a `writers.CollectResult` (no episodes)."""
  from agentrl_jax.data import writers
  from agentrl_jax.rollout import engine as engine_lib
  from agentrl_jax.tools import executors as tool_executors

  # ---------------------------------------------------------------------------------------------- config & rows
  cfg = StitchConfig(**config.stitch)
  path = config.data.train_path
  if not path and config.data.get("toy_problems"):  # the :smoke source: toy problems with plain solutions
    import pandas as pd

    path = os.path.join(workdir, "toy_solutions.parquet")
    pd.DataFrame(toy_solution_rows(config.data.toy_problems, seed=config.seed,
                                   levels=config.data.toy_levels)).to_parquet(path)
  rows_in = solution_rows(config, workdir, cfg, path=path)
  tools = [TOOL_SCHEMA] if cfg.advertise_tools else []

  # ---------------------------------------------------------------------------------------------- stitch
  def one(row: SolutionRow) -> Stitched:
    if not row.solution.strip():
      return Stitched(None, NO_SOLUTION, "the row has no plain-text solution")
    return stitch(row.prompt, row.solution, answer=row.answer, cfg=cfg, executor=executor)

  executor = tool_executors.make_executor(engine_lib.tool_config(config.tools)) if cfg.output_mode == "run" else None
  try:  # rows in parallel: each waits on its sandbox run
    with concurrent.futures.ThreadPoolExecutor(max_workers=executor.max_concurrency if executor else 1) as pool:
      results = list(pool.map(one, rows_in))
  finally:
    if executor is not None:
      executor.close()
  rows, counts, report = [], collections.Counter(), []
  for row, got in zip(rows_in, results):
    counts[got.reason] += 1
    comp = got.computation
    report.append({"index": row.index, "decision": got.reason, "detail": got.detail,
                   "expression": comp.expression if comp else None, "stated": comp.stated if comp else None,
                   "code": comp.code if comp else None, "output": got.output or None})
    if got.messages is None:
      log.info("stitch: skipping row %d: %s (%s)", row.index, got.reason, got.detail)
      continue
    record = rec.PromptRecord(row.prompt, row.data_source, row.answer or "", row.extra_info, row.index)
    rows.append(writers.sft_row(got.messages, tools, record, output_mode=cfg.output_mode))

  # ---------------------------------------------------------------------------------------------- outputs
  out_path = writers.output_path(workdir, cfg.output)
  if rows:
    writers.write_sft_parquet(out_path, rows)
  with open(os.path.join(workdir, "stitch_report.jsonl"), "w") as f:
    for entry in report:
      f.write(json.dumps(entry) + "\n")
  summary = {"rows": len(rows_in), "stitched": len(rows), **{f"decision/{k}": v for k, v in sorted(counts.items())},
             "output": out_path if rows else ""}
  with open(os.path.join(workdir, "stitch_summary.json"), "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  skipped = len(rows_in) - len(rows)
  (log.warning if skipped else log.info)(
      "stitch: stitched %d of %d rows; skipped %d (%s) -> %s", len(rows), len(rows_in), skipped,
      ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if k != STITCHED) or "none",
      out_path if rows else "(nothing written)")
  return writers.CollectResult(summary=summary, rows=rows, episodes=[])
