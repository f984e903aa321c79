"""Structural equality of answer trees (`latex_expr.parse`), used by `latex.equivalent`.

  lists       sets only when written as sets: a set (\\{..\\} or {..}), alternatives joined by 'or' ("2 or -3")
              and \\pm answers are unordered with duplicates ignored, on either side; a plain list ("10, 4, -2",
              "1, 2 and 4"), tuples and intervals compare element-wise in order with their brackets, and a plain
              list equals a tuple of the same length ("2, 3" = "(2, 3)"); a plain list of labelled values
              (`a_3 = 2, a_{37} = 19`) matches label by label, in any order.
  labels      `(p,q)=(3,2)`, `AB=4`, `f(x)=3x-1`, `x \\in [1, 5]`: the value after a label (symbols only) counts;
              a chain `x = 3 + 4 = 7` counts by its last member when every member after the label is equal to
              it (`3 = 5 = 7` states nothing), `x \\approx 2.5` by its approximation.
  relations   equations are equal when one is a nonzero multiple of the other after moving everything to one
              side (2y = 4x + 6 vs y = 2x + 3), inequalities by a positive multiple (-x > -1 vs x < 1); an
              inequality on one variable answers a ground truth that is that inequality or its interval
              ((-3, 10) and x \\in (-3, 10) for -3 < a < 10), but a ground truth written as a set wants a set
              (-3 < x < 10 is not the answer (-3, 10) asks for: sets only when written as sets).
  matrices    same shape, entry by entry; unions of intervals in any order.
  scalars     the first answer is the prediction, the second the ground truth, whose form sets the tolerance:
              rational values compare exactly, and an integer ground truth never admits anything else
              (`33.00001` is not 33); a bare decimal is a rounding of an exact or irrational value on the other
              side when within one unit of its last place and `latex_eval.REL_TOL` (`0.6666667` = 2/3,
              `1.4142136` = sqrt 2, not `0.67`, not `1000000.4` for 1000000.5); other decimals in expressions
              compare within REL_TOL; values computed in floating point without any decimal (irrationals,
              expressions at sample points) only within float noise (`NOISE_TOL`: `355/452` is not pi/4). Free
              symbols are evaluated at fixed pseudo-random points.

Bounded: at most `MAX_ITEMS` members per list and `MAX_EXPANSIONS` \\pm expansions; every step is polynomial in the
(bounded) tree size.
"""

from __future__ import annotations

import random

from agentrl_jax.rewards import latex_eval
from fractions import Fraction

from agentrl_jax.rewards.latex_expr import Fail, Node, decimal_places, has_decimal, subnodes, symbols

MAX_ITEMS = 64
NOISE_TOL = 1e-9  # floating-point noise of values computed without any rounded (decimal) literal
MAX_EXPANSIONS = 8
_NEG_INF = ("neg", ("const", "inf"))
_INF = ("const", "inf")
_BRACES = (r"\{", "{")


def equal(a: Node, b: Node) -> bool:
  """Whether two whole answers are the same mathematical object (see the module docstring)."""
  names = symbols(a) | symbols(b)
  try:
    return _equal(a, b, _points(names))
  except Fail:
    return False


def _points(names: set[str]) -> list[dict[str, complex]]:
  rng = random.Random(12345)
  ordered = sorted(names)
  return [{n: complex(rng.uniform(0.3, 2.7)) for n in ordered} for _ in range(3)]


def _equal(a: Node, b: Node, pts) -> bool:
  if _unordered(a) or _unordered(b):
    ma, mb = _members(a), _members(b)
    if len(ma) == 1 and len(mb) == 1:
      return _item_equal(ma[0], mb[0], pts)
    return _set_equal(ma, mb, pts)
  if _bare(a) and _tuple_of(b, len(a[3])):  # "2, 3" = "(2, 3)"
    return all(_item_equal(p, q, pts) for p, q in zip(a[3], b[3]))
  if _bare(b) and _tuple_of(a, len(b[3])):
    return all(_item_equal(p, q, pts) for p, q in zip(a[3], b[3]))
  if _bare(a) or _bare(b):
    if not (_bare(a) and _bare(b) and len(a[3]) == len(b[3])):
      return False
    if _labelled(a) and _labelled(b):  # "a_3 = 2, a_{37} = 19": each value by its label, in any order
      truth = {i[2][0]: i[2][1] for i in b[3]}
      return all(i[2][0] in truth and _equal(i[2][1], truth[i[2][0]], pts) for i in a[3])
    return all(_item_equal(p, q, pts) for p, q in zip(a[3], b[3]))
  return _item_equal(a, b, pts)


