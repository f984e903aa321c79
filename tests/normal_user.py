"""Running tests as a normal (unprivileged) user, whether this process is root or not.

As root, `command(argv)` wraps a command so that it runs as an unused uid with no capabilities, in a private
mount namespace where the directories on the way to this interpreter, its virtualenv and the checkout are made
traversable (a root-only /root holding pyenv's Python, say: a tmpfs over /root with just the needed entries
bound back; nothing changes outside that namespace). What runs sees the machine as a newcomer's account would:
no root, no capabilities, the sandbox in its non-root mode. As a normal user it is the command itself.

    subprocess.run(normal_user.command([sys.executable, "-m", "pytest", ...]), env=normal_user.env())
"""

from __future__ import annotations

import os
import pwd
import sys

# Runs as root: `python -I -S -c _DROP UID PATHS -- argv...`.
_DROP = r"""
import ctypes, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)

def ok(rc, what):
  if rc != 0:
    e = ctypes.get_errno()
    raise OSError(e, f"{what}: {os.strerror(e)}")

uid, paths, argv = int(sys.argv[1]), [p for p in sys.argv[2].split(":") if p], sys.argv[4:]
ok(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")
ok(libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None), "make / private")
for _ in range(32):  # each round opens the shallowest closed directory on some path
  blocked = {}
  for p in paths:
    parts = os.path.realpath(p).strip("/").split("/")
    for i in range(len(parts)):
      d = "/" + "/".join(parts[:i])
      if not os.stat(d).st_mode & stat.S_IXOTH:
        blocked.setdefault(d, set()).add(parts[i])
        break
  if not blocked:
    break
  d = min(blocked, key=len)
  fds = {c: os.open(os.path.join(d, c), os.O_PATH) for c in sorted(blocked[d])}
  ok(libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0, b"mode=0755"), f"tmpfs on {d}")
  for c, fd in fds.items():
    target = os.path.join(d, c)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
      os.mkdir(target)
    else:
      open(target, "w").close()
    ok(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, 4096 | (1 << 14), None), f"bind {target}")
    os.close(fd)
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
os.execvp(argv[0], argv)
"""


def is_root() -> bool:
  return os.geteuid() == 0


def unused_uid(start: int = 61000) -> int:
  """A uid no account has (what a fresh user's processes run as, for the kernel)."""
  uid = start
  while True:
    try:
      pwd.getpwuid(uid)
    except KeyError:
      return uid
    uid += 1


def command(argv: list[str], paths: list[str] | None = None) -> list[str]:
  """`argv` as run by a normal user: unchanged when this process is not root.

  Args:
    argv: the command.
    paths: what the command must reach (default: this interpreter, its installation and virtualenv, and the
      checkout this file lives in).
  """
  if not is_root():
    return list(argv)
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = paths or [sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, here]
  return [sys.executable, "-I", "-S", "-c", _DROP, str(unused_uid()), ":".join(paths), "--", *argv]


def env(**extra: str) -> dict[str, str]:
  """A plain environment for the normal user's command (its own HOME under /tmp, this venv on PATH)."""
  base = {k: os.environ[k] for k in ("LANG", "LC_ALL", "CI", "JAX_PLATFORMS", "XLA_FLAGS") if k in os.environ}
  home = "/tmp" if is_root() else os.environ.get("HOME", "/tmp")
  base.update(PATH=f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", HOME=home)
  base.update(extra)
  return base
