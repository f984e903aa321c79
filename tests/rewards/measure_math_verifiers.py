"""Agreement of math checkers with labelled cases, per class, and their time per call. A script, not a test:

  python -m tests.rewards.measure_math_verifiers                         # our checker on math_cases.py
  python -m tests.rewards.measure_math_verifiers --math-verify           # ... and Math-Verify, where installed
  python -m tests.rewards.measure_math_verifiers --suite DIR             # ... and Math-Verify's own test cases
                                                                         #     (DIR: its checkout's tests/)

Math-Verify's cases are (gold, prediction) strings for free-text extraction; as a boxed-answer reward needs, the
gold loses its math delimiters (several boxes in it are joined) and an unboxed prediction is boxed whole.
"Final-answer" cases are those whose prediction is boxed or one math expression (no prose to extract from).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import pathlib
import re
import statistics
import sys
import time

from agentrl_jax.rewards import math as math_reward
from tests.rewards.math_cases import CLASSES

_DELIMS = [("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")]


def ours(response: str, truth: str) -> bool:
  return math_reward.score(response, truth).acc


def math_verify_checker():
  """Math-Verify as the open-r1 / TRL rewards call it, or None when it is not installed."""
  try:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  gold_cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
  pred_cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
  return lambda response, truth: bool(verify(parse("$" + truth + "$", gold_cfg), parse(response, pred_cfg)))


def _strip_math(s: str) -> str:
  s = s.strip()
  for a, b in _DELIMS:
    if s.startswith(a) and s.endswith(b) and len(s) >= len(a) + len(b) and not (a == "$" and "$" in s[1:-1]):
      return s[len(a):len(s) - len(b)].strip()
  return s


def _as_reward_case(gold: str, pred: str) -> tuple[str, str]:
  """(response, ground truth) of a Math-Verify case."""
  truth = _strip_math(gold)
  if "\\boxed" in truth:
    truth = ", ".join(math_reward.boxed_answers(truth, max_boxes=50)) or truth
  return pred if "\\boxed" in pred else "\\boxed{" + _strip_math(pred) + "}", truth


def _final_answer_case(gold: str, pred: str) -> bool:
  for s in (gold, pred):
    if "\\boxed" in s:
      continue
    inner = _strip_math(s)
    if inner == s.strip() and re.search(r"[A-Za-z]{3,}", re.sub(r"\\[A-Za-z]+(\{[^{}]*\})?", "", s)):
      return False
    if "\n" in inner and not s.strip().startswith(("$$", "\\[")):
      return False
  return True


def suite_cases(tests_dir: str) -> list[tuple[str, str, str, bool]]:
  """(test name, gold, pred, expected) of Math-Verify's parametrized cases, read with `ast` (nothing of it runs;
  the few cases that are not literals are left out)."""
  out = []
  for path in sorted(pathlib.Path(tests_dir).glob("test_*.py")):
    for fn in ast.walk(ast.parse(path.read_text())):
      if not isinstance(fn, ast.FunctionDef):
        continue
      for dec in fn.decorator_list:
        if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize" and len(dec.args) >= 2):
          continue
        try:
          names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
        except ValueError:
          continue
        if "gold" not in names or not isinstance(dec.args[1], ast.List):
          continue
        for elt in dec.args[1].elts:
          try:
            row = dict(zip(names, ast.literal_eval(elt)))
          except ValueError:
            continue
          out.append((fn.name, row["gold"], row["pred"], bool(int(row.get("expected", row.get("result"))))))
  return out


def agreement(check, cases) -> dict[str, str]:
  per = collections.defaultdict(lambda: [0, 0])
  for cls, response, truth, expected in cases:
    per[cls][0] += check(response, truth) == expected
    per[cls][1] += 1
  total = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
  return {**{k: f"{a}/{n}" for k, (a, n) in per.items()}, "total": f"{total[0]}/{total[1]}"}


def time_per_call(check, n: int = 2000) -> dict[str, float]:
  """Median and max microseconds per call on simple integer answers (half right, half wrong)."""
  times = []
  for i in range(n):
    response = f"The computation gives the result.\n\nFinal answer: \\boxed{{{i}}}."
    start = time.perf_counter()
    check(response, str(i + i % 2))
    times.append(time.perf_counter() - start)
  return {"median_us": round(statistics.median(times) * 1e6, 1), "max_us": round(max(times) * 1e6, 1)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--math-verify", action="store_true")
  parser.add_argument("--suite", default="")
  args = parser.parse_args()
  own = [(cls, *case) for cls, cases in CLASSES.items() for case in cases]
  checkers = {"ours": ours}
  if args.math_verify or args.suite:
    mv = math_verify_checker()
    if mv is None:
      print("math-verify is not installed; measuring ours only", file=sys.stderr)
    else:
      checkers["math_verify"] = mv
  out = {}
  for name, check in checkers.items():
    out[name] = {"own_cases": agreement(check, own), "integer_answers": time_per_call(check, 500)}
    if args.suite:
      cases = suite_cases(args.suite)
      rows = [(test, *_as_reward_case(gold, pred), expected) for test, gold, pred, expected in cases]
      final = [r for r, (_, gold, pred, _) in zip(rows, cases) if _final_answer_case(gold, pred)]
      out[name]["suite_all"] = agreement(check, rows)["total"]
      out[name]["suite_final_answer"] = agreement(check, final)["total"]
  print(json.dumps(out))


if __name__ == "__main__":
  main()
