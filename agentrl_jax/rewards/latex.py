"""Bounded LaTeX answer normalisation and equivalence for math rewards.

`normalize` rewrites an answer string into a canonical text (`\\dfrac` -> `\\frac`, units and `\\text{}` removed,
thousands separators, `^\\circ`, `\\%`, `\\$`, `x=5` -> `5`, ...). `equivalent` compares two answers: canonical
text first, then the values of their expression trees (`latex_expr.parse` / `evaluate`): exactly with rationals
where possible, else numerically (complex floats, relative tolerance 1e-9), evaluating free symbols at fixed
pseudo-random points; tuples and intervals element-wise with their brackets, sets in any order.

Everything is bounded by construction, not by timers (a reward may run in any thread): answers over `latex_expr.MAX_CHARS`,
too many tokens or digits, too deep or with exact powers too large are not evaluated (such answers compare as
canonical text), so `10^{10^{10^{10}}}` or a 10 KB number returns at once. sympy is not used on this path: its
simplifier has no time bound.
"""

from __future__ import annotations

import cmath
import random
import re
from fractions import Fraction

from agentrl_jax.rewards.latex_expr import REL_TOL, Node, Number, as_complex, evaluate, parse

_UNICODE = {"\u2212": "-", "\u00d7": r"\times ", "\u00b7": r"\cdot ", "\u03c0": r"\pi ", "\u221a": r"\sqrt",
            "\u221e": r"\infty ", "\u00b0": "", "\u2013": "-", "\u00f7": r"\div "}
_DROP = re.compile(r"\\(?:displaystyle|textstyle|left|right|bigl|bigr|Bigl|Bigr|big|Big|biggl|biggr|bigg|Bigg"
                   r"|limits|nolimits|mathrm|mathbf|mathit|boldsymbol|operatorname)(?![a-zA-Z])"
                   r"|\\[,;:! ]|\\q?quad(?![a-zA-Z])|~|\{,\}|\\\$|\$|\\%|%|\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])")
_TEXT = re.compile(r"\\(?:text|textrm|textbf|textit|mbox|mathrm|mathbf)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_ASSIGN = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?(?:\([A-Za-z]\))?\s*=\s*(?!=)")
_UNIT_WORDS = re.compile(
    r"\b(?:units?|degrees?|cm|m|km|mm|meters?|inches|inch|feet|foot|ft|miles?|mph|hours?|minutes?|seconds?|"
    r"dollars?|cents?|square|sq|cubic|points?|students?|ways?|days?|years?|kg|g|grams?|pounds?|lbs?)\b\.?\^?\d?")


def normalize(answer: str) -> str:
  """Canonical text of an answer (whitespace-free); linear time."""
  s = str(answer).strip()
  for k, v in _UNICODE.items():
    s = s.replace(k, v)
  s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac").replace(r"\cfrac", r"\frac")
  s = s.replace(r"\le ", r"\leq ").replace(r"\ge ", r"\geq ").replace(r"\neq", r"\ne")
  # \text{...}: units after a value are dropped; a lone \text{answer} is unwrapped.
  without = _TEXT.sub("", s).strip()
  s = without if without and re.search(r"[\w\\]", without) else _TEXT.sub(r"\1", s)
  s = _DROP.sub("", s)
  s = _UNIT_WORDS.sub("", s) if re.search(r"\d", _UNIT_WORDS.sub("", s)) else s
  s = re.sub(r"\s+", "", s)
  if "=" in s and s.count("=") == 1 and _ASSIGN.match(s) and "\\" not in s.split("=")[0]:
    s = s.split("=", 1)[1]
  s = s.rstrip(".").strip()
  if _THOUSANDS.fullmatch(s):
    s = s.replace(",", "")
  s = _plain_number(s)
  return _strip_outer_braces(s)


def _plain_number(s: str) -> str:
  """'007' -> '7', '2.50' -> '2.5', '3.0' -> '3', '-0' -> '0'; anything else unchanged (no regex: linear)."""
  sign, body = ("-", s[1:]) if s[:1] == "-" else ("", s[1:]) if s[:1] == "+" else ("", s)
  whole, dot, frac = body.partition(".")
  if not (whole or frac) or (whole and not whole.isdigit()) or (frac and not frac.isdigit()) or (dot and not frac
                                                                                              and not whole):
    return s
  if not whole.isascii() or not frac.isascii():
    return s
  whole, frac = whole.lstrip("0") or "0", frac.rstrip("0")
  if whole == "0" and not frac:
    sign = ""
  return sign + whole + (f".{frac}" if frac else "")


