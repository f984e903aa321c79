"""Bounded LaTeX answer normalisation and equivalence for math rewards.

`normalize` rewrites an answer string into a canonical text (`\\dfrac` -> `\\frac`, units and `\\text{}` removed,
thousands separators, `^\\circ`, `\\%`, `\\$`, `x=5` -> `5`, ...). `parse` turns it into a small expression tree
(numbers, symbols, + - * / ^ !, `\\frac`, `\\sqrt[n]{}`, functions, constants) or a bracketed list (tuples,
intervals, sets). `equivalent` compares two answers: canonical text first, then values: exactly with rationals
where possible, else numerically (complex floats, relative tolerance 1e-9), evaluating free symbols at fixed
pseudo-random points.

Everything is bounded by construction, not by timers (a reward may run in any thread): inputs over
`MAX_CHARS`, more than `MAX_TOKENS` tokens, numbers over `MAX_DIGITS` digits, nesting over `MAX_DEPTH` and
exact powers over `MAX_BITS` bits are not evaluated (such answers compare as canonical text), so
`10^{10^{10^{10}}}` or a 10 KB number returns at once. sympy is not used on the hot path: its simplifier has no
time bound.
"""

from __future__ import annotations

import cmath
import math
import random
import re
from fractions import Fraction
from typing import Union

MAX_CHARS = 1000
MAX_TOKENS = 300
MAX_DIGITS = 400
MAX_DEPTH = 60
MAX_BITS = 20_000
REL_TOL = 1e-9

Number = Union[Fraction, complex]
Node = tuple

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


# ---------------------------------------------------------------------------------------------- tokenizer

_FUNCS = {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log",
          "ln", "exp", "lg"}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "theta", "vartheta", "lambda", "mu", "nu",
          "xi", "rho", "sigma", "tau", "phi", "varphi", "chi", "psi", "omega", "eta", "zeta", "kappa", "Omega",
          "Delta", "Gamma", "Theta", "Lambda", "Sigma", "Phi", "Psi"}
# Known commands first, longest first: whitespace is gone after `normalize`, so `\cdotx` must split as `\cdot x`.
_KNOWN = sorted(_FUNCS | _GREEK | {"frac", "sqrt", "pi", "infty", "binom", "cdot", "times", "div"}, key=len,
                reverse=True)
_TOKEN = re.compile(r"\d+\.?\d*|\.\d+|\\(?:" + "|".join(_KNOWN) + r")|\\[a-zA-Z]+|\\[{}|]|[A-Za-z]"
                    r"|[-+*/^!()\[\]{},_|=<>']|\S")


class _Fail(Exception):
  pass


