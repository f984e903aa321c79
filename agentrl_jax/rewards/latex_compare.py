"""Structural equality of answer trees (`latex_expr.parse`), used by `latex.equivalent`.

  lists       a list of answers ("10, 4, -2", "1, 2 and 4", "(1, 2), (3, 4)", several boxes) is a multiset: any
              order, but every answer exactly as often (a missing, extra or repeated answer is a wrong list);
              sets (\\{..\\} or {..}), alternatives joined by 'or' ("2 or -3") and \\pm answers ignore repeats; a
              tuple, an interval and the parts of one answer (`p=5, q=2` in `p=5, q=2; p=7, q=2`) are ordered
              with their brackets; a plain list equals a tuple of the same length in order ("2, 3" = "(2, 3)"),
              and so does a list whose items are labelled on one side only; labelled on both sides (`a_3 = 2,
              a_{37} = 19`), items match label by label.
  labels      `(p,q)=(3,2)`, `AB=4`, `f(x)=3x-1`, `x \\in [1, 5]`: the value after a label (symbols only) counts;
              two labels must be the same (`F_{n+1} = S` is not `F_n = S`); a chain `x = 3 + 4 = 7` counts by its
              last member when every member after the label is equal to it (`3 = 5 = 7` states nothing),
              `x \\approx 2.5` by its approximation.
  relations   equations are equal when one is a nonzero multiple of the other after moving everything to one
              side (2y = 4x + 6 vs y = 2x + 3), inequalities by a positive multiple (-x > -1 vs x < 1); an
              inequality on one variable (or on |x|) and an interval, a union of intervals or `x \\in` one are the
              same set either way round (`-2 \\le x \\le 7` and `x \\in [-2, 7]`; `1 \\le |z| \\le 2` and [-2, -1]
              \\cup [1, 2]), with the same open and closed ends.
  matrices    same shape, entry by entry; unions of intervals in any order.
  scalars     `latex_numbers`: rationals exactly, an integer never anything else, a decimal as a rounding of the
              other side to its own last place.
  sums        `\\sum` and `\\prod` are unknowns named by their index, bounds and body up to the order of sums and
              products (`latex_expr.big_op`): equal only to themselves written another way round.

Bounded: at most `MAX_ITEMS` members per list and `MAX_EXPANSIONS` \\pm expansions; every step is polynomial in the
(bounded) tree size.
"""

from __future__ import annotations

import random
from fractions import Fraction

from agentrl_jax.rewards import latex_eval, latex_numbers
from agentrl_jax.rewards.latex_expr import Fail, Node, canonical_key, subnodes, symbols

MAX_ITEMS = 64
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
      return _by_label(a, b, pts)
    if _labelled(a) or _labelled(b):  # one side names its items, the other does not: in order
      return all(_item_equal(p, q, pts) for p, q in zip(a[3], b[3]))
    return _multiset_equal(list(a[3]), list(b[3]), pts)  # roots, solutions, pairs: in any order
  return _item_equal(a, b, pts)


def _multiset_equal(xs: list[Node], ys: list[Node], pts) -> bool:
  """Whether the items of `xs` pair off one to one with equal items of `ys` (a perfect matching: equality with a
  tolerance is not transitive, so a greedy pairing could miss one); duplicates count."""
  if len(xs) != len(ys) or len(xs) > MAX_ITEMS:
    return False
  edges = [[j for j, y in enumerate(ys) if _item_equal(x, y, pts)] for x in xs]
  match: dict[int, int] = {}  # item of ys -> item of xs

  def augment(i: int, seen: set[int]) -> bool:
    for j in edges[i]:
      if j not in seen:
        seen.add(j)
        if j not in match or augment(match[j], seen):
          match[j] = i
          return True
    return False

  return all(augment(i, set()) for i in range(len(xs)))


def _by_label(a: Node, b: Node, pts) -> bool:
  truth = {i[2][0]: i[2][1] for i in b[3]}
  return all(i[2][0] in truth and _equal(i[2][1], truth[i[2][0]], pts) for i in a[3])


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
    if len(x[3]) != len(y[3]):
      return False
    if _bare(x) and _bare(y) and _labelled(x) and _labelled(y):  # `p=5, q=2` in `p=5, q=2; p=7, q=2`
      return _by_label(x, y, pts)
    return all(_item_equal(p, q, pts) for p, q in zip(x[3], y[3]))  # the parts of one answer: in order
  if x[0] == "matrix" or y[0] == "matrix":
    if x[0] != y[0] or [len(r) for r in x[1]] != [len(r) for r in y[1]]:
      return False
    return all(_item_equal(p, q, pts) for rx, ry in zip(x[1], y[1]) for p, q in zip(rx, ry))
  if x[0] == "union" or y[0] == "union":
    return x[0] == y[0] and _set_equal(list(x[1]), list(y[1]), pts)
  return latex_numbers.scalar_equal(x, y, pts)


