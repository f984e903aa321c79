"""The assert-form test harness, run inside the sandbox as the program itself (`testcases.run_suite` builds it).

Not imported in the sandbox: `assert_tests.program_for` sends the text of `harness_protocol.py`,
`harness_solution.py`, `harness_tests.py` and this file, then one line, `_main(SOLUTION, PREFIX, SCRIPT)`, as
the program, and the test on standard input. Standard library only.

Why two processes. A check that runs in the solution's interpreter can be defeated by the solution: it can exit
0 before the check (`os._exit`, `sys.exit`, `SystemExit`), exit 0 after a failed one (atexit, `sys.excepthook`,
`sys.settrace`), patch the builtins or modules the check uses, or return an object whose `__eq__` always holds.
So the program forks at once:

  tester (T)   this process, pid 1 of the sandbox's pid namespace. It makes itself non-dumpable (no same-uid
               process may read its memory or descriptors: no ptrace, no /proc/PID/mem, no /proc/PID/fd), forks
               S, and only THEN reads standard input: a per-run random key, the test code and what to run.
               It runs the test code in its own interpreter with its own builtins; every name the test takes
               from the solution (`candidate`, `from solution import f`, a helper) is a proxy that calls S.
  solution (S) closes its standard input, runs the prefix and the solution, and serves those calls: a call's
               arguments arrive as data, its result leaves as data. What crosses is plain data (None, bool,
               int, float, complex, str, bytes, list, tuple, dict, set, frozenset, Fraction, Decimal, range)
               or an opaque handle to an object of the solution's own; T rebuilds the data as ITS objects, so
               every comparison in the test is between T's values. A module crosses by name and T uses its own
               (a solution's `math` with a patched `isclose` is not the test's `math`); an exception class by
               its MRO's names, so `pytest.raises(SolutionError)` catches what the solution raises.

What the solution cannot decide. A handle can be called, read and written through (attributes, items, len, iteration,
str, truth), but never compared, not even with itself: no `__eq__`, ordering or `__contains__` of the solution's
decides a test (`x in handle` is decided by T over the handle's items). An exception the solution raises that would
steer T's control flow (StopIteration ends `map`, `zip`, `all`) arrives as a RuntimeError of that name. Arguments
(lists, dicts, sets, bytearrays) come back after a call, so in-place mutation works, but the changes reach the test at
its next statement (or the solution's next call): `assert candidate(xs) == sorted(xs)` compares with the list the test
passed in. Names: the test reads only what it imports from `solution`, the entry point and, for a free name (one the
test uses but never defines), the solution's global of that name; a star import never shadows a builtin, a name of the
trusted prefix or one the test defines itself; a test that names an entry point and uses a helper only the solution
could supply is malformed (the prompt's helpers belong in the prefix).

Checks that never run are not passes. The test code is instrumented: each executed assert, `assert*` /
`raises` / `fail` call and `if ...: raise` counts as a check. A test passes only if no check failed, at least
one ran, and at least as many ran as the test's body holds unconditionally; zero checks with no part of the
solution consulted is a malformed test (an `async def` test is run to completion, a generator test iterated,
HumanEval's and MBPP's script-style tests run as `__main__`).

When the test has run, T kills S and writes its verdict as one line, `\\nagentrl-verdict <mac> <json>\\n`, the
JSON's HMAC-SHA256 under the run's key (one write below PIPE_BUF). The host accepts a verdict only with a valid
MAC, and the key never leaves T: it was read after the fork, into memory S cannot read, from a descriptor S
closed, and no line holds it. A process of the solution's that reads T's output (a grandchild reopening
`/proc/self/fd/1` where the sandbox runs as the host's uid) learns nothing it can forge with; taking the line
away only leaves the host without a verdict, a failed test. S dying (any exit, any signal), hanging, breaking
the protocol or raising SystemExit fails the test, whatever the test does afterwards. Signals to T from inside
the sandbox are dropped (pid 1 without handlers), and T ignores the catchable ones. Run by an executor that
gives programs root (a SandboxFusion container), S drops to `nobody` before any solution code, so the
non-dumpable T stays out of its reach there too.

Verdicts: pass; fail (with the first failure); malformed (the test itself cannot run: it imports a module that
does not exist, its prefix fails, it runs no check); unsupported (the test hands one of the solution's names
something the harness cannot carry, e.g. one of its own functions); harness_error (the harness broke before the
solution was involved). Only pass is a pass; the last three are not the response's doing and the reward reports
them as such, so none of them may depend on the solution: a transfer the solution provoked (its result's method
called with the test's own callable) is a failed test.

The messages between T and S and the values they carry are in `harness_protocol.py`, S in `harness_solution.py`,
what T does with the test code (counting checks, pytest's and unittest's ways of running a test) in
`harness_tests.py`; their text precedes this file's in the program.
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
  from agentrl_jax.tools.harness_tests import (_TEST_FILE, _Malformed, _Unsupported, _bound_names, _instrument,
                                               _is_check_stmt, _run_target, _star_imports_solution, _target_body)

_UNCOMPARABLE = ("an object of the solution's own type is compared: the harness compares data only, never with "
                 "the solution's __eq__")
_VERDICT_TAG = "agentrl-verdict"
# Exceptions that end an iteration or a generator when they escape a call: from the solution they would stop
# the test's own loops (`all(map(...))`), so T raises a RuntimeError of that name instead.
_CONTROL_FLOW = ("StopIteration", "StopAsyncIteration")
class _Gone(BaseException):
  """S exited, hung up or broke the protocol: the test fails whatever the test code does with it."""


# ----------------------------------------------------------------------------------------------- T: the tester


class _Tester:
  """T's side: the connection to S, the proxies, the test run and the verdict."""

  def __init__(self, req_w, rep_r):
    self.req_w, self.rep_r = req_w, rep_r
    self.gone = ""  # why S can no longer answer; once set, the test has failed
    self.unsupported = ""
    self.remote_errors = set()  # ids of exceptions raised in T on behalf of S
    self.exc_classes = {}  # MRO names -> T's class of that name
    self.names = []
    self.checks = 0  # checks the test ran
    self.consulted = False  # the test used something of the solution's (a call, a value, a global)
    self.pending = []  # (frame, target, value): copy-backs the test sees from its next statement on
    tester = self

    class Remote:
      """A handle to an object of the solution's (see the module docstring). `_g`: one of the solution's names
      the test took (its entry point, an import, a free name), as opposed to what a call returned."""

      __slots__ = ("_h", "_g")

      def __init__(self, h, g=False):
        object.__setattr__(self, "_h", h)
        object.__setattr__(self, "_g", g)

      def __call__(self, *args, **kwargs):
        enc_args = [tester.enc(a, self._g) for a in args]
        enc_kwargs = {str(k): tester.enc(v, self._g) for k, v in kwargs.items()}
        reply = tester.request(["call", self._h, enc_args, enc_kwargs])
        frame = tester.test_frame()
        for key, value in reply[2] if len(reply) > 2 and type(reply[2]) is list else ():
          target = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
          if frame is None:
            tester.copy_back(target, value)
          else:
            tester.pending.append((frame, target, value))
        return tester.dec(reply[1])

      def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
          raise AttributeError(name)
        return tester.dec(tester.request(["getattr", self._h, name])[1])

      def __setattr__(self, name, value):
        tester.request(["setattr", self._h, name, tester.enc(value, self._g)])

      def __getitem__(self, key):
        return tester.dec(tester.request(["getitem", self._h, tester.enc(key, self._g)])[1])

      def __setitem__(self, key, value):
        tester.request(["setitem", self._h, tester.enc(key, self._g), tester.enc(value, self._g)])

      def __delitem__(self, key):
        tester.request(["delitem", self._h, tester.enc(key, self._g)])

      def __len__(self):
        return tester.typed(tester.request(["len", self._h])[1], int, "len()")

      def __bool__(self):
        return tester.typed(tester.request(["bool", self._h])[1], bool, "bool()")

      def __iter__(self):
        return iter(tester.typed(tester.dec(tester.request(["iter", self._h])[1]), list, "iter()"))

      def __contains__(self, item):
        # Decided here over the items (data compared by T; a handle equals nothing), never by the object.
        return any(v is item or v == item for v in self.__iter__())

      def __str__(self):
        return tester.typed(tester.request(["str", self._h])[1], str, "str()")

      def __repr__(self):
        return tester.typed(tester.request(["repr", self._h])[1], str, "repr()")

      def __instancecheck__(self, obj):
        if type(obj) is not Remote:
          return False
        return tester.typed(tester.request(["isinstance", obj._h, self._h])[1], bool, "isinstance()")

      def __eq__(self, other):
        raise TypeError(_UNCOMPARABLE)  # even with itself: one object returned for every call equals nothing

      def __ne__(self, other):
        raise TypeError(_UNCOMPARABLE)

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
    if self.pending:  # the solution sees its own changes
      self.apply_pending(None)
    self.consulted |= msg[0] != "global"
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

  def enc(self, x, to_name=False):
    """`x` as protocol data. An object the harness cannot carry is unsupported when the test hands it to one
    of the solution's names (`to_name`: the test's structure), else a failure of the test: the solution
    provoked it (e.g. returned an object whose method the test then calls with its own callable)."""

    def handle(obj, depth):
      del depth
      if type(obj) is self.Remote:
        return ["r", obj._h]
      why = (f"the test passes the solution an object of type {type(obj).__name__}, which the harness cannot "
             "carry across processes")
      if not to_name:
        raise TypeError(why + " (to something the solution returned)")
      self.unsupported = why
      raise _Unsupported(why)

    def plain(obj, depth):  # the test's own subclasses of the plain types (OrderedDict, namedtuple...)
      for base in (dict, list, tuple, set, frozenset, str, int, float, bytes):
        if isinstance(obj, base) and type(obj) is not base and type(obj) is not self.Remote:
          return _enc(base(obj), plain, depth)
      return handle(obj, depth)

    return _enc(x, plain)

  def dec(self, x, named=False):
    try:
      return _dec(x, lambda h: self.Remote(h, named), special=self.special)
    except _Gone:
      raise
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
      self.gone = f"the solution process sent malformed data ({_message(e)})"
      raise _Gone(self.gone) from None

  def special(self, tag, items):
    if tag == "x":
      return self.exception_class(items)
    import importlib  # pylint: disable=import-outside-toplevel
    try:
      return importlib.import_module(items[0])
    except BaseException as e:  # pylint: disable=broad-except
      self.gone = f"the solution's value is a module {items[0][:100]!r} the tester cannot import ({_message(e)})"
      raise _Gone(self.gone) from None

  def exception_class(self, names):
    """T's class for an exception class of these MRO names: a builtin one, or one made here (cached, so the
    class the test imported is the class a raised exception has)."""
    names = [n for n in names if type(n) is str]
    for i, n in enumerate(names):
      builtin = getattr(_builtins, n, None)
      if isinstance(builtin, type) and issubclass(builtin, BaseException):
        break
    else:
      i, builtin = len(names), Exception
    if builtin.__name__ in _CONTROL_FLOW or not issubclass(builtin, Exception):
      builtin = RuntimeError
    cls = builtin
    for depth in range(i - 1, -1, -1):  # the solution's own classes, outermost first
      key = tuple(names[depth:])
      if key not in self.exc_classes:
        name = names[depth] if names[depth].isidentifier() else "SolutionError"
        self.exc_classes[key] = type(name, (cls,), {"__module__": "solution"})
      cls = self.exc_classes[key]
    if i == 0 and names and names[0] in _CONTROL_FLOW:
      key = tuple(names)
      if key not in self.exc_classes:
        self.exc_classes[key] = type(names[0], (RuntimeError,), {"__module__": "solution"})
      cls = self.exc_classes[key]
    return cls

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

  @staticmethod
  def test_frame():
    """The innermost frame of the test's own code on the stack (None if the call came from elsewhere)."""
    frame = _sys._getframe(2)
    while frame is not None and frame.f_code.co_filename != _TEST_FILE:
      frame = frame.f_back
    return frame

  def apply_pending(self, frame):
    """Applies the copy-backs of calls made in `frame`, or whose frame has finished (`None`: all of them)."""
    if frame is not None:
      live, f = set(), frame
      while f is not None:
        live.add(id(f))
        f = f.f_back
    keep = []
    for entry in self.pending:
      if frame is None or entry[0] is frame or id(entry[0]) not in live:
        self.copy_back(entry[1], entry[2])
      else:
        keep.append(entry)
    self.pending = keep

  def step(self):
    if self.pending:
      self.apply_pending(_sys._getframe(1))

  def check(self):
    self.checks += 1

  def counted(self, fn):
    self.checks += 1
    return fn

  def remote_exception(self, reply):
    names = reply[1] if len(reply) > 1 and type(reply[1]) is list else []
    message = reply[2] if len(reply) > 2 and type(reply[2]) is str else ""
    name = names[0] if names and type(names[0]) is str else "Exception"
    if "Exception" not in names:  # SystemExit, KeyboardInterrupt, GeneratorExit: the solution quit
      self.gone = f"the solution raised {name} during a test"
      return _Gone(self.gone)
    cls = self.exception_class(names)
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
    """The solution's global `name` as the test sees it (data, a handle, T's module or exception class)."""
    reply = self.request(["global", name])
    if reply[0] == "missing":
      return None, False
    value = self.dec(reply[1], named=True)
    # A function or class is not used until called; a value (a list the test loops over) is used on reading.
    self.consulted |= not (type(value) is self.Remote or isinstance(value, (type, type(_os))))
    return value, True


