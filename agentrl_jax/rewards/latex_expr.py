"""Bounded parser and evaluator for normalised LaTeX answers (used by `latex`).

`parse` turns a normalised answer into a small expression tree: numbers, symbols, + - * / ^ !, `\\frac`,
`\\sqrt[n]{}`, `\\binom`, functions, constants (pi, e, i, infinity), and bracketed lists (tuples, intervals,
sets). `evaluate` computes its value: an exact `Fraction` while rational arithmetic suffices, else a complex float.
Both are bounded by construction (token, digit, depth and bit limits), never by timers.
"""

from __future__ import annotations

import cmath
import math
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


def as_complex(x: Number) -> complex:
  """A value as a complex float."""
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
    a, b = as_complex(a), as_complex(b)
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
    x = as_complex(_eval(node[2], env))
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
  b, e = as_complex(base), as_complex(exp)
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
