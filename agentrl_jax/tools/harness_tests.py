"""The assert-form harness's handling of test code (part of the program `assert_tests.program_for` builds; see
`harness_main.py`): the instrumentation that counts the checks a test runs and applies the solution's changes to
its arguments at statement boundaries, and how pytest and unittest would run a test (parametrize, fixtures
around it, skips, coroutines, generators). Runs in T only. Standard library only.
"""

if __name__ != "__main__":  # imported (tests, tooling); in the sandbox the protocol's text comes first
  from agentrl_jax.tools.harness_protocol import _message

_TEST_FILE = "<test>"
# Calls that are checks: unittest's assert* methods, pytest.raises / fail / warns, numpy.testing.assert_*.
_CHECK_CALL_PREFIX = "assert"
_CHECK_CALLS = ("raises", "fail", "warns", "deprecated_call")


class _Unsupported(BaseException):
  """The test handed S something the harness cannot carry (a function or object of the test's own)."""


class _Malformed(BaseException):
  """The test cannot run here whatever the solution does (a skipped test, a helper no trusted code defines)."""


# ----------------------------------------------------------------------------------------------- the test code


def _call_name(call):
  f = call.func
  return f.attr if type(f).__name__ == "Attribute" else f.id if type(f).__name__ == "Name" else ""


def _is_check_call(call):
  name = _call_name(call)
  return name.startswith(_CHECK_CALL_PREFIX) or name in _CHECK_CALLS


def _raises_inside(node, ast):
  return any(isinstance(n, ast.Raise) or (isinstance(n, ast.Call) and _call_name(n) in ("fail", "exit", "_exit"))
             for n in ast.walk(node))


def _is_check_stmt(stmt, ast):
  """Whether a statement is unconditionally a check when it runs (the expected count is made of these)."""
  if isinstance(stmt, ast.Assert):
    return True
  if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _is_check_call(stmt.value):
    return True
  if isinstance(stmt, (ast.With, ast.AsyncWith)):
    return any(isinstance(i.context_expr, ast.Call) and _is_check_call(i.context_expr) for i in stmt.items)
  return isinstance(stmt, ast.If) and _raises_inside(stmt, ast)


