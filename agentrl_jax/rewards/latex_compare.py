"""Structural equality of answer trees (`latex_expr.parse`), used by `latex.equivalent`.

  lists       a bare list ("1, 2 and 4"), a set (\\{..\\} or {..}) and several \\pm answers are unordered with
              duplicates ignored; tuples and intervals compare element-wise with their brackets; a bare list
              equals a tuple of the same length in order ("2, 3" = "(2, 3)").
  labels      `(p,q)=(3,2)`, `AB=4`, `f(x)=3x-1`, `x \\in [1, 5]`: the value after a label (symbols only) counts;
              a chain `x = 3 + 4 = 7` counts by its last member, `x \\approx 2.5` by its approximation.
  relations   equations are equal when one is a nonzero multiple of the other after moving everything to one
              side (2y = 4x + 6 vs y = 2x + 3), inequalities by a positive multiple (-x > -1 vs x < 1); an
              inequality on one variable equals its interval (-3 < a < 10 vs (-3, 10); x >= 2 vs [2, \\infty)).
  matrices    same shape, entry by entry; unions of intervals in any order.
  scalars     exact rational equality, except that a decimal literal is a rounded value and, like anything
              irrational, compares within `latex_eval.REL_TOL`; free symbols are evaluated at fixed
              pseudo-random points.

Bounded: at most `MAX_ITEMS` members per list and `MAX_EXPANSIONS` \\pm expansions; every step is polynomial in the
(bounded) tree size.
"""

from __future__ import annotations

import random

from agentrl_jax.rewards import latex_eval
from agentrl_jax.rewards.latex_expr import Fail, Node, has_decimal, subnodes, symbols

MAX_ITEMS = 64
MAX_EXPANSIONS = 8
_NEG_INF = ("neg", ("const", "inf"))
_INF = ("const", "inf")
_UNORDERED = ("", r"\{", "{")


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
  ma, mb = _members(a), _members(b)
  if len(ma) == 1 and len(mb) == 1:
    return _item_equal(ma[0], mb[0], pts)
  for x, y in ((a, b), (b, a)):  # "2, 3" = "(2, 3)"
    if _bare(x) and y[0] == "list" and y[1:3] == ("(", ")") and len(y[3]) == len(x[3]):
      return all(_item_equal(p, q, pts) for p, q in zip(x[3], y[3]))
  return _set_equal(ma, mb, pts)


def _bare(node: Node) -> bool:
  return node[0] == "list" and node[1] == ""


def _members(node: Node) -> list[Node]:
  """The members of a whole answer: the items of a bare list or a set, else the answer; \\pm expanded."""
  items = node[3] if node[0] == "list" and node[1] in _UNORDERED else (node,)
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
    if x[1] in _UNORDERED and y[1] in _UNORDERED:
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
  exact = not (has_decimal(x) or has_decimal(y))
  if not (symbols(x) or symbols(y)):
    return latex_eval.close(latex_eval.evaluate(x, {}), latex_eval.evaluate(y, {}), exact)
  values = [(latex_eval.evaluate(x, env), latex_eval.evaluate(y, env)) for env in pts]
  defined = [(p, q) for p, q in values if p is not None or q is not None]
  return bool(defined) and all(latex_eval.close(p, q, exact) for p, q in defined)


# ---------------------------------------------------------------------------------------------- relations


def _rel_item_equal(x: Node, y: Node, pts) -> bool:
  if x[0] == "rel" and y[0] == "rel" and (_rel_equal(x, y, pts) or _chain_equal(x, y, pts)):
    return True
  ix = _as_interval(x) if x[0] == "rel" else x
  iy = _as_interval(y) if y[0] == "rel" else y
  if ix is not None and iy is not None and ix[0] in ("list", "union") and iy[0] in ("list", "union"):
    if _item_equal(ix, iy, pts):
      return True
  vx = value(x) if x[0] == "rel" else x
  vy = value(y) if y[0] == "rel" else y
  if vx is None or vy is None or (vx is x and vy is y):
    return False
  return _equal(vx, vy, pts)


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
