"""Agreement of math checkers with labelled cases, per class, and their time per call. A script, not a test:

  python -m tests.rewards.measure_math_verifiers                         # our checker on math_cases.py
  python -m tests.rewards.measure_math_verifiers --math-verify           # ... and Math-Verify, where installed
  python -m tests.rewards.measure_math_verifiers --suite DIR             # ... and Math-Verify's own test cases
                                                                         #     (DIR: its checkout's tests/)
  python -m tests.rewards.measure_math_verifiers --hendrycks FILE        # ... and hendrycks MATH's is_equiv tests
                                                                         #     (FILE: modeling/math_equivalence_test.py)

Math-Verify's cases are (gold, prediction) strings for free-text extraction; as a boxed-answer reward needs, the
gold loses its math delimiters (several boxes in it are joined) and an unboxed prediction is boxed whole. Rows
that set a Math-Verify option ours does not share (`strict=False`, `allow_set_relation_comp=False`, another
`precision`) label another configuration and are left out; ours compares sets with relations both ways
(`allow_set_relation_comp=True`) and reads a decimal to its own last place whatever the precision.
`OVERRULED` lists the public labels the project's stated rules contradict (a chain whose members differ, a
hedge, a duplicated solution, an intermediate result in the last box, a string checker's order test): each suite
reports how many of its labels were overruled, and its agreement and false accepts against the overruled labels.
"Final-answer" cases are those whose prediction is boxed or one math expression (no prose to extract from).
Qwen2.5-Math's grader ships its hard cases as examples without labels (evaluation/grader.py, `_test_math_equal`);
`QWEN25_MATH_EXAMPLES` holds them with the label of their mathematical truth. Each suite reports its agreement and
its false accepts (cases labelled not equivalent that the checker accepts). Prints one JSON line.
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


# (prediction, ground truth, equivalent): the examples in Qwen2.5-Math's evaluation/grader.py `_test_math_equal`.
QWEN25_MATH_EXAMPLES = [
    ("0.0833333333333333", "\\frac{1}{12}", True), ("(1,4.5)", "(1,\\frac{9}{2})", True),
    ("\\frac{x}{7}+\\frac{2}{7}", "\\frac{x+2}{7}", True), ("\\sec^2(y)", "\\tan^2(y)+1", True),
    ("\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}",
     "(\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\\\\\end{pmatrix})", True),
    ("-34x-45y+20z-100=0", "34x+45y-20z+100=0", True),
    ("\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{2\\sqrt{33}+15}",
     "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{15+2\\sqrt{33}}", True),
    ("(+5)(b+2)", "(a+5)(b+2)", False), ("\\frac{1+\\sqrt{5}}{2}", "2", False),
    ("\\frac{34}{16}+\\frac{\\sqrt{1358}}{16}", "4", False), ("1", "1\\\\sqrt{19}", False), ("x+1", "x+2n+1", False),
]
_NON_DEFAULT = {"strict": False, "allow_set_relation_comp": False}

# (ground truth, a fragment of the prediction, reason): public labels the project's stated rules overrule.
OVERRULED = [
    ("x = 11", "x = 5+5+1 = 7 =11", "a chain states its last member only when all its members are equal"),
    ("1 = \\zzz = x = 0", "0", "a chain states its last member only when all its members are equal"),
    ("z = 1 + 1 = 2", "z = 3+3 = 2", "a chain states its last member only when all its members are equal"),
    ("1 - \\frac{1}{\\mathrm{e}}", "1 + \\frac{1}{\\mathrm{e}}", "1 + 1/e is not 1 - 1/e"),
    ("4", "\\boxed{{35 cm,4}}", "a box with two answers is a hedge"),
    ("10455", "= \\boxed{255}$ So, after six months", "the answer is the last box (here an intermediate 255)"),
    ("(37,3,3,13),(17,3,3,7),(3,37,3,13),(3,17,3,7),(3,3,2,3)", "(3,17,3,7), (17,3,3,7)",
     "a list of solutions is a multiset: a solution listed twice is a wrong list"),
    ("4, 10, -2", "10, 4, -2", "a list of answers is a multiset (hendrycks' string compare tests its order)"),
    ("4, .1, 2", "0.1, 4, 2", "a list of answers is a multiset (hendrycks' string compare tests its order)"),
]


def overruled(truth: str, response: str) -> str:
  """The reason a case's public label is overruled, or ''."""
  return next((why for t, frag, why in OVERRULED if truth == t and frag in response), "")


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
          label = row.get("expected", row.get("result"))
          if not isinstance(label, (bool, int)) or any(row.get(k) == v for k, v in _NON_DEFAULT.items()) \
              or row.get("precision", 6) != 6:
            continue
          out.append((fn.name, row["gold"], row["pred"], bool(int(label))))
  return out