def _labelled(node: Node) -> bool:
  """A plain list whose every item names what it is (`x = 1, y = 2`), with distinct labels."""
  items = node[3]
  if not all(i[0] == "rel" and i[1] == ("=",) and i[2][0][0] == "sym" for i in items):
    return False
  return len({i[2][0] for i in items}) == len(items)


def _tuple_of(node: Node, n: int) -> bool:
  return node[0] == "list" and node[1:3] == ("(", ")") and len(node[3]) == n


def _bare(node: Node) -> bool:
  return node[0] == "list" and node[1] == "" and node[2] == ""


def _is_set(node: Node) -> bool:
  """Written as a set: braces, or alternatives joined by 'or'."""
  return node[0] == "list" and (node[1] in _BRACES or (node[1] == "" and node[2] == "or"))


def _unordered(node: Node) -> bool:
  """A whole answer compared as a set of members: a set, alternatives, or \\pm answers."""
  if _is_set(node):
    return True
  items = node[3] if _bare(node) else (node,)
  return any(n[0] == "pm" for item in items for n in subnodes(item))


def _members(node: Node) -> list[Node]:
  """The members of a whole answer: the items of a list or a set, else the answer; \\pm expanded."""
  items = node[3] if node[0] == "list" and (node[1] == "" or node[1] in _BRACES) else (node,)
  out = []
  for item in items:
    out.extend(expand_pm(item))
    if len(out) > MAX_ITEMS:
      raise Fail("too many members")
  return out


def expand_pm(node: Node) -> list[Node]:
  """`1 \\pm \\sqrt{2}` -> [1 + \\sqrt{2}, 1 - \\sqrt{2}] (at most `MAX_EXPANSIONS` results)."""
  if not any(n[0] == "pm" for n in subnodes(node)):
    return [node]
  if node[0] == "pm":
    out = [(op, x, y) for x in expand_pm(node[1]) for y in expand_pm(node[2]) for op in ("add", "sub")]
    out = [("add", x, y) if op == "add" else ("add", x, ("neg", y)) for op, x, y in out]
  else:
    options = [[node[0]]]
    for child in node[1:]:
      if isinstance(child, tuple) and child and isinstance(child[0], str):
        choices = expand_pm(child)
      elif isinstance(child, tuple) and child and isinstance(child[0], tuple) and isinstance(child[0][0], str):
        choices = _expand_seq(child)
      else:
        choices = [child]
      options = [o + [c] for o in options for c in choices]
      if len(options) > MAX_EXPANSIONS:
        raise Fail("too many \\pm")
    out = [tuple(o) for o in options]
  if len(out) > MAX_EXPANSIONS:
    raise Fail("too many \\pm")
  return out


def _expand_seq(items: tuple) -> list[tuple]:
  options = [()]
  for item in items:
    options = [o + (c,) for o in options for c in expand_pm(item)]
    if len(options) > MAX_EXPANSIONS:
      raise Fail("too many \\pm")
  return options


def _set_equal(xs: list[Node], ys: list[Node], pts) -> bool:
  if len(xs) > MAX_ITEMS or len(ys) > MAX_ITEMS:
    return False
  ux, uy = _dedupe(xs, pts), _dedupe(ys, pts)
  if len(ux) != len(uy):
    return False
  free = list(uy)
  for x in ux:
    j = next((j for j, y in enumerate(free) if _item_equal(x, y, pts)), None)
    if j is None:
      return False
    free.pop(j)
  return True


def _dedupe(xs: list[Node], pts) -> list[Node]:
  out: list[Node] = []
  for x in xs:
    if not any(_item_equal(x, y, pts) for y in out):
      out.append(x)
  return out


# ---------------------------------------------------------------------------------------------- items


def _item_equal(x: Node, y: Node, pts) -> bool:
  if x == y:
    return True
  if x[0] == "rel" or y[0] == "rel":
    return _rel_item_equal(x, y, pts)
  if x[0] == "list" or y[0] == "list":
    if x[0] != "list" or y[0] != "list":
      return False
    if _is_set(x) and _is_set(y):
      return _set_equal(list(x[3]), list(y[3]), pts)
    if x[1:3] != y[1:3] and {x[1:3], y[1:3]} != {("", ""), ("(", ")")}:
      return False
    return len(x[3]) == len(y[3]) and all(_item_equal(p, q, pts) for p, q in zip(x[3], y[3]))
  if x[0] == "matrix" or y[0] == "matrix":
    if x[0] != y[0] or [len(r) for r in x[1]] != [len(r) for r in y[1]]:
      return False
    return all(_item_equal(p, q, pts) for rx, ry in zip(x[1], y[1]) for p, q in zip(rx, ry))
  if x[0] == "union" or y[0] == "union":
    return x[0] == y[0] and _set_equal(list(x[1]), list(y[1]), pts)
  return _scalar_equal(x, y, pts)