def _instrument(tree, ast):
  """The test's AST with `__agentrl_step__()` before every statement and `__agentrl_check__()` before every
  assert and `if ...: raise`; check calls wrapped in `__agentrl_counted__(...)`."""

  def call(name, at):
    return ast.copy_location(ast.Expr(ast.Call(ast.Name(name, ast.Load()), [], [])), at)

  class Instrument(ast.NodeTransformer):
    """Adds the counters; statement lists anywhere (bodies, else, finally, handlers, cases)."""

    def generic_visit(self, node):
      for field, value in ast.iter_fields(node):
        if isinstance(value, list):
          items = [self.visit(v) if isinstance(v, ast.AST) else v for v in value]
          items = [v for v in items if v is not None]
          if items and all(isinstance(v, ast.stmt) for v in items):
            items = self.statements(node, items)
          setattr(node, field, items)
        elif isinstance(value, ast.AST):
          setattr(node, field, self.visit(value))
      return node

    def statements(self, owner, body):
      out = []
      for i, stmt in enumerate(body):
        docstring = (i == 0 and isinstance(owner, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                     and isinstance(stmt.value.value, str))
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (docstring or future):
          out.append(call("__agentrl_step__", stmt))
          if isinstance(stmt, ast.Assert) or (isinstance(stmt, ast.If) and _raises_inside(stmt, ast)):
            out.append(call("__agentrl_check__", stmt))
        out.append(stmt)
      return out

    def visit_Call(self, node):  # pylint: disable=invalid-name
      self.generic_visit(node)
      if _is_check_call(node):
        node.func = ast.copy_location(ast.Call(ast.Name("__agentrl_counted__", ast.Load()), [node.func], []),
                                      node.func)
      return node

  tree = Instrument().visit(tree)
  return ast.fix_missing_locations(tree)


def _target_body(tree, target, ast):
  """The statements of what `target` runs ('check', 'module', 'test:NAME', 'test:Class.method')."""
  if target == "module":
    return tree.body
  name = "check" if target == "check" else target[len("test:"):]
  cls_name, _, method = name.partition(".")
  for node in tree.body:
    if method and isinstance(node, ast.ClassDef) and node.name == cls_name:
      for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
          return item.body
    if not method and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == cls_name:
      return node.body
  return []


def _bound_names(tree, ast):
  """Names the test binds itself anywhere (defs, classes, assignments, imports other than from `solution`): a
  star import from the solution must not replace them (a test's own `expected()` defined above the import)."""
  names = set()
  for n in ast.walk(tree):
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(n.name)
    elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
      names.add(n.id)
    elif isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(n, "module", None) != "solution":
      names.update((a.asname or a.name).split(".")[0] for a in n.names if a.name != "*")
  return names


def _star_imports_solution(tree, ast):
  return any(isinstance(n, ast.ImportFrom) and n.module == "solution" and any(a.name == "*" for a in n.names)
             for n in ast.walk(tree))


# ----------------------------------------------------------------------------------------------- running a target


def _marks(fn):
  return [m for m in (getattr(fn, "pytestmark", None) or []) if hasattr(m, "name")]


def _parametrized_calls(fn):
  """The keyword-argument sets `@pytest.mark.parametrize` marks ask for ([{}] without marks)."""
  calls = [{}]
  for mark in reversed(_marks(fn)):
    if mark.name != "parametrize" or len(getattr(mark, "args", ())) < 2:
      continue
    names, values = mark.args[0], mark.args[1]
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    rows = []
    for v in values:
      if type(v).__name__ == "ParameterSet":  # pytest.param(...)
        v = tuple(v.values)
      elif len(names) == 1:
        v = (v,)
      rows.append(dict(zip(names, v)))
    calls = [dict(c, **r) for c in calls for r in rows]
  return calls


def _skipped(obj):
  """Why pytest or unittest would skip this test function or class, or ''."""
  if getattr(obj, "__unittest_skip__", False):
    return f"unittest skip: {getattr(obj, '__unittest_skip_why__', '')}"
  for mark in _marks(obj):
    args = getattr(mark, "args", ())
    if mark.name == "skip" or (mark.name == "skipif" and args and not isinstance(args[0], str) and args[0]):
      return f"pytest.mark.{mark.name}"
  return ""


def _call_fixture(owner, names):
  """Calls the first fixture of `names` that `owner` (the test's namespace or a test class) defines, with the
  class or module argument pytest would pass when it takes one."""
  import inspect  # pylint: disable=import-outside-toplevel
  for name in names:
    fn = owner.get(name) if isinstance(owner, dict) else getattr(owner, name, None)
    if not callable(fn):
      continue
    try:
      takes = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
      takes = []
    fn(*([owner if not isinstance(owner, dict) else None] if takes else []))
    return


def _run_target(tester, ns, target, candidate):
  """Runs what the test asks: check(candidate), a test function (parametrized), a test class method, with the
  fixtures pytest and unittest would call around it."""
  import inspect  # pylint: disable=import-outside-toplevel
  if target == "check":
    _finish(ns["check"](candidate))
    return 1
  if target == "module":
    return 1
  name = target[len("test:"):]
  cls_name, _, method = name.partition(".")
  if not method:
    fn = ns[name]
    if _skipped(fn):
      raise _Malformed(f"the test is skipped ({_skipped(fn)})")
    _call_fixture(ns, ("setup_module", "setUpModule"))
    try:
      _call_fixture(ns, ("setup_function",))
      try:
        return _call_test(tester, fn, inspect)
      finally:
        _call_fixture(ns, ("teardown_function",))
    finally:
      _call_fixture(ns, ("teardown_module", "tearDownModule"))
  cls = ns[cls_name]
  if not isinstance(cls, type):
    raise TypeError(f"{cls_name} is not a class")
  unittest_case = _is_unittest(cls)
  try:
    inst = cls(method) if unittest_case else cls()
  except TypeError as e:
    tester.unsupported = f"cannot instantiate test class {cls_name}: {_message(e)}"
    raise _Unsupported(tester.unsupported) from None
  fn = getattr(inst, method)
  why = _skipped(cls) or _skipped(fn)
  if why:
    raise _Malformed(f"the test is skipped ({why})")
  _call_fixture(ns, ("setup_module", "setUpModule"))
  try:
    _call_fixture(cls, ("setUpClass", "setup_class"))
    try:
      for setup in ("setUp", "setup_method"):
        if callable(getattr(inst, setup, None)):
          getattr(inst, setup)(*([fn] if setup == "setup_method" else []))
      try:
        runs = _call_test(tester, fn, inspect)
      finally:
        for teardown in ("tearDown", "teardown_method"):
          if callable(getattr(inst, teardown, None)):
            getattr(inst, teardown)(*([fn] if teardown == "teardown_method" else []))
        if unittest_case:
          inst.doCleanups()
    finally:
      _call_fixture(cls, ("tearDownClass", "teardown_class"))
  finally:
    _call_fixture(ns, ("teardown_module", "tearDownModule"))
  return runs


def _is_unittest(cls):
  return any(c.__module__ == "unittest.case" and c.__name__ == "TestCase" for c in cls.__mro__)


def _finish(result):
  """Runs what a test function returned when that is a coroutine (awaited) or a generator (iterated, calling
  what it yields nose-style): pytest plugins and older pytest did; skipping them would skip their checks."""
  import inspect  # pylint: disable=import-outside-toplevel
  if inspect.iscoroutine(result):
    import asyncio  # pylint: disable=import-outside-toplevel
    asyncio.run(result)
  elif inspect.isgenerator(result):
    for item in result:
      if isinstance(item, tuple) and item and callable(item[0]):
        item[0](*item[1:])


def _call_test(tester, fn, inspect):
  calls = _parametrized_calls(fn)
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    params = {}
  required = [p for p, v in params.items() if v.default is inspect.Parameter.empty
              and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
  for kwargs in calls:
    missing = [p for p in required if p not in kwargs]
    if missing:
      tester.unsupported = f"the test function needs pytest fixtures the harness does not provide: {missing}"
      raise _Unsupported(tester.unsupported)
    _finish(fn(**kwargs))
  return len(calls)
