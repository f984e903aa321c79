"""Values of scalar answer trees (`latex_expr`): an exact `Fraction` while rational arithmetic suffices, else a
complex float. Bounded by construction (bit, factorial and magnitude limits), never by timers."""

from __future__ import annotations

import cmath
import math
from fractions import Fraction
from typing import Union

MAX_BITS = 20_000
# One tolerance for every inexact comparison: a decimal against an exact value (0.0833333333 vs 1/12), anything
# against an irrational (1.4142136 vs sqrt 2), and expressions evaluated at sample points.
REL_TOL = 1e-6

Number = Union[Fraction, complex]
Node = tuple  # a `latex_expr` tree (defined here too: latex_expr imports this module, never the reverse)

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
  """Value of a scalar tree; None when undefined (division by zero), out of bounds (huge powers, factorials) or
  not a scalar (a list, relation or matrix)."""
  try:
    return _eval(node, env)
  except (ArithmeticError, ValueError, TypeError, KeyError, RecursionError):
    return None


def _eval(node: Node, env: dict[str, complex]) -> Number:
  kind = node[0]
  if kind == "num":
    return node[1]
  if kind in ("sym", "bigop"):  # a sum or product whose value is not computed is an unknown (latex_expr.big_op)
    return env[node[1]]
  if kind == "const":
    return _CONSTS[node[1]]
  if kind == "neg":
    return -_eval(node[1], env)
  if kind in ("add", "mul", "div", "ratio"):
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
  raise ValueError(f"not a scalar: {kind}")  # list, rel, union, matrix, pm


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


def close(a: Number | None, b: Number | None, exact: bool) -> bool:
  """Whether two values are equal: exactly when both are rational and `exact`, else within `REL_TOL` (relative
  above 1, absolute below: six significant digits, or six decimal places for small values)."""
  if a is None or b is None:
    return False
  if isinstance(a, Fraction) and isinstance(b, Fraction) and (exact or a == b):
    return a == b
  a, b = as_complex(a), as_complex(b)
  if cmath.isinf(a) or cmath.isinf(b):
    return a == b
  return abs(a - b) <= REL_TOL * max(1.0, abs(a), abs(b))