class _Parser:
  """Recursive descent over the tokens of a normalised answer."""

  def __init__(self, text: str):
    self.toks = _TOKEN.findall(text)
    if len(self.toks) > MAX_TOKENS:
      raise _Fail("too long")
    self.i = 0
    self.depth = 0

  def peek(self, k: int = 0) -> str | None:
    j = self.i + k
    return self.toks[j] if j < len(self.toks) else None

  def take(self, expected: str | None = None) -> str:
    tok = self.peek()
    if tok is None or (expected is not None and tok != expected):
      raise _Fail(f"expected {expected!r}, got {tok!r}")
    self.i += 1
    return tok

  def enter(self):
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise _Fail("too deep")

  def top(self) -> Node:
    items = self.sequence(stop=None)
    if self.peek() is not None:
      raise _Fail(f"trailing {self.peek()!r}")
    return items[0] if len(items) == 1 else ("list", "", "", tuple(items))

  def sequence(self, stop: tuple[str, ...] | None) -> list[Node]:
    items = [self.expr()]
    while self.peek() in (",", ";"):
      self.take()
      items.append(self.expr())
    if stop is not None and self.peek() not in stop:
      raise _Fail("unclosed bracket")
    return items

  def expr(self) -> Node:
    self.enter()
    node = self.term()
    while self.peek() in ("+", "-"):
      op = self.take()
      rhs = self.term()
      node = ("add", node, rhs if op == "+" else ("neg", rhs))
    self.depth -= 1
    return node

  def term(self) -> Node:
    node = self.unary()
    while True:
      tok = self.peek()
      if tok in ("*", r"\cdot", r"\times"):
        self.take()
        node = ("mul", node, self.unary())
      elif tok in ("/", r"\div"):
        self.take()
        node = ("div", node, self.unary())
      elif tok is not None and self.starts_atom(tok):
        node = ("mul", node, self.power())  # implicit product: 2\pi, 3x, 2(x+1)
      else:
        return node

  def starts_atom(self, tok: str) -> bool:
    return (tok[0].isdigit() or tok[0] == "." or tok.isalpha() or tok in ("(", "{")
            or (tok.startswith("\\") and tok[1:] in (_FUNCS | _GREEK | {"frac", "sqrt", "pi", "infty", "binom"})))

  def unary(self) -> Node:
    if self.peek() in ("-", "+"):
      op = self.take()
      self.enter()
      node = self.unary()
      self.depth -= 1
      return ("neg", node) if op == "-" else node
    return self.power()

  def power(self) -> Node:
    base = self.postfix()
    if self.peek() == "^":
      self.take()
      self.enter()
      exp = self.unary() if self.peek() in ("-", "+") else self.power()
      self.depth -= 1
      return ("pow", base, exp)
    return base

  def postfix(self) -> Node:
    node = self.atom()
    while self.peek() in ("!", "'"):
      if self.take() == "'":
        raise _Fail("derivative")
      node = ("fact", node)
    return node

  def group(self) -> Node:
    """A `{...}` argument; a single token also counts (`\\frac12`)."""
    if self.peek() == "{":
      self.take()
      node = self.expr()
      self.take("}")
      return node
    tok = self.take()
    if tok[0].isdigit():
      return ("num", Fraction(tok[0])) if len(tok) > 1 and self.split_digit(tok) else ("num", _number(tok))
    if tok.isalpha():
      return ("sym", tok)
    raise _Fail(f"bad argument {tok!r}")

  def split_digit(self, tok: str) -> bool:
    # `\frac12`: the first digit is the numerator, the rest is put back as the next token.
    if "." in tok:
      return False
    self.toks[self.i - 1:self.i] = [tok[0], tok[1:]]
    return True

  def atom(self) -> Node:
    self.enter()
    try:
      tok = self.take()
      if tok[0].isdigit() or tok[0] == ".":
        return ("num", _number(tok))
      if tok in ("(", "[", r"\{", "{"):
        close = {"(": (")", "]"), "[": (")", "]"), r"\{": (r"\}",), "{": ("}",)}[tok]
        items = self.sequence(stop=close)
        end = self.take()
        if tok == "{" and len(items) == 1:
          return items[0]
        if len(items) == 1 and tok == "(" and end == ")":
          return items[0]
        return ("list", tok, end, tuple(items))
      if tok == "|" or tok == r"\|":
        node = self.expr()
        self.take(tok)
        return ("fn", "abs", node)
      if tok.isalpha():
        if self.peek() == "_":
          self.take()
          sub = self.take()
          if sub == "{":
            parts = []
            while self.peek() not in ("}", None):
              parts.append(self.take())
            self.take("}")
            sub = "".join(parts)
          return ("sym", f"{tok}_{sub}")
        return ("const", "e") if tok == "e" else ("const", "i") if tok == "i" else ("sym", tok)
      if tok.startswith("\\"):
        name = tok[1:]
        if name == "frac" or name == "binom":
          a, b = self.group(), self.group()
          return ("div", a, b) if name == "frac" else ("binom", a, b)
        if name == "sqrt":
          index = None
          if self.peek() == "[":
            self.take()
            index = self.expr()
            self.take("]")
          arg = self.group()
          return ("pow", arg, ("div", ("num", Fraction(1)), index if index is not None else ("num", Fraction(2))))
        if name == "pi":
          return ("const", "pi")
        if name == "infty":
          return ("const", "inf")
        if name in _GREEK:
          return ("sym", name)
        if name in _FUNCS:
          if self.peek() == "^":  # \sin^2 x
            self.take()
            exp = self.group()
            return ("pow", ("fn", name, self.power()), exp)
          return ("fn", name, self.power())
      raise _Fail(f"unsupported token {tok!r}")
    finally:
      self.depth -= 1


def _number(tok: str) -> Fraction:
  if len(tok) > MAX_DIGITS:
    raise _Fail("number too long")
  return Fraction(tok)


def parse(answer: str) -> Node | None:
  """Expression tree of a normalised answer, or None when it is outside the supported subset or bounds."""
  if not answer or len(answer) > MAX_CHARS:
    return None
  try:
    return _Parser(answer).top()
  except (_Fail, ValueError, ZeroDivisionError, RecursionError):
    return None


# ---------------------------------------------------------------------------------------------- evaluation