def _scalar_equal(x: Node, y: Node, pts) -> bool:
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


def _rounding_of(dec_node: Node, dec, other) -> bool:
  """Whether the bare decimal `dec_node` (value `dec`) is a rounding (or truncation) of `other`: within one unit
  of its last place and REL_TOL."""
  places = decimal_places(dec_node)
  if places is None:
    return False
  diff = abs(latex_eval.as_complex(dec) - latex_eval.as_complex(other))
  if isinstance(dec, Fraction) and isinstance(other, Fraction):
    diff = abs(dec - other)
  return diff < Fraction(1, 10 ** places) and _within(dec, other, latex_eval.REL_TOL)


def _numbers_equal(x: Node, vx, y: Node, vy) -> bool:
  if vx is None or vy is None:
    return False
  if isinstance(vx, Fraction) and isinstance(vy, Fraction) and vx == vy:
    return True
  if isinstance(vy, Fraction) and vy.denominator == 1 and not has_decimal(y):  # an integer answer is exact
    return not isinstance(vx, Fraction) and not has_decimal(x) and _within(vx, vy, NOISE_TOL)
  if isinstance(vx, Fraction) and vx.denominator == 1 and not has_decimal(x) and isinstance(vy, Fraction):
    return False
  if _rounding_of(x, vx, vy) or _rounding_of(y, vy, vx):
    return True
  if decimal_places(x) is not None or decimal_places(y) is not None:
    return False  # a bare decimal that is no rounding of the other side
  if isinstance(vx, Fraction) and isinstance(vy, Fraction):
    return False
  return _within(vx, vy, latex_eval.REL_TOL if has_decimal(x) or has_decimal(y) else NOISE_TOL)


# ---------------------------------------------------------------------------------------------- relations


def _rel_item_equal(x: Node, y: Node, pts) -> bool:
  if x[0] == "rel" and y[0] == "rel" and (_rel_equal(x, y, pts) or _chain_equal(x, y, pts)):
    return True
  ix, iy = _interval_of(x), _interval_of(y)
  # A ground truth written as a set (an interval, `x \\in [a, b]`) wants a set; one written as an inequality
  # takes either (Math-Verify's default, `allow_set_relation_comp=False`).
  set_ok = not (_set_form(y) and not _set_form(x))
  if set_ok and ix is not None and iy is not None and ix[0] in ("list", "union") and iy[0] in ("list", "union"):
    if _item_equal(ix, iy, pts):
      return True
  vx = value(x) if x[0] == "rel" else x
  vy = value(y) if y[0] == "rel" else y
  if vx is None or vy is None or (vx is x and vy is y):
    return False
  if not (_chain_consistent(x, pts) and _chain_consistent(y, pts)):
    return False
  return _equal(vx, vy, pts)


def _chain_consistent(node: Node, pts) -> bool:
  """An `=` chain of three or more members states its last member only when every member after a leading label
  equals it (`x = 3 + 4 = 7` yes, `3 = 5 = 7` no); anything else is consistent."""
  if node[0] != "rel" or not all(op == "=" for op in node[1]) or len(node[2]) < 3:
    return True
  members = list(node[2][1:] if is_label(node[2][0]) else node[2])
  last = members[-1]
  return all(_equal(m, last, pts) and _equal(last, m, pts) for m in members[:-1])


def _set_form(node: Node) -> bool:
  return node[0] != "rel" or node[1] == ("in",)


def _interval_of(node: Node) -> Node | None:
  """An answer as a set of reals where it states one: `-2 <= x <= 7` and `x \\in [-2, 7]` both give [-2, 7]."""
  if node[0] != "rel":
    return node
  interval = _as_interval(node)
  if interval is None:
    v = value(node)
    interval = v if v is not None and v[0] in ("list", "union") and node[1] == ("in",) else None
  return interval