def _verdict(out_fd, key, outcome, detail=""):
  import hashlib  # pylint: disable=import-outside-toplevel
  import hmac  # pylint: disable=import-outside-toplevel
  body = _json.dumps({"outcome": outcome, "detail": detail[:_DETAIL_CHARS]}, ensure_ascii=True)
  mac = hmac.new(bytes.fromhex(key), body.encode(), hashlib.sha256).hexdigest()
  _os.write(out_fd, f"\n{_VERDICT_TAG} {mac} {body}\n".encode())


def _failure_detail(exc, test_lines):
  """`line N: <source>: Type: message` of where the test failed."""
  line_no, tb = None, exc.__traceback__
  while tb is not None:
    if tb.tb_frame.f_code.co_filename == _TEST_FILE:
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


def _main(solution, prefix, script=True):
  """The program: T (this process) forks S, reads the test, runs it, writes the verdict."""
  out_fd = _os.dup(1)  # the verdict goes out on T's own copy of stdout, whatever the test does with fd 1
  for name in _CATCHABLE:
    if hasattr(_signal, name):
      try:
        _signal.signal(getattr(_signal, name), _signal.SIG_IGN)
      except (OSError, ValueError):
        pass
  _prctl(4, 0)  # PR_SET_DUMPABLE 0: S (same uid) cannot read T's memory or descriptors; inherited by S
  pid, req_w, rep_r = _start_solution(solution, prefix, script)
  key = ""
  try:
    spec = _json.loads(_sys.stdin.buffer.read())
    key = spec["key"]
    bytes.fromhex(key)
    test, target, entry = spec["test"], spec["target"], spec.get("entry_point") or ""
    free_names = list(spec.get("free_names") or [])
    import ast  # pylint: disable=import-outside-toplevel
    tree = ast.parse(test, _TEST_FILE)
    expected = sum(_is_check_stmt(s, ast) for s in _target_body(tree, target, ast))
    star = _star_imports_solution(tree, ast)
    own_names = _bound_names(tree, ast)
    code = compile(_instrument(tree, ast), _TEST_FILE, "exec")
  except BaseException as e:  # pylint: disable=broad-except
    _os.kill(pid, _signal.SIGKILL)
    if key:
      _verdict(out_fd, key, "harness_error", f"cannot read the test: {type(e).__name__}: {_message(e)}")
    _os._exit(0)
  outcome, detail = _run(req_w, rep_r, prefix, test, code, target, entry, free_names, expected, star, own_names)
  try:
    _os.kill(pid, _signal.SIGKILL)
  except OSError:
    pass
  _verdict(out_fd, key, outcome, detail)
  _os._exit(0)