def _strip_outer_braces(s: str) -> str:
  """'{{x}}' -> 'x', '{a}{b}' unchanged; one pass (a loop of balance checks would be quadratic)."""
  k = min(len(s) - len(s.lstrip("{")), len(s) - len(s.rstrip("}")))
  if k == 0:
    return s
  depth, low = 0, k
  for i, c in enumerate(s):
    depth += (c == "{") - (c == "}")
    if depth < 0:
      return s
    if k - 1 <= i <= len(s) - 1 - k:
      low = min(low, depth)
  if depth != 0 or low == 0:
    return s
  return s[low:len(s) - low]


def _symbols(node: Node, out: set[str]) -> set[str]:
  if node[0] == "sym":
    out.add(node[1])
  elif node[0] == "list":
    for item in node[3]:
      _symbols(item, out)
  else:
    for child in node[1:]:
      if isinstance(child, tuple):
        _symbols(child, out)
  return out


def _close(a: Number | None, b: Number | None) -> bool:
  if a is None or b is None:
    return False
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return a == b
  a, b = as_complex(a), as_complex(b)
  if cmath.isinf(a) or cmath.isinf(b):
    return a == b
  return abs(a - b) <= REL_TOL * max(1.0, abs(a), abs(b))


def _points(names: set[str]) -> list[dict[str, complex]]:
  rng = random.Random(12345)
  ordered = sorted(names)
  return [{n: complex(rng.uniform(0.3, 2.7)) for n in ordered} for _ in range(3)]


def _nodes_equal(a: Node, b: Node, points: list[dict[str, complex]]) -> bool:
  if a[0] == "list" or b[0] == "list":
    if a[0] != "list" or b[0] != "list" or len(a[3]) != len(b[3]):
      return False
    brackets_a, brackets_b = a[1:3], b[1:3]
    if brackets_a != brackets_b and {brackets_a, brackets_b} != {("", ""), ("(", ")")}:
      return False
    if a[1] == r"\{":  # sets: order does not matter
      remaining = list(b[3])
      for item in a[3]:
        match = next((j for j, other in enumerate(remaining) if _nodes_equal(item, other, points)), None)
        if match is None:
          return False
        remaining.pop(match)
      return True
    return all(_nodes_equal(x, y, points) for x, y in zip(a[3], b[3]))
  values = [(evaluate(a, env), evaluate(b, env)) for env in points]
  defined = [(x, y) for x, y in values if x is not None or y is not None]
  return bool(defined) and all(_close(x, y) for x, y in defined)


def equivalent(pred: str, truth: str) -> bool:
  """Whether two answers are the same mathematical object (see the module docstring)."""
  a, b = normalize(pred), normalize(truth)
  if not a or not b:
    return False
  if a == b:
    return True
  ta, tb = parse(a), parse(b)
  if ta is None or tb is None:
    return False
  return _nodes_equal(ta, tb, _points(_symbols(ta, set()) | _symbols(tb, set())))


def canonical(answer: str) -> str:
  """A key under which equivalent answers usually coincide (for majority voting): exact rationals as 'p/q',
  other constants as 12 significant digits, tuples element-wise; otherwise the normalised text."""
  text = normalize(answer)
  tree = parse(text)
  if tree is None:
    return text
  return _key(tree) or text


def _key(node: Node) -> str | None:
  if node[0] == "list":
    keys = [_key(item) for item in node[3]]
    if any(k is None for k in keys):
      return None
    if node[1] == r"\{":
      keys.sort()
    return f"{node[1] or '('}{','.join(keys)}{node[2] or ')'}"
  if _symbols(node, set()):
    return None
  value = evaluate(node, {})
  if value is None:
    return None
  if isinstance(value, Fraction):
    return str(value)
  if abs(value.imag) <= REL_TOL * max(1.0, abs(value.real)):
    return f"{value.real:.12g}"
  return f"{value.real:.12g}{value.imag:+.12g}i"


