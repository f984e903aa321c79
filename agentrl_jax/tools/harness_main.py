"""The assert-form test harness, run inside the sandbox as the program itself (`testcases.run_suite` builds it).

Not imported in the sandbox: `assert_tests.program_for` sends the text of `harness_protocol.py`,
`harness_solution.py` and this file, then one line, `_main(SOLUTION, PREFIX)`, as the program, and the test on
standard input. Standard library only.

Why two processes. A check that runs in the solution's interpreter can be defeated by the solution: it can exit
0 before the check (`os._exit`, `sys.exit`, `SystemExit`), exit 0 after a failed one (atexit, `sys.excepthook`,
`sys.settrace`), patch the builtins or modules the check uses, or return an object whose `__eq__` always holds.
So the program forks at once:

  tester (T)   this process, pid 1 of the sandbox's pid namespace. It makes itself non-dumpable (no same-uid
               process may read its memory or descriptors: no ptrace, no /proc/PID/mem, no /proc/PID/fd), forks
               S, and only THEN reads standard input: a per-run random nonce, the test code and what to run.
               It runs the test code in its own interpreter with its own builtins; every name the test takes
               from the solution (`candidate`, `from solution import f`, a helper) is a proxy that calls S.
  solution (S) closes its standard input, runs the prefix and the solution, and serves those calls: a call's
               arguments arrive as data, its result leaves as data. What crosses is plain data (None, bool,
               int, float, complex, str, bytes, list, tuple, dict, set, frozenset, Fraction, Decimal, range)
               or an opaque handle to an object of the solution's own; T rebuilds the data as ITS objects, so
               every comparison in the test is between T's values. A handle can be called, read and written
               through (attributes, items, len, iteration, str, truth), but not compared: no `__eq__` of the
               solution's decides a test. Arguments lists, dicts and sets come back after the call, so in-place
               mutation works as in one process.

When the test has run, T kills S and writes its verdict as one line, `\\n<nonce> {json}\\n` (one write below
PIPE_BUF, so no other writer can split it), then exits. The host accepts a pass only from a line carrying the
nonce of that run, which S never had: it was read after the fork, into memory S cannot read, from a descriptor
S closed. S dying (any exit, any signal), hanging, breaking the protocol or raising SystemExit fails the test,
whatever the test does afterwards. Signals to T from inside the sandbox are dropped (pid 1 without handlers),
and T ignores the catchable ones. Run by an executor that gives programs root (a SandboxFusion container), S
drops to `nobody` before any solution code, so the non-dumpable T stays out of its reach there too.

Verdicts: pass; fail (with the first failure); malformed (the test itself cannot run: it imports a module that
does not exist, or its prefix fails); unsupported (the test hands the solution something the harness cannot
carry, e.g. one of its own functions or objects); harness_error (the harness broke before the solution was
involved). Only pass is a pass; the last three are not the response's doing and the reward reports them as such.
A test that compares two objects of the solution's own type (a solution-defined `__eq__` deciding) fails: no
harness that keeps the solution's code out of its comparisons can run it.

The messages between T and S and the values they carry are in `harness_protocol.py`, S in `harness_solution.py`;
their text precedes this file's in the program.
"""

import builtins as _builtins
import json as _json
import os as _os
import signal as _signal
import sys as _sys

if __name__ != "__main__":  # imported (tests, tooling); in the sandbox the other parts' text comes first
  from agentrl_jax.tools.harness_protocol import (_CATCHABLE, _DETAIL_CHARS, _dec, _enc, _message, _prctl,
                                                  _recv, _send)
  from agentrl_jax.tools.harness_solution import _start_solution

_UNCOMPARABLE = ("an object of the solution's own type is compared: the harness compares data only, never with "
                 "the solution's __eq__")


class _Gone(BaseException):
  """S exited, hung up or broke the protocol: the test fails whatever the test code does with it."""


class _Unsupported(BaseException):
  """The test handed S something the harness cannot carry (a function or object of the test's own)."""


# ----------------------------------------------------------------------------------------------- T: the tester