def _run(req_w, rep_r, prefix, test, code, target, entry, free_names, expected, star, own_names):
  """(outcome, detail) of one test."""
  tester = _Tester(req_w, rep_r)
  test_lines = test.split("\n")
  # Script-style tests (HumanEval's check, MBPP's asserts) run as the script they are appended to; pytest files
  # are imported modules.
  ns = {"__name__": "__agentrl_test__" if target.startswith("test:") else "__main__", "__builtins__": _builtins}
  try:
    if prefix:
      exec(compile(prefix, "<prefix>", "exec"), ns)  # pylint: disable=exec-used
  except BaseException as e:  # pylint: disable=broad-except
    return "malformed", f"the test's import prefix fails: {type(e).__name__}: {_message(e)}"
  if entry:
    ns.pop(entry, None)  # a stub of the entry point in the prefix (a prompt) must not shadow the solution's
  trusted = set(ns)
  ns.update(__agentrl_step__=tester.step, __agentrl_check__=tester.check, __agentrl_counted__=tester.counted)
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
  runs = 1
  try:
    _install_solution_module(tester, available, (trusted | own_names | set(dir(_builtins))) - {entry}, entry)
    _free_names(tester, ns, free_names, available, entry, star)
    candidate = None
    if entry:
      candidate, found = tester.global_value(entry) if entry in available else (None, False)
      if not found:
        candidate = _missing(entry)
    exec(code, ns)  # pylint: disable=exec-used
    if target != "module":  # only the target's own checks count for it, not the module's set-up
      tester.checks = 0
    runs = _run_target(tester, ns, target, candidate)
    tester.apply_pending(None)
  except BaseException as e:  # pylint: disable=broad-except
    if tester.gone:
      return "fail", tester.gone
    if tester.unsupported:
      return "unsupported", tester.unsupported
    if isinstance(e, _Malformed):
      return "malformed", _message(e)
    # A missing module is the test's problem only while the solution has not been used: after that, the
    # module's name may be the solution's doing (`import_module(candidate())`).
    problem = "" if tester.from_remote(e) or tester.consulted else _import_problem(e)
    if problem:
      return "malformed", problem
    return "fail", _failure_detail(e, test_lines)
  if tester.gone:
    return "fail", tester.gone
  if tester.unsupported:
    return "unsupported", tester.unsupported
  want = max(1, expected * runs)
  if tester.checks == 0 and not tester.consulted:
    return "malformed", "the test ran no check (and never used the solution)"
  if tester.checks < want:
    return "fail", f"{tester.checks} checks ran, the test holds {want} (what the solution returned cut it short)"
  return "pass", ""


