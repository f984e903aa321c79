"""The wire protocol of the assert-form harness (`harness_main.py`): framing and the values T and S exchange.

Not imported in the sandbox: its text is the first part of the harness program (then `harness_main.py`'s).

Framing: a 4-byte big-endian length, then JSON. Values: JSON scalars (None, bool, int below 2**53, float, str)
as themselves; everything else a list `[tag, ...]`: l list, t tuple, d dict (keys and values alternating), s set,
f frozenset, i int (hex), b bytes / B bytearray (latin-1 text), c complex, R range, e Ellipsis, q Fraction,
D Decimal, r a handle to an object of the solution's; from S to T only: m a module (by name: T imports its own),
x an exception class (by the names of its MRO: T makes or reuses a class of its own). Decoding builds fresh
objects of the receiver's own types, bounded in size (`_MAX_MESSAGE`) and depth (`_MAX_DEPTH`). Requests
`[op, handle, ...]`; replies `["ok", value(, copy_back)]`, `["missing"]` or `["exc", [class names of the MRO],
message]`.
"""

import json as _json
import os as _os

_MAX_MESSAGE = 64 << 20
_MAX_DEPTH = 200
_DETAIL_CHARS = 1500
_SCALARS = (type(None), bool, int, float, str)
_CATCHABLE = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTSTP",
              "SIGTTIN", "SIGTTOU", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH")
_IMMUTABLE_TAGS = {"t": tuple, "f": frozenset}


def _prctl(option, arg):
  import ctypes  # pylint: disable=import-outside-toplevel
  return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


# ----------------------------------------------------------------------------------------------- transport


def _send(fd, obj):
  data = _json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
  if len(data) > _MAX_MESSAGE:
    raise ValueError(f"message of {len(data)} bytes exceeds the harness limit")
  view = memoryview(len(data).to_bytes(4, "big") + data)
  while view:
    view = view[_os.write(fd, view):]


def _read_exact(fd, n):
  out = bytearray()
  while len(out) < n:
    chunk = _os.read(fd, min(n - len(out), 1 << 20))
    if not chunk:
      return None
    out += chunk
  return bytes(out)


def _recv(fd):
  """The next message, or None at EOF."""
  head = _read_exact(fd, 4)
  if head is None:
    return None
  n = int.from_bytes(head, "big")
  if n > _MAX_MESSAGE:
    raise ValueError(f"message of {n} bytes exceeds the harness limit")
  body = _read_exact(fd, n)
  if body is None:
    return None
  return _json.loads(body)


# ----------------------------------------------------------------------------------------------- values


def _int(x):
  return x if -(1 << 53) < x < (1 << 53) else ["i", format(x, "x")]


def _enc(x, handle, depth=0):
  """A value as protocol data; `handle(x)` names an object that is not data (it raises where none may pass)."""
  if depth > _MAX_DEPTH:
    raise ValueError("value nested too deeply for the harness")
  t = type(x)
  if t is int:
    return _int(x)
  if t in _SCALARS:
    return x
  d = depth + 1
  if t is list:
    return ["l"] + [_enc(v, handle, d) for v in x]
  if t is tuple:
    return ["t"] + [_enc(v, handle, d) for v in x]
  if t is dict:
    out = ["d"]
    for k, v in x.items():
      out += [_enc(k, handle, d), _enc(v, handle, d)]
    return out
  if t is set:
    return ["s"] + [_enc(v, handle, d) for v in x]
  if t is frozenset:
    return ["f"] + [_enc(v, handle, d) for v in x]
  if t is bytes:
    return ["b", x.decode("latin-1")]
  if t is bytearray:
    return ["B", bytes(x).decode("latin-1")]
  if t is complex:
    return ["c", x.real, x.imag]
  if t is range:
    return ["R", _int(x.start), _int(x.stop), _int(x.step)]
  if x is Ellipsis:
    return ["e"]
  name = t.__module__ + "." + t.__qualname__
  if name == "fractions.Fraction":
    return ["q", _int(x.numerator), _int(x.denominator)]
  if name == "decimal.Decimal":
    return ["D", str(x)]
  return handle(x, depth)


def _dec(x, remote, depth=0, special=None):
  """Protocol data as fresh objects of this process's own types; `remote(handle_id)` rebuilds a handle,
  `special(tag, items)` a module or exception class (T only; elsewhere those tags are malformed)."""
  t = type(x)
  if t in _SCALARS:
    return x
  if t is not list or not x or type(x[0]) is not str or depth > _MAX_DEPTH:
    raise ValueError("malformed value")
  tag, items, d = x[0], x[1:], depth + 1
  if tag == "l":
    return [_dec(v, remote, d, special) for v in items]
  if tag in _IMMUTABLE_TAGS:
    return _IMMUTABLE_TAGS[tag](_dec(v, remote, d, special) for v in items)
  if tag == "s":
    return {_dec(v, remote, d, special) for v in items}
  if tag == "d":
    if len(items) % 2:
      raise ValueError("malformed dict")
    return {_dec(items[i], remote, d, special): _dec(items[i + 1], remote, d, special)
            for i in range(0, len(items), 2)}
  if tag == "i" and len(items) == 1 and type(items[0]) is str:
    return int(items[0], 16)
  if tag in ("b", "B") and len(items) == 1 and type(items[0]) is str:
    data = items[0].encode("latin-1")
    return data if tag == "b" else bytearray(data)
  if tag == "c" and len(items) == 2 and all(type(v) in (int, float) for v in items):
    return complex(items[0], items[1])
  if tag == "R" and len(items) == 3:
    return range(*[_dec(v, remote, d) for v in items])
  if tag == "e" and not items:
    return Ellipsis
  if tag == "q" and len(items) == 2:
    import fractions  # pylint: disable=import-outside-toplevel
    return fractions.Fraction(_dec(items[0], remote, d), _dec(items[1], remote, d))
  if tag == "D" and len(items) == 1 and type(items[0]) is str:
    import decimal  # pylint: disable=import-outside-toplevel
    return decimal.Decimal(items[0])
  if tag == "r" and len(items) == 1 and type(items[0]) is int:
    return remote(items[0])
  if tag in ("m", "x") and special is not None and items and all(type(v) is str for v in items):
    return special(tag, items)
  raise ValueError(f"malformed value tag {tag!r}")


def _mro_names(exc):
  return [c.__name__ for c in type(exc).__mro__]


def _message(exc):
  try:
    text = str(exc)
  except BaseException:  # pylint: disable=broad-except
    text = "<unprintable>"
  return text[:_DETAIL_CHARS]