class _Tester:
  """T's side: the connection to S, the proxies, the test run and the verdict."""

  def __init__(self, req_w, rep_r):
    self.req_w, self.rep_r = req_w, rep_r
    self.gone = ""  # why S can no longer answer; once set, the test has failed
    self.unsupported = ""
    self.remote_errors = set()  # ids of exceptions raised in T on behalf of S
    self.exc_classes = {}
    self.names = []
    tester = self

    class Remote:
      """A handle to an object of the solution's (see the module docstring)."""

      __slots__ = ("_h",)

      def __init__(self, h):
        object.__setattr__(self, "_h", h)

      def __call__(self, *args, **kwargs):
        enc_args = [tester.enc(a) for a in args]
        enc_kwargs = {str(k): tester.enc(v) for k, v in kwargs.items()}
        reply = tester.request(["call", self._h, enc_args, enc_kwargs])
        for key, value in reply[2] if len(reply) > 2 and type(reply[2]) is list else ():
          target = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
          tester.copy_back(target, value)
        return tester.dec(reply[1])

      def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
          raise AttributeError(name)
        return tester.dec(tester.request(["getattr", self._h, name])[1])

      def __setattr__(self, name, value):
        tester.request(["setattr", self._h, name, tester.enc(value)])

      def __getitem__(self, key):
        return tester.dec(tester.request(["getitem", self._h, tester.enc(key)])[1])

      def __setitem__(self, key, value):
        tester.request(["setitem", self._h, tester.enc(key), tester.enc(value)])

      def __delitem__(self, key):
        tester.request(["delitem", self._h, tester.enc(key)])

      def __len__(self):
        return tester.typed(tester.request(["len", self._h])[1], int, "len()")

      def __bool__(self):
        return tester.typed(tester.request(["bool", self._h])[1], bool, "bool()")

      def __iter__(self):
        return iter(tester.typed(tester.dec(tester.request(["iter", self._h])[1]), list, "iter()"))

      def __contains__(self, item):
        return bool(tester.typed(tester.request(["contains", self._h, tester.enc(item)])[1], bool, "in"))

      def __str__(self):
        return tester.typed(tester.request(["str", self._h])[1], str, "str()")

      def __repr__(self):
        return tester.typed(tester.request(["repr", self._h])[1], str, "repr()")

      def __instancecheck__(self, obj):
        if type(obj) is not Remote:
          return False
        return tester.typed(tester.request(["isinstance", obj._h, self._h])[1], bool, "isinstance()")

      def __eq__(self, other):
        if type(other) is Remote and other._h == self._h:
          return True
        raise TypeError(_UNCOMPARABLE)

      def __ne__(self, other):
        return not self.__eq__(other)

      def _order(self, other):
        raise TypeError(_UNCOMPARABLE)

      __lt__ = __le__ = __gt__ = __ge__ = _order

      def __hash__(self):
        return hash(("agentrl_remote", self._h))

    self.Remote = Remote

  # ---- transport
  def request(self, msg):
    if self.gone:
      raise _Gone(self.gone)
    try:
      _send(self.req_w, msg)
      reply = _recv(self.rep_r)
    except BaseException as e:  # pylint: disable=broad-except
      self.gone = f"the solution process broke the connection ({type(e).__name__}: {_message(e)})"
      raise _Gone(self.gone) from None
    if reply is None:
      self.gone = "the solution process exited or closed its connection during a test"
      raise _Gone(self.gone)
    if type(reply) is not list or not reply or reply[0] not in ("ok", "exc", "missing"):
      self.gone = "the solution process sent a malformed reply"
      raise _Gone(self.gone)
    if reply[0] == "exc":
      raise self.remote_exception(reply)
    return reply

  def enc(self, x):
    def handle(obj, depth):
      del depth
      if type(obj) is self.Remote:
        return ["r", obj._h]
      self.unsupported = (f"the test passes the solution an object of type {type(obj).__name__}, which the "
                          "harness cannot carry across processes")
      raise _Unsupported(self.unsupported)

    def plain(obj, depth):  # the test's own subclasses of the plain types (OrderedDict, namedtuple...)
      for base in (dict, list, tuple, set, frozenset, str, int, float, bytes):
        if isinstance(obj, base) and type(obj) is not base and type(obj) is not self.Remote:
          return _enc(base(obj), plain, depth)
      return handle(obj, depth)

    return _enc(x, plain)

  def dec(self, x):
    try:
      return _dec(x, self.Remote)
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
      self.gone = f"the solution process sent malformed data ({_message(e)})"
      raise _Gone(self.gone) from None

  def typed(self, value, kind, what):
    if type(value) is not kind:
      self.gone = f"the solution process answered {what} with a {type(value).__name__}, not a {kind.__name__}"
      raise _Gone(self.gone)
    return value

  def copy_back(self, target, value):
    new = self.dec(value)
    if type(target) is list and type(new) is list:
      target[:] = new
    elif type(target) is dict and type(new) is dict:
      target.clear()
      target.update(new)
    elif type(target) is set and type(new) is set:
      target.clear()
      target.update(new)
    elif type(target) is bytearray and type(new) is bytearray:
      target[:] = new

  def remote_exception(self, reply):
    names = reply[1] if len(reply) > 1 and type(reply[1]) is list else []
    message = reply[2] if len(reply) > 2 and type(reply[2]) is str else ""
    name = names[0] if names and type(names[0]) is str else "Exception"
    if "Exception" not in names:  # SystemExit, KeyboardInterrupt, GeneratorExit: the solution quit
      self.gone = f"the solution raised {name} during a test"
      return _Gone(self.gone)
    builtin = lambda n: getattr(_builtins, n, None) if type(n) is str else None  # noqa: E731
    base = next((builtin(n) for n in names if isinstance(builtin(n), type) and issubclass(builtin(n), Exception)),
                Exception)
    if base.__name__ == name:
      cls = base
    else:
      cls = self.exc_classes.get((name, base))
      if cls is None:
        cls = self.exc_classes[(name, base)] = type(name if name.isidentifier() else "SolutionError", (base,), {})
    try:
      exc = cls(message)
    except Exception:  # pylint: disable=broad-except
      exc = Exception(f"{name}: {message}")
    self.remote_errors.add(id(exc))
    return exc

  def from_remote(self, exc):
    seen = 0
    while exc is not None and seen < 50:
      if id(exc) in self.remote_errors:
        return True
      exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False

  def global_value(self, name):
    reply = self.request(["global", name])
    if reply[0] == "missing":
      return None, False
    return self.dec(reply[1]), True


