"""Bounded LaTeX answer normalisation and equivalence for math rewards.

`normalize` rewrites an answer into a canonical text: `\\dfrac` -> `\\frac`, `\\le` -> `\\leq`, spacing commands
and `\\left`/`\\right` dropped, `\\text{}` / `\\textnormal{}` / `\\mathrm{}` units and percent words (`28 percent`)
removed, connector words kept as separators (`6 \\text{ and } 8` -> `6 and 8`, never `68`), `^\\circ`, `\\%`, `\\$`,
thin-space and `{,}` thousands separators, `\\\\` row separators kept for matrices. `equivalent` compares two
answers: canonical text first, then their trees (`latex_expr.parse`) structurally (`latex_compare.equal`).

Commas between digits (no space after them) are list separators, except:
  * a ground truth that is exactly a thousands-separated number ("7,425,000") is that number;
  * when the ground truth holds no list at all, the prediction's thousands separators ("32,349": exactly three
    digits after every comma) and decimal commas ("3,14") are read as numbers. `32, 349` (with a space) stays a
    list, and so does everything when the ground truth is a list ("100,200" = "100, 200").
So `equivalent(pred, truth)` is symmetric except for these comma readings, like Math-Verify's `verify`.

Everything is bounded by construction, not by timers (a reward may run in any thread): the text passes are
linear-time regular expressions; answers over `latex_expr.MAX_CHARS`, with too many tokens or digits, too deep
or with exact powers too large are not evaluated (such answers compare as canonical text), so
`10^{10^{10^{10}}}` or a 10 KB number returns at once. sympy is not used: its simplifier has no time bound.
"""

from __future__ import annotations

import re
from fractions import Fraction

from agentrl_jax.rewards import latex_compare, latex_eval
from agentrl_jax.rewards.latex_expr import Fail, Node, parse, symbols

_UNICODE = {"\u2212": "-", "\u00d7": r" \times ", "\u00b7": r" \cdot ", "\u03c0": r" \pi ", "\u221a": r"\sqrt",
            "\u221e": r" \infty ", "\u00b0": "", "\u2013": "-", "\u00f7": r" \div ", "\u2264": r" \leq ",
            "\u2265": r" \geq ", "\u2260": r" \ne ", "\u00b1": r" \pm ", "\u2213": r" \mp ", "\u222a": r" \cup ",
            "\u2208": r" \in ", "\u2248": r" \approx "}
_ALIASES = {"dfrac": r"\frac", "tfrac": r"\frac", "cfrac": r"\frac", "le": r"\leq ", "leq": r"\leq ",
            "leqslant": r"\leq ", "ge": r"\geq ", "geq": r"\geq ", "geqslant": r"\geq ", "ne": r"\ne ",
            "neq": r"\ne ", "lt": " < ", "gt": " > ", "vert": "|", "lvert": "|", "rvert": "|", "mid": "|",
            "lbrace": r"\{", "rbrace": r"\}", "land": " and ", "wedge": " and ", "lor": " or ", "vee": " or ",
            "degree": "", "hline": " ", "colon": ":"}
_ALIAS_RE = re.compile(r"\\(" + "|".join(sorted(_ALIASES, key=len, reverse=True)) + r")(?![a-zA-Z])")
_TEXT_CMDS = ("text|textnormal|textrm|textbf|textit|textsf|texttt|textup|mbox|hbox|mathrm|mathbf|mathit|mathsf|"
              "mathtt|mathnormal|boldsymbol|bm|operatorname")
_NESTED_TEXT = re.compile(r"\\(?:" + _TEXT_CMDS + r")\s*\{\s*\\(?:" + _TEXT_CMDS + r")\s*\{([^{}]*)\}\s*\}")
_TEXT = re.compile(r"\\(" + _TEXT_CMDS + r")\s*\{([^{}]*)\}((?:\s*\^\s*\{?\s*\d\s*\}?)?)")
_CONNECTORS = {"and": " and ", "or": " or ", ",": ", ", ";": "; ", "and,": ", and "}
_MATH_FONTS = {"mathrm", "mathbf", "mathit", "mathsf", "mathtt", "mathnormal", "boldsymbol", "bm", "operatorname"}
_SPACING = re.compile(r"\\\\|\\[,;:! ]|\\q?quad|\\enspace|\\thinspace|~")
_DROP = re.compile(r"\\(?:left|right)\s*\.|\\(?:displaystyle|textstyle|left|right|bigl|bigr|Bigl|Bigr|big|Big"
                   r"|biggl|biggr|bigg|Bigg|limits|nolimits)(?![a-zA-Z])|\\\$|\$|\\%|%"
                   r"|\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])")
_PERCENT = re.compile(r"(?<![A-Za-z])(?:percentage|percent|pct)(?![A-Za-z])")
# A unit needs a space after its number ("5m" may be the product 5m) or follows a closing brace.
_UNITS = re.compile(
    r"(?:(?<=\d)\s+|(?<=\})\s*)(?:(?:square|sq|cubic)\s+)?(?:units?|degrees?|cm|m|km|mm|meters?|metres?|inches|inch|feet|"
    r"foot|ft|miles?|mph|hours?|hrs?|minutes?|mins?|seconds?|secs?|dollars?|cents?|points?|students?|people|"
    r"ways?|days?|weeks?|months?|years?|kg|g|grams?|pounds?|lbs?|liters?|litres?|ml|L)(?![A-Za-z])\.?"
    r"(?:\s*\^\s*\{?\d\}?)?")
