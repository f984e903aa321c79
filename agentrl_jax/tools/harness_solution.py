"""S, the solution side of the assert-form harness (see `harness_main.py`): runs the solution, serves T's calls.

Not imported in the sandbox: its text is the second part of the harness program. Nothing here is trusted: S runs
the solution's code, which may replace any of it; T never relies on S for more than the values it sends.
"""

import builtins as _builtins
import json as _json
import os as _os
import signal as _signal

if __name__ != "__main__":  # imported (tests, tooling); in the sandbox the protocol's text comes first
  from agentrl_jax.tools.harness_protocol import (_CATCHABLE, _DETAIL_CHARS, _dec, _enc, _message, _mro_names,
                                                  _prctl, _recv, _send)

_INLINE_GLOBAL_BYTES = 1 << 20


def _serve(solution, prefix, req_r, rep_w, script):
  """Runs the solution and answers T's requests until T closes the pipe; never returns.

  `script`: the solution runs as the script the test is appended to (`__name__ == "__main__"`, HumanEval's and
  MBPP's way), else as the module `solution` a pytest file imports (its `__main__` demo block does not run).
  """
  handles, objects = {}, {}

  def handle(obj, depth):
    del depth
    key = id(obj)
    if key not in handles:
      handles[key] = len(objects)
      objects[len(objects)] = obj
    return ["r", handles[key]]

  def data(x, depth=0):
    # What a solution's value means as data: numpy scalars and arrays, subclasses of the plain types; a module
    # goes by its name and an exception class by its MRO's names (T uses its own module and class).
    t = type(x)
    if t is type(_os):
      return ["m", str(getattr(x, "__name__", ""))]
    if isinstance(x, type) and issubclass(x, BaseException):
      return ["x"] + [str(c.__name__) for c in x.__mro__]
    if t.__module__ == "numpy":
      if hasattr(x, "tolist") and hasattr(x, "dtype"):
        return _enc(x.tolist(), data, depth)
    for base in (bool, int, float, str, tuple, list, dict, set, frozenset, bytes, complex):
      if isinstance(x, base) and t is not base:
        try:
          return _enc(base(x) if base not in (bool,) else bool(x), data, depth)
        except Exception:  # pylint: disable=broad-except
          break
    return handle(x, depth)

  def enc(x):
    return _enc(x, data)

  def dec(x):
    return _dec(x, lambda h: objects[h])

  def reply_exc(exc):
    _send(rep_w, ["exc", _mro_names(exc), _message(exc)])

  g = {"__name__": "__main__" if script else "solution", "__builtins__": _builtins, "__file__": "/tmp/main.py"}
  try:
    if prefix:
      exec(compile(prefix, "<prefix>", "exec"), g)  # pylint: disable=exec-used
    exec(compile(solution, "<solution>", "exec"), g)  # pylint: disable=exec-used
  except BaseException as e:  # pylint: disable=broad-except
    import traceback  # pylint: disable=import-outside-toplevel
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])[-_DETAIL_CHARS:]
    _send(rep_w, ["import_error", _mro_names(e), _message(e), tb])
    _os._exit(0)
  _send(rep_w, ["ready", sorted(k for k in g if isinstance(k, str) and not k.startswith("__"))])
  while True:
    req = _recv(req_r)
    if req is None:
      _os._exit(0)
    op = req[0]
    try:
      if op == "global":
        if req[1] not in g:
          _send(rep_w, ["missing"])
          continue
        value = g[req[1]]
        out = enc(value)
        if len(_json.dumps(out)) > _INLINE_GLOBAL_BYTES:
          out = handle(value, 0)
        _send(rep_w, ["ok", out])
        continue
      target = objects[req[1]]
      copy_back = []
      if op == "call":
        args, kwargs = [dec(a) for a in req[2]], {k: dec(v) for k, v in req[3].items()}
        result = target(*args, **kwargs)
        mutable = (list, dict, set, bytearray)
        copy_back = [[i, enc(a)] for i, a in enumerate(args) if type(a) in mutable]
        copy_back += [[k, enc(v)] for k, v in kwargs.items() if type(v) in mutable]
      elif op == "getattr":
        result = getattr(target, req[2])
      elif op == "setattr":
        setattr(target, req[2], dec(req[3]))
        result = None
      elif op == "getitem":
        result = target[dec(req[2])]
      elif op == "setitem":
        target[dec(req[2])] = dec(req[3])
        result = None
      elif op == "delitem":
        del target[dec(req[2])]
        result = None
      elif op == "len":
        result = len(target)
      elif op == "bool":
        result = bool(target)
      elif op == "iter":
        result = list(target)
      elif op == "str":
        result = str(target)
      elif op == "repr":
        result = repr(target)
      elif op == "isinstance":
        result = isinstance(objects[req[2]], target)
      else:
        raise ValueError(f"unknown request {op!r}")
      out = enc(result)
    except BaseException as e:  # pylint: disable=broad-except
      reply_exc(e)
      continue
    _send(rep_w, ["ok", out, copy_back])


def _start_solution(solution, prefix, script):
  """Forks S; returns (pid, request write fd, reply read fd)."""
  req_r, req_w = _os.pipe()
  rep_r, rep_w = _os.pipe()
  pid = _os.fork()
  if pid:
    _os.close(req_r)
    _os.close(rep_w)
    return pid, req_w, rep_r
  try:
    _os.close(req_w)
    _os.close(rep_r)
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)  # T's standard input (the key, the test) is T's alone
    _os.close(null)
    for name in _CATCHABLE:
      if hasattr(_signal, name):
        _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG: S never outlives T
    if _os.geteuid() == 0:  # an executor running programs as root: S gives up root (and so every capability)
      _os.setgroups([])
      _os.setresgid(65534, 65534, 65534)
      _os.setresuid(65534, 65534, 65534)
  except BaseException:  # pylint: disable=broad-except
    _os._exit(70)
  _serve(solution, prefix, req_r, rep_w, script)
  _os._exit(0)