def _verdict(out_fd, nonce, outcome, detail=""):
  line = _json.dumps({"outcome": outcome, "detail": detail[:_DETAIL_CHARS]}, ensure_ascii=True)
  data = ("\n" + nonce + " " + line + "\n").encode()
  _os.write(out_fd, data)


def _failure_detail(exc, test_lines):
  """`line N: <source>: Type: message` of where the test failed."""
  line_no, tb = None, exc.__traceback__
  while tb is not None:
    if tb.tb_frame.f_code.co_filename == "<test>":
      line_no = tb.tb_lineno
    tb = tb.tb_next
  where = ""
  if line_no is not None and 0 < line_no <= len(test_lines):
    where = f"line {line_no}: {test_lines[line_no - 1].strip()[:300]}: "
  return f"{where}{type(exc).__name__}: {_message(exc)}"


def _import_problem(exc):
  """Why `exc` shows the test cannot run here (a module that does not exist), or ''."""
  if isinstance(exc, ModuleNotFoundError) and exc.name != "solution":
    return f"the test imports {exc.name!r}, which does not exist here"
  if isinstance(exc, ImportError) and not isinstance(exc, ModuleNotFoundError) and exc.name not in (None, "solution"):
    return f"the test's import failed: {_message(exc)}"
  return ""


def _parametrized_calls(fn):
  """The keyword-argument sets `@pytest.mark.parametrize` marks ask for ([{}] without marks)."""
  calls = [{}]
  for mark in reversed(getattr(fn, "pytestmark", None) or []):
    if getattr(mark, "name", "") != "parametrize" or len(getattr(mark, "args", ())) < 2:
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


def _run_target(tester, ns, target, candidate):
  """Runs what the test asks: check(candidate), a test function (parametrized), a test class method."""
  import inspect  # pylint: disable=import-outside-toplevel
  if target == "check":
    ns["check"](candidate)
    return
  if target == "module":
    return
  name = target[len("test:"):]
  cls_name, _, method = name.partition(".")
  if method:
    cls = ns[cls_name]
    if not isinstance(cls, type):
      raise TypeError(f"{cls_name} is not a class")
    try:
      inst = cls(method) if _is_unittest(cls) else cls()
    except TypeError as e:
      tester.unsupported = f"cannot instantiate test class {cls_name}: {_message(e)}"
      raise _Unsupported(tester.unsupported) from None
    fn = getattr(inst, method)
    for setup in ("setUp", "setup_method"):
      if callable(getattr(inst, setup, None)):
        getattr(inst, setup)(*([fn] if setup == "setup_method" else []))
    _call_test(tester, fn, inspect)
    for teardown in ("tearDown", "teardown_method"):
      if callable(getattr(inst, teardown, None)):
        getattr(inst, teardown)(*([fn] if teardown == "teardown_method" else []))
    return
  _call_test(tester, ns[name], inspect)


def _is_unittest(cls):
  return any(c.__module__ == "unittest.case" and c.__name__ == "TestCase" for c in cls.__mro__)


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
    fn(**kwargs)