_CONSTS = {"pi": complex(math.pi), "e": complex(math.e), "i": 1j, "inf": complex(math.inf)}
_CFUNCS = {"sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan, "arcsin": cmath.asin, "arccos": cmath.acos,
           "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh, "tanh": cmath.tanh, "exp": cmath.exp,
           "ln": cmath.log, "log": cmath.log, "lg": cmath.log10, "abs": abs,
           "cot": lambda x: 1 / cmath.tan(x), "sec": lambda x: 1 / cmath.cos(x), "csc": lambda x: 1 / cmath.sin(x)}


def _c(x: Number) -> complex:
  return complex(x) if isinstance(x, Fraction) else x


def _bits(q: Fraction) -> int:
  return max(q.numerator.bit_length(), q.denominator.bit_length())


def evaluate(node: Node, env: dict[str, complex]) -> Number | None:
  """Value of an expression tree: an exact `Fraction` when rational arithmetic suffices, else a complex float;
  None when undefined (division by zero) or out of bounds (huge powers, factorials)."""
  try:
    return _eval(node, env)
  except (ArithmeticError, ValueError, TypeError, KeyError, RecursionError):
    return None


def _eval(node: Node, env: dict[str, complex]) -> Number:
  kind = node[0]
  if kind == "num":
    return node[1]
  if kind == "sym":
    return env[node[1]]
  if kind == "const":
    return _CONSTS[node[1]]
  if kind == "neg":
    return -_eval(node[1], env)
  if kind in ("add", "mul", "div"):
    a, b = _eval(node[1], env), _eval(node[2], env)
    if isinstance(a, Fraction) and isinstance(b, Fraction):
      out = a + b if kind == "add" else a * b if kind == "mul" else a / b
      if _bits(out) > MAX_BITS:
        raise OverflowError
      return out
    a, b = _c(a), _c(b)
    out = a + b if kind == "add" else a * b if kind == "mul" else a / b
    return _finite(out)
  if kind == "pow":
    return _pow(_eval(node[1], env), _eval(node[2], env))
  if kind == "fact":
    n = _eval(node[1], env)
    if not isinstance(n, Fraction) or n.denominator != 1 or not 0 <= n <= 1000:
      raise ValueError("factorial")
    return Fraction(math.factorial(int(n)))
  if kind == "binom":
    n, k = _eval(node[1], env), _eval(node[2], env)
    if not all(isinstance(v, Fraction) and v.denominator == 1 and 0 <= v <= 5000 for v in (n, k)):
      raise ValueError("binom")
    return Fraction(math.comb(int(n), int(k)))
  if kind == "fn":
    x = _c(_eval(node[2], env))
    if abs(x) > 1e6 and node[1] in ("sin", "cos", "tan", "cot", "sec", "csc", "exp", "sinh", "cosh", "tanh"):
      raise OverflowError  # no meaningful float value
    return _finite(complex(_CFUNCS[node[1]](x)))
  raise ValueError(f"cannot evaluate {kind}")


def _finite(z: complex) -> complex:
  if cmath.isnan(z):
    raise ValueError("nan")
  return z


def _pow(base: Number, exp: Number) -> Number:
  if isinstance(base, Fraction) and isinstance(exp, Fraction):
    if exp.denominator == 1:
      if base == 0 and exp < 0:
        raise ZeroDivisionError
      if abs(base) in (0, 1) or abs(exp.numerator) * _bits(base) <= MAX_BITS:
        return base ** exp.numerator
    else:
      # Exact roots of perfect powers (\sqrt{16} = 4) stay rational.
      root = _exact_root(base, exp)
      if root is not None:
        return root
  b, e = _c(base), _c(exp)
  if abs(e) > 1e6 and abs(b) not in (0.0, 1.0):
    raise OverflowError
  if b == 0:
    if e.real > 0:
      return complex(0)
    raise ZeroDivisionError
  return _finite(complex(b ** e))


def _exact_root(base: Fraction, exp: Fraction) -> Fraction | None:
  if base < 0 or exp.denominator > 64 or abs(exp.numerator) > 64 or _bits(base) > 2000:
    return None
  k = exp.denominator
  parts = []
  for v in (base.numerator, base.denominator):
    r = round(v ** (1.0 / k)) if v < 2 ** 1000 else None
    if r is None:
      return None
    for cand in (r - 1, r, r + 1):
      if cand >= 0 and cand ** k == v:
        parts.append(cand)
        break
    else:
      return None
  root = Fraction(parts[0], parts[1])
  return root ** exp.numerator


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
  a, b = _c(a), _c(b)
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