_THOUSANDS = re.compile(r"[-+]?[1-9]\d{0,2}(?:[, ]\d{3})+(?:\.\d+)?")
_DECIMAL_COMMA = re.compile(r"[-+]?\d+,\d+")
_THOUSANDS_IN = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?![\d,])")
_SPACED_THOUSANDS_IN = re.compile(r"(?<![\d.,] )(?<![\d.,])[1-9]\d{0,2}(?: \d{3})+(?![\d,]| \d)(?!\.\d)")
# LaTeX written with doubled backslashes (JSON-escaped twice): `\\\\le` for `\\le`. A row break `\\\\` is followed by
# a space, a digit or `&`, never directly by one of these command names.
_DOUBLED = re.compile(r"\\\\(?=(?:frac|dfrac|tfrac|sqrt|le|leq|ge|geq|lt|gt|ne|neq|pi|cdot|times|div|pm|infty|in|cup|"
                      r"left|right|text|mathrm|boxed)(?![a-zA-Z]))")
_DECIMAL_COMMA_IN = re.compile(r"(?<![\d.,])\d+,\d+(?![\d,])")
_LIST_SEP = re.compile(r"[,;]|(?<![A-Za-z])(?:and|or)(?![A-Za-z])")
# Longer answers are compared as exact text, unnormalised: no ground truth is that long, and normalising hundreds of
# kilobytes would break the time bound (the parser stops at latex_expr.MAX_CHARS anyway).
MAX_ANSWER_CHARS = 5000
_INTEGER = re.compile(r"\s*[-+]?\d{1,400}\s*")
_SPACE_NOT_BETWEEN_WORDS = re.compile(r"(?<![A-Za-z0-9]) | (?![A-Za-z0-9])")


def normalize(answer: str) -> str:
  """Canonical text of an answer, single spaces kept between tokens (so `12 13` never becomes `1213`); linear."""
  s = _DOUBLED.sub(lambda m: "\\", str(answer).strip())
  for k, v in _UNICODE.items():
    s = s.replace(k, v)
  s = _ALIAS_RE.sub(lambda m: _ALIASES[m.group(1)], s)
  s = re.sub(r"(?<=\d)\\[,!]\s*(?=\d{3}(?!\d))", "", s)  # 1\,000
  s = re.sub(r"(?<=\d),\s*\\!\s*(?=\d{3}(?!\d))", ",", s)  # 10,\!000: LaTeX's thousands comma
  s = re.sub(r"(?<=\d)\{,\}(?=\d{3}(?!\d))", "", s)  # 1{,}000
  s = re.sub(r"(?<=\d)\{,\}(?=\d)", ".", s).replace("{,}", ",")  # 3{,}14
  s = _SPACING.sub(lambda m: " \\\\ " if m.group(0) == "\\\\" else " ", s)
  for _ in range(3):  # \text{\textbf{..}} -> \text{..}
    s = _NESTED_TEXT.sub(lambda m: "\\text{" + m.group(1) + "}", s)
  s = _TEXT.sub(_connector_or_math, s)
  if _TEXT.search(s):
    without = _TEXT.sub(" ", s)
    # Units and remarks after a value are dropped; a lone \text{answer} is the answer.
    s = without if re.search(r"[\w\\]", without) else _TEXT.sub(lambda m: f" {m.group(2)} ", s)
  s = _DROP.sub("", s)
  s = _PERCENT.sub(" ", s)
  s = _UNITS.sub(" ", s)
  s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
  s = _plain_number(s)
  return _strip_outer_braces(s).strip()


def _connector_or_math(m: re.Match) -> str:
  cmd, content, power = m.group(1), m.group(2), m.group(3)
  word = content.strip().lower()
  if word in _CONNECTORS:
    return _CONNECTORS[word]
  if word in ("percent", "percentage", "pct"):
    return " "
  if cmd in _MATH_FONTS and not re.fullmatch(r"\s*[A-Za-z]{2,}(?:\s+[A-Za-z]+)*\s*", content):
    return f" {{{content}}}{power}"  # \mathbf{7}, \mathrm{e}: math in another font
  return m.group(0)


def _plain_number(s: str) -> str:
  """'007' -> '7', '3.0' -> '3', '-0' -> '0'; anything else unchanged (no regex: linear). '2.50' keeps its zero:
  the places a decimal is written to say which values it is a rounding of (`latex_compare._rounding_of`)."""
  sign, body = ("-", s[1:]) if s[:1] == "-" else ("", s[1:]) if s[:1] == "+" else ("", s)
  whole, dot, frac = body.partition(".")
  if not (whole or frac) or (whole and not whole.isdigit()) or (frac and not frac.isdigit()) or (dot and not frac
                                                                                              and not whole):
    return s
  if not whole.isascii() or not frac.isascii():
    return s
  whole, frac = whole.lstrip("0") or "0", frac if frac.strip("0") else ""
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