def _main(solution, prefix):
  """The program: T (this process) forks S, reads the test, runs it, writes the verdict."""
  out_fd = _os.dup(1)  # the verdict goes out on T's own copy of stdout, whatever the test does with fd 1
  for name in _CATCHABLE:
    if hasattr(_signal, name):
      try:
        _signal.signal(getattr(_signal, name), _signal.SIG_IGN)
      except (OSError, ValueError):
        pass
  _prctl(4, 0)  # PR_SET_DUMPABLE 0: S (same uid) cannot read T's memory or descriptors; inherited by S
  pid, req_w, rep_r = _start_solution(solution, prefix)
  nonce = ""
  try:
    spec = _json.loads(_sys.stdin.buffer.read())
    nonce = spec["nonce"]
    test, target, entry = spec["test"], spec["target"], spec.get("entry_point") or ""
    free_names = list(spec.get("free_names") or [])
    code = compile(test, "<test>", "exec")
  except BaseException as e:  # pylint: disable=broad-except
    _os.kill(pid, _signal.SIGKILL)
    if nonce:
      _verdict(out_fd, nonce, "harness_error", f"cannot read the test: {type(e).__name__}: {_message(e)}")
    _os._exit(0)
  outcome, detail = _run(req_w, rep_r, prefix, test, code, target, entry, free_names)
  try:
    _os.kill(pid, _signal.SIGKILL)
  except OSError:
    pass
  _verdict(out_fd, nonce, outcome, detail)
  _os._exit(0)


def _run(req_w, rep_r, prefix, test, code, target, entry, free_names):
  """(outcome, detail) of one test."""
  tester = _Tester(req_w, rep_r)
  test_lines = test.split("\n")
  ns = {"__name__": "__agentrl_test__", "__builtins__": _builtins}
  try:
    if prefix:
      exec(compile(prefix, "<prefix>", "exec"), ns)  # pylint: disable=exec-used
  except BaseException as e:  # pylint: disable=broad-except
    return "malformed", f"the test's import prefix fails: {type(e).__name__}: {_message(e)}"
  if entry:
    ns.pop(entry, None)  # a stub of the entry point in the prefix (a prompt) must not shadow the solution's
  try:
    first = _recv(rep_r)
  except BaseException as e:  # pylint: disable=broad-except
    return "fail", f"the solution process broke the connection ({type(e).__name__})"
  if first is None:
    return "fail", "the solution process exited before its code finished loading"
  if type(first) is not list or not first or first[0] not in ("ready", "import_error"):
    return "fail", "the solution process sent a malformed first message"
  if first[0] == "import_error":
    names = first[1] if len(first) > 1 and type(first[1]) is list else ["?"]
    msg = first[2] if len(first) > 2 and type(first[2]) is str else ""
    return "fail", f"the solution raised {names[0] if names else '?'} while loading: {msg}"[:_DETAIL_CHARS]
  available = set(n for n in first[1] if type(n) is str) if len(first) > 1 and type(first[1]) is list else set()
  tester.names = sorted(available)
  try:
    _install_solution_module(tester, available)
    for name in free_names:
      if name in available and name not in ns:
        value, found = tester.global_value(name)
        if found:
          ns[name] = value
    candidate = None
    if entry:
      candidate, found = tester.global_value(entry) if entry in available else (None, False)
      if not found:
        candidate = _missing(entry)
    exec(code, ns)  # pylint: disable=exec-used
    _run_target(tester, ns, target, candidate)
  except BaseException as e:  # pylint: disable=broad-except
    if tester.gone:
      return "fail", tester.gone
    if tester.unsupported:
      return "unsupported", tester.unsupported
    problem = "" if tester.from_remote(e) else _import_problem(e)
    if problem:
      return "malformed", problem
    return "fail", _failure_detail(e, test_lines)
  if tester.gone:
    return "fail", tester.gone
  if tester.unsupported:
    return "unsupported", tester.unsupported
  return "pass", ""


def _missing(name):
  def missing(*args, **kwargs):
    del args, kwargs
    raise NameError(f"name {name!r} is not defined by the solution")
  return missing


def _install_solution_module(tester, available):
  """`import solution` / `from solution import f`: a module whose attributes are the solution's globals."""
  import types  # pylint: disable=import-outside-toplevel
  module = types.ModuleType("solution")
  public = sorted(n for n in available if not n.startswith("_"))
  module.__all__ = public

  def getattr_(name):
    if name in available:
      value, found = tester.global_value(name)
      if found:
        return value
    raise AttributeError(f"module 'solution' has no attribute {name!r}")

  module.__getattr__ = getattr_
  _sys.modules["solution"] = module
