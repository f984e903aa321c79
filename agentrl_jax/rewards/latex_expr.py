"""Bounded parser for normalised LaTeX answers (used by `latex`): text -> a small tree of tuples.

Grammar, loosest first (a whole answer):

    answer    item (SEP item)*                   SEP: ',' ';' 'and' 'or' ('list', '', '', items) when > 1 item,
                                                 ('list', '', 'or', items) when an 'or' joins them
    item      ratio (REL ratio)*                 REL: = < > <= >= \\ne \\approx \\in -> ('rel', ops, operands)
    ratio     union (':' union)?                 -> ('ratio', a, b)
    union     expr (\\cup expr)*                 -> ('union', items)
    expr      + - \\pm \\mp over terms; terms: * / \\cdot \\times \\div and implicit products; ^ ! postfix
    atom      number, symbol (x, x_1, f(x)), constant (\\pi e i \\infty), \\frac \\sqrt[n] \\binom, functions,
              (..) [..] \\{..\\} {..} lists (tuples, intervals, sets), |..|, matrices (\\begin{pmatrix}..)

Numbers separated only by a space ("12 13") do not parse: joining them would turn a list into another number.
Everything is bounded by construction (characters, tokens, digits, nesting depth), never by timers, so a parse
returns at once whatever the input. `latex_eval` computes values (`evaluate`, re-exported here); `latex_compare`
compares trees.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Re-exported: callers that parse an expression evaluate it too (data/stitched.py).
from agentrl_jax.rewards.latex_eval import as_complex, evaluate  # noqa: F401  pylint: disable=unused-import

MAX_CHARS = 1000
MAX_TOKENS = 300
MAX_DIGITS = 400
MAX_DEPTH = 60

Node = tuple

FUNCS = {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log",
         "ln", "exp", "lg"}
GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "theta", "vartheta", "lambda", "mu", "nu",
         "xi", "rho", "sigma", "tau", "phi", "varphi", "chi", "psi", "omega", "eta", "zeta", "kappa", "Omega",
         "Delta", "Gamma", "Theta", "Lambda", "Sigma", "Phi", "Psi"}
RELS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", r"\leq": "<=", r"\geq": ">=", r"\ne": "!=",
        "!=": "!=", r"\approx": "~", r"\in": "in"}
BIG_OPS = {"sum", "prod"}
_ATOM_CMDS = FUNCS | GREEK | BIG_OPS | {"frac", "sqrt", "pi", "infty", "binom", "begin"}
# Known commands first, longest first: `\cdotx` must split as `\cdot x` when a space was lost.
_KNOWN = sorted(FUNCS | GREEK | BIG_OPS | {"frac", "sqrt", "pi", "infty", "binom", "cdot", "times", "div", "pm", "mp", "cup",
                                 "leq", "geq", "ne", "approx", "in"}, key=len, reverse=True)
_TOKEN = re.compile(r"\s+|\d+\.?\d*|\.\d+|\\begin\{[a-zA-Z]+\}(?:\{[a-z|]*\})?|\\end\{[a-zA-Z]+\}|\\\\"
                    r"|\\(?:" + "|".join(_KNOWN) + r")|\\[a-zA-Z]+|\\[{}|]"
                    r"|(?<![A-Za-z])(?:and|or)(?![A-Za-z])|[A-Za-z]|<=|>=|!=|[-+*/^!()\[\]{},;_|=<>':&]|\S")
# Commands that structure an answer: never read as a symbol.
_STRUCTURAL = {"boxed", "fbox", "text", "end", "begin", "cap", "setminus", "to", "rightarrow", "Rightarrow",
               "implies", "iff", "quad", "qquad", "cdots", "ldots", "dots", "vdots", "ddots", "int",
               "lim", "overline", "vec", "hat", "bar", "tilde", "dot", "not", "forall", "exists"}
_MATRIX_ENVS = ("pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix", "array")
_OPEN = {"(": (")", "]"), "[": (")", "]"), r"\{": (r"\}",), "{": ("}",)}


class Fail(Exception):
  """The answer is outside the supported subset or its bounds."""


class _Parser:
  """Recursive descent over the tokens of a normalised answer."""

  def __init__(self, text: str):
    self.toks, self.spaced = [], []
    space = False
    for tok in _TOKEN.findall(text):
      if tok.isspace():
        space = True
        continue
      self.toks.append(tok)
      self.spaced.append(space)
      space = False
      if len(self.toks) > MAX_TOKENS:
        raise Fail("too long")
    self.i = 0
    self.depth = 0

  def peek(self, k: int = 0) -> str | None:
    j = self.i + k
    return self.toks[j] if j < len(self.toks) else None

  def take(self, expected: str | None = None) -> str:
    tok = self.peek()
    if tok is None or (expected is not None and tok != expected):
      raise Fail(f"expected {expected!r}, got {tok!r}")
    self.i += 1
    return tok

  def enter(self):
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise Fail("too deep")

  # ------------------------------------------------------------------------------------------ structure

  def top(self) -> Node:
    items, alternatives, seps = [self.item()], False, []
    while self.peek() in (",", ";", "and", "or"):
      seps.append(self.take())
      alternatives |= seps[-1] == "or"
      if self.peek() in ("and", "or"):  # "1, 2, and 3"
        alternatives |= self.take() == "or"
      items.append(self.item())
    if self.peek() is not None:
      raise Fail(f"trailing {self.peek()!r}")
    if ";" in seps and "," in seps and not alternatives:
      # `p=5, q=2; p=7, q=2`: the semicolon separates answers, the comma the parts of one.
      groups, group = [], [items[0]]
      for sep, item in zip(seps, items[1:]):
        if sep == ";":
          groups.append(group)
          group = []
        group.append(item)
      groups.append(group)
      items = [g[0] if len(g) == 1 else ("list", "", "", tuple(g)) for g in groups]
    # Alternatives ("2 or -3") are a set of answers; a plain list ("10, 4, -2") is a list of answers.
    return items[0] if len(items) == 1 else ("list", "", "or" if alternatives else "", tuple(items))

  def item(self) -> Node:
    operands, ops = [self.ratio()], []
    while self.peek() in RELS:
      ops.append(RELS[self.take()])
      operands.append(self.ratio())
    return operands[0] if not ops else ("rel", tuple(ops), tuple(operands))

  def ratio(self) -> Node:
    node = self.union()
    if self.peek() == ":":
      self.take()
      node = ("ratio", node, self.union())
    return node

  def union(self) -> Node:
    items = [self.expr()]
    while self.peek() == r"\cup":
      self.take()
      items.append(self.expr())
    return items[0] if len(items) == 1 else ("union", tuple(items))

  # ------------------------------------------------------------------------------------------ arithmetic

  def expr(self) -> Node:
    self.enter()
    node = self.term()
    while self.peek() in ("+", "-", r"\pm", r"\mp"):
      op = self.take()
      rhs = self.term()
      node = (("add", node, rhs) if op == "+" else ("add", node, ("neg", rhs)) if op == "-"
              else ("pm", node, rhs) if op == r"\pm" else ("pm", node, ("neg", rhs)))
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
        if self.spaced[self.i] and _is_number(tok) and _ends_in_number(node):
          raise Fail("numbers separated only by a space")
        node = ("mul", node, self.power())  # implicit product: 2\pi, 3x, 2(x+1)
      else:
        return node

  def starts_atom(self, tok: str) -> bool:
    return (_is_number(tok) or (tok.isalpha() and tok not in ("and", "or")) or tok in ("(", "{", r"\{")
            or (tok.startswith("\\") and tok[1:] in _ATOM_CMDS) or tok.startswith(r"\begin{"))

  def unary(self) -> Node:
    if self.peek() in ("-", "+", r"\pm", r"\mp"):
      op = self.take()
      self.enter()
      node = self.unary()
      self.depth -= 1
      return (("neg", node) if op == "-" else node if op == "+" else ("pm", ("num", Fraction(0)), node))
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
        raise Fail("derivative")
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
      if len(tok) > 1 and "." not in tok:  # `\frac12`: the first digit is the argument, the rest comes next
        self.toks[self.i - 1:self.i] = [tok[0], tok[1:]]
        self.spaced[self.i - 1:self.i] = [self.spaced[self.i - 1], False]
        return ("num", Fraction(tok[0]))
      return num_node(tok)
    if tok.isalpha():
      return ("sym", tok)
    raise Fail(f"bad argument {tok!r}")

  def atom(self) -> Node:
    self.enter()
    try:
      tok = self.take()
      if _is_number(tok):
        return num_node(tok)
      if tok in _OPEN:
        return self.bracketed(tok)
      if tok == "|" or tok == r"\|":
        node = self.expr()
        self.take(tok)
        return ("fn", "abs", node)
      if tok.startswith(r"\begin{"):
        return self.matrix(tok)
      if tok.isalpha() and tok not in ("and", "or"):
        return self.symbol(tok)
      if tok.startswith("\\"):
        return self.command(tok[1:])
      raise Fail(f"unsupported token {tok!r}")
    finally:
      self.depth -= 1

  def bracketed(self, tok: str) -> Node:
    close = _OPEN[tok]
    items = [self.ratio()]
    while self.peek() in (",", ";"):
      self.take()
      items.append(self.ratio())
    if self.peek() not in close:
      raise Fail("unclosed bracket")
    end = self.take()
    if len(items) == 1 and (tok == "{" or (tok == "(" and end == ")") or items[0][0] == "matrix"):
      return items[0]
    return ("list", tok, end, tuple(items))

  def symbol(self, tok: str) -> Node:
    if self.peek() == "_":
      self.take()
      sub = self.take()
      if sub == "{":
        parts = []
        while self.peek() not in ("}", None):
          parts.append(self.take())
          if len(parts) > 20:
            raise Fail("subscript too long")
        self.take("}")
        sub = "".join(parts)
      return ("sym", f"{tok}_{sub}")
    if tok in ("e", "i"):
      return ("const", tok)
    # `f(x)`: a function of one variable is one symbol (so f(x) and f(y) differ), not the product f*x.
    if (self.peek() == "(" and not self.spaced[self.i] and (self.peek(1) or "").isalpha() and len(self.peek(1)) == 1
        and self.peek(2) == ")"):
      arg = self.toks[self.i + 1]
      self.i += 3
      return ("sym", f"{tok}({arg})")
    return ("sym", tok)

  def command(self, name: str) -> Node:
    if name in ("frac", "binom"):
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
    if name in BIG_OPS:
      return self.big_op(name)
    if name == "pi":
      return ("const", "pi")
    if name == "infty":
      return ("const", "inf")
    if name in GREEK:
      return ("sym", name)
    if name in FUNCS:
      if self.peek() == "^":  # \sin^2 x
        self.take()
        exp = self.group()
        return ("pow", ("fn", name, self.power()), exp)
      return ("fn", name, self.power())
    if self.peek() not in ("{", "[") and name not in _STRUCTURAL:
      return ("sym", "\\" + name)  # an unknown command without arguments (\zeta_0, \aleph) is a symbol
    raise Fail(f"unsupported command \\{name}")

  def big_op(self, name: str) -> Node:
    """`\\sum_{k=0}^{n-1} F_k F_{n-k-1}`: its index, bounds and body (the product that follows, as in `2 \\sum_k
    a_k + 1`) as one ('bigop', key) node. The key is the canonical text of the parts, sums and products in the
    body ordered (`canonical_key`), so the same sum written with its factors or terms in another order is the
    same node; values treat it as an unknown (nothing here computes a sum), so it equals only itself."""
    index, lower, upper = None, None, None
    for _ in range(2):
      if self.peek() == "_" and lower is None:
        self.take()
        if self.peek() == "{":
          self.take()
          index = self.take()
          if not index.isalpha() or len(index) != 1:
            raise Fail("unsupported index")
          if self.peek() == "=":
            self.take()
            lower = self.expr()
          else:
            lower = ("none",)
          self.take("}")
        else:
          index, lower = self.take(), ("none",)
          if not index.isalpha() or len(index) != 1:
            raise Fail("unsupported index")
      elif self.peek() == "^" and upper is None:
        self.take()
        upper = self.group()
    if index is None or self.peek() is None or not self.starts_atom(self.peek()):
      raise Fail(f"\\{name} without an index or a body")
    body = self.term()
    return ("bigop", "\\" + name + "@" + index + canonical_key(("parts", lower, upper or ("none",), body)))

  def matrix(self, begin: str) -> Node:
    env = begin[len(r"\begin{"):].split("}", 1)[0]
    if env not in _MATRIX_ENVS:
      raise Fail(f"unsupported environment {env}")
    rows, row = [], [self.expr()]
    while True:
      tok = self.take()
      if tok == "&":
        row.append(self.expr())
      elif tok == "\\\\":
        rows.append(tuple(row))
        if self.peek() == rf"\end{{{env}}}":  # a trailing row separator
          self.take()
          break
        row = [self.expr()]
      elif tok == rf"\end{{{env}}}":
        rows.append(tuple(row))
        break
      else:
        raise Fail(f"unexpected {tok!r} in a matrix")
    if len({len(r) for r in rows}) != 1:
      raise Fail("ragged matrix")
    return ("matrix", tuple(rows))


def _is_number(tok: str) -> bool:
  return tok[0].isdigit() or (tok[0] == "." and len(tok) > 1)


def _ends_in_number(node: Node) -> bool:
  while node[0] in ("mul", "add"):
    node = node[2]
  return node[0] == "num"


def number(tok: str) -> Fraction:
  """An exact decimal literal."""
  if len(tok) > MAX_DIGITS:
    raise Fail("number too long")
  return Fraction(tok)


def num_node(tok: str) -> Node:
  """('num', value), or ('num', value, 'dec', places) for a decimal with a fractional part: a rounded value
  written to `places` decimal places."""
  value = number(tok)
  if "." in tok and value.denominator != 1:
    return ("num", value, "dec", len(tok) - tok.index(".") - 1)
  return ("num", value)


def decimal_places(node: Node) -> int | None:
  """The decimal places of a bare decimal literal (`0.6666667`, `-1.25`), else None."""
  if node[0] == "neg":
    node = node[1]
  return node[3] if node[0] == "num" and len(node) > 3 else None


def parse(answer: str) -> Node | None:
  """Expression tree of a normalised answer, or None when it is outside the supported subset or bounds."""
  if not answer or len(answer) > MAX_CHARS:
    return None
  try:
    return _Parser(answer).top()
  except (Fail, ValueError, ZeroDivisionError, RecursionError):
    return None


def canonical_key(node: Node) -> str:
  """Text of a tree with the operands of sums and of products in a fixed order (`b + a` and `a + b`, `F_k
  F_{n-k-1}` and `F_{n-k-1} F_k` give one key): addition and multiplication commute, nothing else is assumed."""
  kind = node[0]
  if kind in ("add", "mul"):
    operands, stack = [], [node]
    while stack:
      n = stack.pop()
      if n[0] == kind:
        stack.extend((n[1], n[2]))
      else:
        operands.append(canonical_key(n))
    return "(" + ("+" if kind == "add" else "*") + " " + " ".join(sorted(operands)) + ")"
  parts = [kind]
  for child in node[1:]:
    if isinstance(child, tuple) and child and isinstance(child[0], str):
      parts.append(canonical_key(child))
    elif isinstance(child, tuple):  # items of a list, rows of a matrix
      parts.append("[" + " ".join(canonical_key(c) if c and isinstance(c[0], str) else
                                  "[" + " ".join(canonical_key(x) for x in c) + "]" for c in child) + "]")
    else:
      parts.append(str(child))
  return "(" + " ".join(parts) + ")"


def subnodes(node: Node):
  """Every node of a tree, depth first (items of lists and matrix rows included)."""
  stack = [node]
  while stack:
    n = stack.pop()
    if n and isinstance(n[0], str):
      yield n
      stack.extend(c for c in n[1:] if isinstance(c, tuple))
    else:  # a tuple of nodes (list items) or of rows
      stack.extend(c for c in n if isinstance(c, tuple))


def has_decimal(node: Node) -> bool:
  """Whether a tree holds a decimal literal with a fractional part (a rounded value, compared with tolerance)."""
  return any(n[0] == "num" and len(n) > 2 for n in subnodes(node))


def symbols(node: Node) -> set[str]:
  """Names of the free symbols of a tree."""
  return {n[1] for n in subnodes(node) if n[0] in ("sym", "bigop")}
