"""Scalar answers compared (used by `latex_compare`): the prediction against the ground truth, whose form sets the
tolerance.

Rational values compare exactly, and an integer never admits anything else (`33.00001` is not 33, `0.9999999` is
not 1). A bare decimal against a value written without decimals (an exact fraction, an irrational) is that value
rounded to the decimal's own last place (half a unit, either way at a tie) or truncated there, with at least
`MIN_SIGNIFICANT` significant digits: `0.3333` and `0.333` are 1/3, `3.1416` and `3.1415` are pi, `2.6667` is 8/3;
`0.3334`, `0.3330` (a zero that claims a place) and `0.33` (two digits) are not. Two decimals agree within one unit
of the last place and `latex_eval.REL_TOL` (either may be the rounded one: `1000000.4` is not 1000000.5). Other
decimals inside expressions compare within REL_TOL; values computed in floating point without any decimal
(irrationals, expressions at sample points) only within float noise (`NOISE_TOL`: `355/452` is not pi/4). Free
symbols are evaluated at the caller's pseudo-random points.
"""

from __future__ import annotations

from fractions import Fraction

from agentrl_jax.rewards import latex_eval
from agentrl_jax.rewards.latex_expr import Node, decimal_places, has_decimal, symbols

NOISE_TOL = 1e-9  # floating-point noise of values computed without any rounded (decimal) literal
MIN_SIGNIFICANT = 3  # a decimal for an exact value: with fewer digits, a window too wide to state the value


def scalar_equal(x: Node, y: Node, pts) -> bool:
  """Prediction `x` against ground truth `y` (see the module docstring's `scalars`)."""
  decimals = has_decimal(x) or has_decimal(y)
  if not (symbols(x) or symbols(y)):
    return _numbers_equal(x, latex_eval.evaluate(x, {}), y, latex_eval.evaluate(y, {}))
  tol = latex_eval.REL_TOL if decimals else NOISE_TOL
  values = [(latex_eval.evaluate(x, env), latex_eval.evaluate(y, env)) for env in pts]
  defined = [(p, q) for p, q in values if p is not None or q is not None]
  return bool(defined) and all(_within(p, q, tol) for p, q in defined)


def _within(a, b, tol: float) -> bool:
  if a is None or b is None:
    return False
  a, b = latex_eval.as_complex(a), latex_eval.as_complex(b)
  if a == b:
    return True
  if any(v != v or abs(v) == float("inf") for v in (a.real, a.imag, b.real, b.imag)):
    return False
  return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def _rounding_of(dec_node: Node, dec, other_node: Node, other) -> bool:
  """Whether the bare decimal `dec_node` (value `dec`) states the value `other` of `other_node`.

  Against a value written without decimals (an exact or irrational one), the decimal is that value rounded to
  its own last place (half a unit, either way at a tie) or truncated there (toward zero), with at least
  `MIN_SIGNIFICANT` significant digits (`0.3333` and `0.333` for 1/3, `3.1416` for pi; not `0.3334`, not `0.33`).
  Two decimals (`1000000.4`, `1000000.5`) agree within one unit of the last place and REL_TOL: either may be the
  rounded one, and neither is known to be exact."""
  places = decimal_places(dec_node)
  if places is None:
    return False
  unit = Fraction(1, 10 ** places)
  if has_decimal(other_node):
    diff = abs(latex_eval.as_complex(dec) - latex_eval.as_complex(other))
    if isinstance(dec, Fraction) and isinstance(other, Fraction):
      diff = abs(dec - other)
    return diff < unit and _within(dec, other, latex_eval.REL_TOL)
  if not isinstance(dec, Fraction) or _significant_digits(dec, places) < MIN_SIGNIFICANT:
    return False
  if isinstance(other, Fraction):
    diff, slack = other - dec, 0
  else:
    z = latex_eval.as_complex(other)
    if z != z or abs(z.real) == float("inf") or abs(z.imag) > NOISE_TOL * max(1.0, abs(z.real)):
      return False
    diff, slack = Fraction(z.real) - dec, Fraction(NOISE_TOL) * max(1, abs(Fraction(z.real)))  # exact: no overflow
  if abs(diff) <= unit / 2 + slack:  # rounded
    return True
  # truncated: the value lies beyond the decimal, away from zero, by less than one unit
  return (diff > 0) == (dec > 0) and abs(diff) < unit - slack


def _significant_digits(dec: Fraction, places: int) -> int:
  """Significant digits of a decimal literal written to `places` places (`0.0833` -> 3, `2.6667` -> 5)."""
  scaled = abs(dec.numerator * 10 ** places // dec.denominator)
  return len(str(scaled)) if scaled else 0


def _numbers_equal(x: Node, vx, y: Node, vy) -> bool:
  if vx is None or vy is None:
    return False
  if isinstance(vx, Fraction) and isinstance(vy, Fraction) and vx == vy:
    return True
  if isinstance(vy, Fraction) and vy.denominator == 1 and not has_decimal(y):  # an integer answer is exact
    return not isinstance(vx, Fraction) and not has_decimal(x) and _within(vx, vy, NOISE_TOL)
  if isinstance(vx, Fraction) and vx.denominator == 1 and not has_decimal(x) and isinstance(vy, Fraction):
    return False
  if _rounding_of(x, vx, y, vy) or _rounding_of(y, vy, x, vx):
    return True
  if decimal_places(x) is not None or decimal_places(y) is not None:
    return False  # a bare decimal that is no rounding of the other side
  if isinstance(vx, Fraction) and isinstance(vy, Fraction):
    return False
  return _within(vx, vy, latex_eval.REL_TOL if has_decimal(x) or has_decimal(y) else NOISE_TOL)