def hendrycks_cases(path: str) -> list[tuple[str, str, str, bool]]:
  """(test name, prediction, ground truth, expected) of hendrycks MATH's `is_equiv` unit tests, read with `ast`."""
  out = []
  for fn in ast.walk(ast.parse(pathlib.Path(path).read_text())):
    if not isinstance(fn, ast.FunctionDef):
      continue
    values, label = {}, None
    for node in ast.walk(fn):
      if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        try:
          values[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
          pass
      if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("assertTrue", "assertFalse"):
        label = node.func.attr == "assertTrue"
    if label is not None and {"test_in", "test_out"} <= set(values):
      out.append((fn.name, values["test_in"], values["test_out"], label))
  return out


def agreement(check, cases, verbose: bool = False) -> dict[str, str]:
  per = collections.defaultdict(lambda: [0, 0])
  false_accepts = n_overruled = 0
  for cls, response, truth, expected in cases:
    got = check(response, truth)
    why = overruled(truth, response)
    if why:
      expected, n_overruled = not expected, n_overruled + 1
    per[cls][0] += got == expected
    per[cls][1] += 1
    false_accepts += got and not expected
    if verbose and got != expected:
      print(f"disagree ({cls}): expected {expected}, truth {truth[:80]!r}, response {response[-120:]!r}",
            file=sys.stderr)
  total = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
  return {**{k: f"{a}/{n}" for k, (a, n) in per.items()}, "total": f"{total[0]}/{total[1]}",
          "false_accepts": false_accepts, "overruled": n_overruled}


def worst_time_per_call(check, cases) -> dict[str, float]:
  """The slowest call over `cases` (the hardest answers, not only integers), microseconds."""
  worst, which = 0.0, ""
  for _, response, truth, _ in cases:
    start = time.perf_counter()
    check(response, truth)
    t = time.perf_counter() - start
    if t > worst:
      worst, which = t, truth
  return {"max_us": round(worst * 1e6, 1), "slowest_truth": which[:60]}


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
  parser.add_argument("--hendrycks", default="")
  parser.add_argument("--verbose", action="store_true", help="print each disagreement (stderr)")
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
  qwen = [("qwen2.5-math", "\\boxed{" + p + "}", t, e) for p, t, e in QWEN25_MATH_EXAMPLES]
  for name, check in checkers.items():
    everything = own + qwen
    out[name] = {"own_cases": agreement(check, own), "qwen25_math_examples": agreement(check, qwen),
                 "integer_answers": time_per_call(check, 500)}
    if args.hendrycks:
      hendrycks = [(test, "\\boxed{" + p + "}", t, e) for test, p, t, e in hendrycks_cases(args.hendrycks)]
      everything += hendrycks
      out[name]["hendrycks_math_tests"] = {k: v for k, v in agreement(check, hendrycks, args.verbose).items() if not
                                           k.startswith("test_")}
    if args.suite:
      cases = suite_cases(args.suite)
      rows = [(test, *_as_reward_case(gold, pred), expected) for test, gold, pred, expected in cases]
      final = [r for r, (_, gold, pred, _) in zip(rows, cases) if _final_answer_case(gold, pred)]
      everything += rows
      for key, part in (("suite_all", rows), ("suite_final_answer", final)):
        out[name][key] = {k: v for k, v in agreement(check, part, args.verbose and key == "suite_final_answer").items()
                          if k in ("total", "false_accepts", "overruled")}
    out[name]["worst_call"] = worst_time_per_call(check, everything)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