def value(rel: Node) -> Node | None:
  """The answer a relation states: after a label (`AB = 4` -> 4, `x \\in [1, 5]` -> [1, 5]), the last member of
  an `=` chain, the approximation of `x \\approx 2.5`; None for a genuine equation or inequality."""
  ops, opnds = rel[1], rel[2]
  if "~" in ops:
    k = ops.index("~")
    if "=" not in ops[:k]:
      return opnds[-1] if all(op == "~" for op in ops[k:]) else None
    ops, opnds = ops[:k], opnds[:k + 1]
  if all(op == "=" for op in ops):
    if len(opnds) >= 3:
      return opnds[-1]
    left, right = opnds
    if is_label(left):
      return right
    if is_label(right):
      return left
    return None
  if ops == ("in",) and is_label(opnds[0]):
    return opnds[1]
  return None


def is_label(node: Node) -> bool:
  """Symbols only, combined by products, quotients, ratios, |..| or a tuple: `AB`, `(p, q)`, `\\frac{AP}{PB}`."""
  kind = node[0]
  if kind == "sym":
    return True
  if kind in ("mul", "div", "ratio"):
    return is_label(node[1]) and is_label(node[2])
  if kind == "fn" and node[1] == "abs":
    return is_label(node[2])
  if kind == "list" and node[1] == "(":
    return all(is_label(item) for item in node[3])
  return False


def _rel_form(rel: Node) -> tuple[str, Node] | None:
  """`L op R` as (op, f) with f op 0 and op in = != < <=."""
  ops, opnds = rel[1], rel[2]
  if len(ops) != 1 or ops[0] not in ("=", "!=", "<", "<=", ">", ">="):
    return None
  left, right = opnds
  if ops[0] in (">", ">="):
    return ops[0].replace(">", "<"), ("add", right, ("neg", left))
  return ops[0], ("add", left, ("neg", right))


def _rel_equal(x: Node, y: Node, pts) -> bool:
  fx, fy = _rel_form(x), _rel_form(y)
  if fx is None or fy is None or fx[0] != fy[0] or not (symbols(fx[1]) or symbols(fy[1])):
    return False
  ratios = []
  for env in pts:
    p, q = latex_eval.evaluate(fx[1], env), latex_eval.evaluate(fy[1], env)
    if p is None or q is None:
      return False
    p, q = latex_eval.as_complex(p), latex_eval.as_complex(q)
    if abs(q) < 1e-12 or abs(p) < 1e-12:
      if abs(q) < 1e-12 and abs(p) < 1e-12:
        continue
      return False
    ratios.append(p / q)
  if len(ratios) < 2 or not all(latex_eval.close(r, ratios[0], False) for r in ratios):
    return False
  r = ratios[0]
  if fx[0] in ("<", "<="):  # an inequality survives only a positive factor
    return abs(r.imag) <= latex_eval.REL_TOL * abs(r) and r.real > 0
  return True


def _chain_equal(x: Node, y: Node, pts) -> bool:
  """`a < v < b` chains: the same relations between equal members (written either way round)."""
  cx, cy = _ascending(x), _ascending(y)
  if cx is None or cy is None or cx[0] != cy[0] or len(cx[0]) < 2:
    return False
  return all(_scalar_equal(p, q, pts) for p, q in zip(cx[1], cy[1]))


def _ascending(rel: Node) -> tuple[tuple, tuple] | None:
  ops, opnds = rel[1], rel[2]
  if all(op in ("<", "<=") for op in ops):
    return ops, opnds
  if all(op in (">", ">=") for op in ops):
    return tuple(op.replace(">", "<") for op in reversed(ops)), tuple(reversed(opnds))
  return None


def _as_interval(rel: Node) -> Node | None:
  """An inequality on one variable as its interval: `-3 < a < 10` -> (-3, 10), `x >= 2` -> [2, \\infty)."""
  asc = _ascending(rel)
  if asc is None:
    return None
  ops, opnds = asc
  constant = lambda n: not symbols(n)  # noqa: E731
  if len(ops) == 2 and opnds[1][0] == "sym" and constant(opnds[0]) and constant(opnds[2]):
    lo, hi = opnds[0], opnds[2]
    return ("list", "(" if ops[0] == "<" else "[", ")" if ops[1] == "<" else "]", (lo, hi))
  if len(ops) == 1:
    left, right = opnds
    if left[0] == "sym" and constant(right):
      return ("list", "(", ")" if ops[0] == "<" else "]", (_NEG_INF, right))
    if right[0] == "sym" and constant(left):
      return ("list", "(" if ops[0] == "<" else "[", ")", (left, _INF))
  return None