def _compact(s: str) -> str:
  return _SPACE_NOT_BETWEEN_WORDS.sub("", s)


def _merge_number_commas(s: str) -> str:
  """Thousands separators and decimal commas outside brackets read as numbers ('32,349' -> '32349', '3,14' ->
  '3.14'), and so are space-separated thousands ('1 000'); '32, 349' and '12 13' are untouched."""
  if "," not in s and " " not in s:
    return s
  depth, depths = 0, []
  for c in s:
    depths.append(depth)
    depth += (c in "([{") - (c in ")]}")
  keep = lambda m, new: new if depths[m.start()] == 0 else m.group(0)  # noqa: E731
  s2 = _THOUSANDS_IN.sub(lambda m: keep(m, m.group(0).replace(",", "")), s)
  if s2 != s:
    return s2
  s2 = _SPACED_THOUSANDS_IN.sub(lambda m: keep(m, m.group(0).replace(" ", "")), s)
  if s2 != s:
    return s2
  return _DECIMAL_COMMA_IN.sub(lambda m: keep(m, m.group(0).replace(",", ".")), s)


def _truth_text(truth: str) -> str:
  """A ground truth that is one number with thousands separators ('7,425,000', '1 000') or a decimal comma
  ('1,22', '0,111') as that number."""
  if _THOUSANDS.fullmatch(truth):
    return truth.replace(",", "").replace(" ", "")
  if _DECIMAL_COMMA.fullmatch(truth):
    return truth.replace(",", ".")
  return truth


def equivalent(pred: str, truth: str) -> bool:
  """Whether `pred` states the same mathematical object as `truth` (see the module docstring)."""
  pred, truth = str(pred), str(truth)
  if len(pred) > MAX_ANSWER_CHARS or len(truth) > MAX_ANSWER_CHARS:
    return bool(pred.strip()) and pred.strip() == truth.strip()
  if _INTEGER.fullmatch(pred) and _INTEGER.fullmatch(truth):  # the common case (AIME), ~10x faster
    return int(pred) == int(truth)
  a, b = normalize(pred), normalize(truth)
  if not a or not b:
    return False
  if _compact(a) == _compact(b):
    return True
  b = _truth_text(b)
  if not _LIST_SEP.search(b):
    a = _merge_number_commas(a)
  if _compact(a) == _compact(b):
    return True
  ta, tb = parse(a), parse(b)
  if ta is None or tb is None:
    return False
  try:
    return latex_compare.equal(ta, tb)
  except (ArithmeticError, ValueError, TypeError, IndexError, KeyError, RecursionError):
    return False  # a tree the comparison cannot handle is not equal (a reward never raises on its input)


def canonical(answer: str) -> str:
  """A key under which equivalent answers usually coincide (for majority voting): exact rationals as 'p/q',
  other constants as 12 significant digits, lists of answers and sets sorted, tuples in order; otherwise the
  compact text."""
  answer = str(answer)
  if len(answer) > MAX_ANSWER_CHARS:
    return answer.strip()
  text = _truth_text(normalize(answer))
  tree = parse(text)
  if tree is None:
    return _compact(text)
  try:
    return _key(tree) or _compact(text)
  except Fail:
    return _compact(text)


def _key(node: Node) -> str | None:
  kind = node[0]
  if kind == "rel":
    inner = latex_compare.value(node)
    return _key(inner) if inner is not None else None
  if kind == "list":
    members = [m for item in node[3] for m in latex_compare.expand_pm(item)]
    keys = [_key(item) for item in members]
    if any(k is None for k in keys):
      return None
    if node[1] in (r"\{", "{") or (node[1] == "" and node[2] == "or") or len(members) != len(node[3]):
      keys = sorted(set(keys))  # a set: braces, alternatives, \pm answers
      return keys[0] if len(keys) == 1 and node[1] == "" else "{" + ",".join(keys) + "}"
    if node[1] == "":  # a list of answers: in any order, unless its items name what they are (x = 1, y = 2)
      labelled = all(i[0] == "rel" and i[1] == ("=",) and i[2][0][0] == "sym" for i in node[3])
      return ",".join(keys if labelled else sorted(keys))
    return f"{node[1]}{','.join(keys)}{node[2]}"
  if kind == "matrix":
    rows = [[_key(x) for x in row] for row in node[1]]
    if any(k is None for row in rows for k in row):
      return None
    return "M[" + ";".join(",".join(row) for row in rows) + "]"
  if kind == "pm":
    return _key(("list", "", "or", tuple(latex_compare.expand_pm(node))))
  if symbols(node):
    return None
  value = latex_eval.evaluate(node, {})
  if value is None:
    return None
  if isinstance(value, Fraction):
    return str(value)
  if abs(value.imag) <= latex_eval.REL_TOL * max(1.0, abs(value.real)):
    return f"{value.real:.12g}"
  return f"{value.real:.12g}{value.imag:+.12g}i"