# ---------------------------------------------------------------------------------------------- relations


def _rel_item_equal(x: Node, y: Node, pts) -> bool:
  if x[0] == "rel" and y[0] == "rel" and (_rel_equal(x, y, pts) or _chain_equal(x, y, pts)):
    return True
  # The same set of reals written as an interval or as an inequality, either side (`-2 \\le x \\le 7` for
  # `x \\in [-2, 7]`): Math-Verify's `allow_set_relation_comp=True`.
  ix, iy = _interval_of(x), _interval_of(y)
  if ix is not None and iy is not None and ix[0] in ("list", "union") and iy[0] in ("list", "union"):
    if _item_equal(ix, iy, pts):
      return True
  vx = value(x) if x[0] == "rel" else x
  vy = value(y) if y[0] == "rel" else y
  if vx is None or vy is None or (vx is x and vy is y):
    return False
  lx, ly = _label(x), _label(y)
  if lx is not None and ly is not None and canonical_key(lx) != canonical_key(ly):
    return False  # `F_{n+1} = S` is not `F_n = S`: two labels must name the same thing
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


def _label(node: Node) -> Node | None:
  """The label whose value `value` reads (`AB` of `AB = 4` or `4 = AB`, `x` of `x \\in [1, 5]`), else None."""
  if node[0] != "rel":
    return None
  opnds = node[2]
  if is_label(opnds[0]):
    return opnds[0]
  if len(opnds) == 2 and node[1] == ("=",) and is_label(opnds[1]):
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
  return all(latex_numbers.scalar_equal(p, q, pts) for p, q in zip(cx[1], cy[1]))


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
  if len(ops) == 2 and constant(opnds[0]) and constant(opnds[2]):
    lo, hi = opnds[0], opnds[2]
  elif len(ops) == 1 and constant(opnds[1]):
    lo, hi = None, opnds[1]
  elif len(ops) == 1 and constant(opnds[0]):
    lo, hi = opnds[0], None
  else:
    return None
  var = opnds[1] if len(ops) == 2 else opnds[0] if hi is not None else opnds[1]
  closed_lo, closed_hi = ops[0] == "<=", ops[-1] == "<="
  if var[0] == "sym":
    return ("list", "[" if lo is not None and closed_lo else "(", "]" if hi is not None and closed_hi else ")",
            (lo if lo is not None else _NEG_INF, hi if hi is not None else _INF))
  if var[0] == "fn" and var[1] == "abs" and var[2][0] == "sym":
    return _abs_interval(lo, closed_lo, hi, closed_hi)
  return None


def _abs_interval(lo: Node | None, closed_lo: bool, hi: Node | None, closed_hi: bool) -> Node | None:
  """`a <= |x| <= b` as [-b, -a] \\cup [a, b] (a > 0), `|x| < b` as (-b, b), `|x| >= a` as (-\\infty, -a] \\cup
  [a, \\infty); None where the bound's sign is unknown or the set is not of these forms."""
  lo_value = None if lo is None else latex_eval.evaluate(lo, {})
  if lo is not None and not (isinstance(lo_value, Fraction) and lo_value >= 0):
    return None
  if lo is None or (lo_value == 0 and closed_lo):
    if hi is None:
      return None
    return ("list", "[" if closed_hi else "(", "]" if closed_hi else ")", (("neg", hi), hi))
  if lo_value == 0:
    return None  # 0 < |x|: every real but 0
  left_open, right_open = "[" if closed_hi else "(", "]" if closed_lo else ")"
  neg_hi = ("neg", hi) if hi is not None else _NEG_INF
  return ("union", (("list", left_open if hi is not None else "(", right_open, (neg_hi, ("neg", lo))),
                    ("list", "[" if closed_lo else "(", "]" if hi is not None and closed_hi else ")",
                     (lo, hi if hi is not None else _INF))))