def _missing(name):
  def missing(*args, **kwargs):
    del args, kwargs
    raise NameError(f"name {name!r} is not defined by the solution")
  return missing


# Names tests use for modules they expect the solution to have imported (MBPP's `math`, `np`).
_ALIASES = {"np": "numpy", "pd": "pandas", "sp": "scipy", "nx": "networkx", "plt": "matplotlib.pyplot"}


def _own_module(name):
  """T's own import of the standard-library module (or common alias) `name`, or None."""
  if name not in _sys.stdlib_module_names and name not in _ALIASES:
    return None
  import importlib  # pylint: disable=import-outside-toplevel
  try:
    return importlib.import_module(_ALIASES.get(name, name))
  except ImportError:
    return None


def _free_names(tester, ns, names, available, entry, star):
  """Binds the names the test reads but never defines: a standard-library module (or `np`...) by T's own
  import, whatever the solution bound to that name; else the solution's global. With an entry point named
  (and no star import asking for everything), any other such name is a helper only the solution could supply:
  the test is malformed (a solution would define the very function the test checks against)."""
  for name in names:
    if name in ns:
      continue
    own = _own_module(name) if name != entry else None
    if own is not None:
      ns[name] = own
      continue
    if entry and name != entry and not star:
      raise _Malformed(f"the test uses {name!r}, which neither the test nor its import prefix defines "
                       f"(a helper of the prompt: pass it in the suite's import_prefix)")
    if name in available:
      value, found = tester.global_value(name)
      if found:
        ns[name] = value


def _install_solution_module(tester, available, not_starred, entry):
  """`import solution` / `from solution import f`: a module whose attributes are the solution's globals. A star
  import brings the public names that are neither builtins nor the trusted prefix's (so a solution's `abs` or
  `isinstance` cannot replace what the test's own expressions use); a standard-library module's name is T's
  own module."""
  import types  # pylint: disable=import-outside-toplevel
  module = types.ModuleType("solution")
  module.__all__ = sorted(n for n in available if not n.startswith("_") and n not in not_starred)

  def getattr_(name):
    own = _own_module(name) if name != entry else None
    if own is not None:
      return own
    if name in available:
      value, found = tester.global_value(name)
      if found:
        return value
    raise AttributeError(f"module 'solution' has no attribute {name!r}")

  module.__getattr__ = getattr_
  _sys.modules["solution"] = module
