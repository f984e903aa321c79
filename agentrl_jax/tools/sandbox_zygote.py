"""Fork server run as pid 1 of a worker sandbox: one fresh, isolated, unprivileged process per program.

Not imported: `sandbox_worker.py` runs this file inside bubblewrap as `python -I -B -u /tmp/main.py`, the very
command line a program has in per-call mode; its one descriptor above 2 is a unix SOCK_SEQPACKET socket to the
host. Standard library only, and nothing it imports or defines is visible to a program (see `_prepare_main`).

Two ways to hold the capabilities it needs. As root: bubblewrap keeps CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID,
CAP_SETPCAP and CAP_KILL for it, and each program runs as a uid of its own. As a normal user (bubblewrap in a
user namespace, no capability left): the zygote first makes a user namespace of its own, where it holds every
capability over that namespace's mounts and pids and nothing outside, and sets that namespace's
max_user_namespaces to 0, so no program can make one (bubblewrap's --disable-userns, per call). There is one
uid to run as, the user's own, as in per-call mode; each program still gets its own mount, pid and ipc
namespaces and no capability.

Protocol (one job at a time). Host -> zygote: `run UID AS CPU NPROC FSIZE NOFILE TMPFS[\0ROOT...]` with
descriptors [code memfd, stdout, stderr(, stdin memfd)] (UID -1: keep the uid; ROOT: a directory of the
interpreter under /tmp or /dev/shm, bound back over the program's private tmpfs); `kill`. Zygote -> host:
`ready`; `start PIDNS` (the program's pid namespace inode); `exit CODE` (the program's exit code, 128 + N for
signal N, as bubblewrap reports it); `error TEXT` (setup failed; the program did not run).

Per job three processes, each forked from the one before:
  zygote   forks a keeper per job, relays `kill` to the newest as SIGUSR1, reaps them (pidfds).
  keeper   unshares mount, pid and ipc namespaces, mounts a private tmpfs on /tmp and /dev/shm, forks the
           program, SIGKILLs it on SIGUSR1, reports `exit` once it is reaped. It has to exist: a process can
           unshare a pid namespace only once, so the zygote cannot be the parent of every program.
  program  pid 1 of the new pid namespace: mounts its own /proc, reports `start`, writes /tmp/main.py, sets
           rlimits, drops to the job's uid with an empty capability bounding set, and runs the file as the
           interpreter runs a script (`_Start`): `__name__ == "__main__"`, tracebacks without a zygote frame,
           the same exit codes. When it ends, the kernel kills whatever else lives in its namespace.

What a program can tell from a fresh interpreter: the objects of its start-up state are frozen (`_arm_launch`):
`gc.get_freeze_count()` > 0, `gc.get_objects()` lists only what the program made, and the collector never frees
them. Its own objects are collected as usual, at exit too, with one exception: an object in a reference cycle
that only a start-up module holds (`site.x = obj` with `obj.me = obj`; the modules a fresh interpreter frees as
garbage at exit: site, operator, itertools, ...) is not finalized at exit.
"""

# What a fresh `python -I -B -u /tmp/main.py` has when its first line runs; the program gets exactly this.
_BOOT_MAIN = dict(globals())

import sys  # pylint: disable=wrong-import-position

_BOOT_MODULES = frozenset(sys.modules)
_BOOT_PATH_CACHE = frozenset(sys.path_importer_cache)

import ctypes  # pylint: disable=wrong-import-position
import gc  # pylint: disable=wrong-import-position
import os  # pylint: disable=wrong-import-position
import resource  # pylint: disable=wrong-import-position
import select  # pylint: disable=wrong-import-position
import stat  # pylint: disable=wrong-import-position
import _signal  # pylint: disable=wrong-import-position
import _socket  # pylint: disable=wrong-import-position

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWUSER = 0x20000, 0x8000000, 0x20000000, 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_REC, _MS_PRIVATE = 1 << 14, 1 << 18
_CAP_SYS_ADMIN = 21
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP = 1, 4, 24
_CAP_SETPCAP, _CAPABILITY_VERSION_3 = 8, 0x20080522
_SETUP_FAILED = 71  # exit code of a keeper or program whose setup failed (after an `error` message)
MAIN = "/tmp/main.py"

_libc = ctypes.CDLL(None, use_errno=True)


def _cfunc(name, restype, *argtypes):
  f = getattr(_libc, name)
  f.restype, f.argtypes = restype, argtypes
  return f


_unshare = _cfunc("unshare", ctypes.c_int, ctypes.c_int)
_mount = _cfunc("mount", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                ctypes.c_char_p)
_prctl = _cfunc("prctl", ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_capset = _cfunc("capset", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_fopen = _cfunc("fopen", ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
_CAP_LAST = _BOOT_SIGMASK = _UNHANDLED_KBI = None  # set by `_main`


def _ok(rc, what):
  if rc != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _send(sock, text):
  sock.sendmsg([text if isinstance(text, bytes) else text.encode("utf-8", "replace")])


def _recv(sock):
  """One message and the descriptors that came with it; b'' when the host is gone."""
  msg, anc, _, _ = sock.recvmsg(65536, _socket.CMSG_SPACE(8 * 4))
  fds = []
  for level, kind, data in anc:
    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
      fds += [int.from_bytes(data[i:i + 4], sys.byteorder, signed=True) for i in range(0, len(data) - 3, 4)]
  return msg, fds


def _fail(sock, who, exc):
  try:
    _send(sock, f"error {who}: {type(exc).__name__}: {exc}")
  finally:
    os._exit(_SETUP_FAILED)


class _Job:
  """A parsed `run` message."""

  def __init__(self, msg, fds):
    head, *roots = msg.split(b"\0")
    fields = [int(x) for x in head.split()[1:]]
    if len(fields) != 7 or len(fds) not in (3, 4) or not all(r.startswith((b"/tmp/", b"/dev/shm/")) for r in roots):
      raise ValueError(f"malformed job {msg[:100]!r} with {len(fds)} descriptors")
    self.uid, self.mem, self.cpu, self.nproc, self.fsize, self.nofile, self.tmpfs = fields
    self.roots = roots
    self.fds = fds
    self.code, self.stdout, self.stderr = fds[:3]
    self.stdin = fds[3] if len(fds) == 4 else None


def _serve(sock):
  """Runs jobs until the host hangs up; raises `_Start` inside each program's process."""
  _send(sock, b"ready")
  poller = select.poll()
  poller.register(sock.fileno(), select.POLLIN)
  keepers = {}  # pidfd -> pid: keepers not reaped yet (older ones may still be tearing down their namespaces)
  current = None  # pidfd of the newest keeper, the one a `kill` is for
  while True:
    for fd, _ in poller.poll():
      if fd != sock.fileno():
        _reap(sock, keepers, poller, fd, fd == current)
        current = None if fd == current else current
        continue
      msg, fds = _recv(sock)
      if not msg:
        os._exit(0)  # the host is gone: as pid 1 our exit kills every process of the worker
      if msg == b"kill" and current is not None:
        try:
          _signal.pidfd_send_signal(current, _signal.SIGUSR1)
        except ProcessLookupError:
          pass  # already gone: its `exit` is on the way
      if not msg.startswith(b"run "):
        for extra in fds:
          os.close(extra)
        continue
      try:
        job = _Job(msg, fds)
      except ValueError as e:
        for extra in fds:
          os.close(extra)
        _send(sock, f"error zygote: {e}")
        continue
      keeper = os.fork()
      if keeper == 0:
        _keeper(sock, job)  # raises _Start in the program; the keeper itself never returns
      for extra in fds:
        os.close(extra)
      current = os.pidfd_open(keeper)
      keepers[current] = keeper
      poller.register(current, select.POLLIN)


def _reap(sock, keepers, poller, pidfd, is_current):
  poller.unregister(pidfd)
  _, status = os.waitpid(keepers.pop(pidfd), 0)
  os.close(pidfd)
  reported = os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, _SETUP_FAILED)
  if is_current and not reported:
    _send(sock, f"error zygote: the keeper process died (wait status {status:#x})")
  if not keepers:
    try:  # orphans of a keeper that died early are reparented to us, pid 1; reap them too
      while os.waitpid(-1, os.WNOHANG)[0]:
        pass
    except ChildProcessError:
      pass


def _kill(pid):
  try:
    os.kill(pid, _signal.SIGKILL)
  except OSError:
    pass


def _keeper(sock, job):
  try:
    # The keeper stays in the worker's pid namespace; its next child is pid 1 of the new one.
    _ok(_unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC), "unshare")
    _ok(_mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
    # The interpreter's directories under /tmp (a checkout there) stay reachable through descriptors while the
    # private tmpfs covers them, then are bound back, read-only, as per-call sandboxes bind them.
    roots = [(root, os.open(root, os.O_PATH | os.O_DIRECTORY)) for root in job.roots]
    for path in (b"/tmp", b"/dev/shm"):
      _ok(_mount(b"tmpfs", path, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777,size=%d" % job.tmpfs),
          f"mount tmpfs on {path.decode()}")
    for root, fd in roots:
      _bind_back(root, fd)
    program = os.fork()
  except Exception as e:  # pylint: disable=broad-except
    _fail(sock, "keeper", e)
  if program == 0:
    _program(sock, job)  # raises _Start
  try:
    _signal.signal(_signal.SIGUSR1, lambda *_: _kill(program))
    for fd in job.fds:
      os.close(fd)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGUSR1})
    _, status = os.waitpid(program, 0)  # retried after EINTR (PEP 475), the handler run in between
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGUSR1})  # reaped: its pid is free for reuse
    # Reported here rather than by the zygote once we are reaped: the program and its whole pid namespace are
    # gone now, while our exit still has to tear down the mount namespace, which takes milliseconds.
    _send(sock, b"exit %d" % (os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)))
    os._exit(0)
  except BaseException as e:  # pylint: disable=broad-except
    _kill(program)
    _fail(sock, "keeper", e)


def _bind_back(root, fd):
  parent = b"/"
  for part in root.strip(b"/").split(b"/"):
    parent = os.path.join(parent, part)
    if not os.path.isdir(parent):
      os.mkdir(parent)
      os.chmod(parent, 0o755)
  _ok(_mount(b"/proc/self/fd/%d" % fd, root, None, _MS_BIND | _MS_REC, None), f"bind {root.decode()}")
  os.close(fd)
  if _mount(None, root, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None) != 0 and not (
      os.statvfs(root).f_flag & os.ST_RDONLY):
    raise PermissionError(f"{root.decode()} could not be made read-only")


def _drop_privileges(uid):
  # Empty bounding set first (needs CAP_SETPCAP, dropped last), then the uid: setresuid clears the effective
  # and permitted sets, capset the inheritable one (and, keeping the uid, all of them). no_new_privs is
  # inherited from bubblewrap.
  for cap in sorted(range(_CAP_LAST + 1), key=lambda c: c == _CAP_SETPCAP):
    _ok(_prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
  if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
  _ok(_capset(header, (ctypes.c_uint32 * 6)()), "capset")
  # A uid change clears the parent-death signal and makes /proc/self root's; exec would undo the latter.
  _ok(_prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
  _ok(_prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
  with open("/proc/self/status", encoding="ascii") as f:
    caps = [line.split() for line in f if line.startswith("Cap")]
  if any(int(value, 16) for _, value in caps) or (uid >= 0 and os.getuid() != uid):
    raise PermissionError(f"privileges were not dropped: uid {os.getuid()}, {caps}")


def _own_user_namespace():
  """Without CAP_SYS_ADMIN (bubblewrap in a user namespace): a user namespace of the zygote's own mapping only
  its uid, with every capability over the namespaces it makes next, and none for the programs to make."""
  with open("/proc/self/status", encoding="ascii") as f:
    effective = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
  if effective >> _CAP_SYS_ADMIN & 1:
    return
  uid, gid = os.getuid(), os.getgid()
  _ok(_unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
  for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
      f.write(text)
  with open("/proc/sys/user/max_user_namespaces", "w", encoding="ascii") as f:
    f.write("0")


def _program(sock, job):
  try:
    _ok(_mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount /proc")
    _send(sock, b"start %d" % os.stat("/proc/self/ns/pid").st_ino)
    with open(job.code, "rb", closefd=False) as src, open(MAIN, "xb") as dst:
      dst.write(src.read())
    os.chmod(MAIN, 0o666)  # as bubblewrap's --file leaves it
    os.chdir("/tmp")
    stdin = job.stdin if job.stdin is not None else os.open("/dev/null", os.O_RDONLY)
    os.setsid()
    for lim, soft, hard in ((resource.RLIMIT_AS, job.mem, job.mem), (resource.RLIMIT_CPU, job.cpu, job.cpu + 1),
                            (resource.RLIMIT_NPROC, job.nproc, job.nproc),
                            (resource.RLIMIT_FSIZE, job.fsize, job.fsize),
                            (resource.RLIMIT_NOFILE, job.nofile, job.nofile), (resource.RLIMIT_CORE, 0, 0)):
      resource.setrlimit(lim, (soft, hard))
    _drop_privileges(job.uid)
    for fd, target in ((stdin, 0), (job.stdout, 1), (job.stderr, 2)):
      os.dup2(fd, target)
    ctl = sock.fileno()
    os.closerange(3, ctl)
    os.closerange(ctl + 1, 1 << 30)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, _BOOT_SIGMASK)
    _arm_launch()
    os.close(sock.detach())  # detach: the socket object must not close a reused descriptor at exit
  except BaseException as e:  # pylint: disable=broad-except
    _fail(sock, "program", e)
  raise _Start


def _prepare_main():
  """Makes the interpreter state what the program would find at its first line, zygote imports gone."""
  main = type(sys)("__main__")
  main.__dict__.update({k: v for k, v in _BOOT_MAIN.items() if k not in ("__file__", "__cached__")},
                       __doc__=None, __annotations__={})
  for name in [n for n in sys.modules if n not in _BOOT_MODULES]:
    del sys.modules[name]
  sys.modules["__main__"] = main  # PyRun_SimpleFileEx runs the file in sys.modules['__main__']
  for key in [k for k in sys.path_importer_cache if k not in _BOOT_PATH_CACHE]:
    del sys.path_importer_cache[key]


class _Start(BaseException):
  """Raised out of this module in the program's process. The interpreter's uncaught-exception path calls
  `sys.excepthook` with no Python frame left on the stack; the hook is CPython's own `PyRun_SimpleFileEx`
  (a C function), so the program runs as the interpreter runs a script: its module frame has no caller, a
  SyntaxError or uncaught exception is printed by the interpreter, SystemExit ends the process as usual."""


class _Arg:
  """ctypes argument converters: the hook is called with (type, value, traceback), which they replace."""
  fp = hook = None

  @classmethod
  def from_param(cls, _):
    # Runs after the interpreter recorded our _Start in sys.last_*, right before the program starts.
    sys.excepthook = sys.__excepthook__
    for name in ("last_type", "last_value", "last_traceback"):
      if hasattr(sys, name):
        delattr(sys, name)
    _give_back_recursion_level()
    return ctypes.c_void_p(cls.fp)


class _Name:
  @classmethod
  def from_param(cls, _):
    return MAIN.encode()


class _CloseIt:
  @classmethod
  def from_param(cls, _):
    return 1


def _give_back_recursion_level():
  """Calling the hook counts one recursion level (3.11 counts C calls too); give it back, so a program hits
  RecursionError at the same depth as in a fresh interpreter. Only where the thread state is the known one."""
  if sys.version_info[:2] != (3, 11):
    return  # 3.12+ counts Python frames apart from C calls: nothing to give back
  ts = ctypes.pythonapi.PyThreadState_Get()
  remaining, limit = (ctypes.c_int * 5).from_address(ts + 3 * ctypes.sizeof(ctypes.c_void_p))[2:4]
  if limit == sys.getrecursionlimit() and 0 < remaining < limit:
    ctypes.c_int.from_address(ts + 3 * ctypes.sizeof(ctypes.c_void_p) + 8).value = remaining + 1


def _exit_code(rc, func, args):  # pylint: disable=unused-argument
  # PyRun_SimpleFileEx returned: the program ended without SystemExit (which exits inside it). Exit as
  # Py_RunMain would: 0, or 1 after an uncaught exception, 130 after an uncaught KeyboardInterrupt.
  interrupted = _UNHANDLED_KBI.value if _UNHANDLED_KBI is not None else sys.last_type is KeyboardInterrupt
  raise SystemExit(0 if rc == 0 else 130 if interrupted else 1)


def _arm_launch():
  _Arg.fp = _fopen(MAIN.encode(), b"rb")
  if not _Arg.fp:
    raise OSError(ctypes.get_errno(), f"fopen {MAIN}")
  ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
  hook = ctypes.PYFUNCTYPE(ctypes.c_int, _Arg, _Name, _CloseIt)(("PyRun_SimpleFileEx", ctypes.pythonapi))
  hook.errcheck = _exit_code
  _Arg.hook = hook  # sys.excepthook is the only other reference, and from_param replaces it mid-call
  # Every object alive now (the interpreter's start-up state, shared with the zygote page by page) goes to
  # the collector's permanent generation, as CPython's docs advise after a fork: its collections, the one
  # at exit included, then never walk them, and so never write to (copy) the pages they share. O(1): it
  # relinks three lists. A third of a call's CPU time before (10.1 -> 6.7 ms; `bench.sandbox`).
  gc.freeze()
  _prepare_main()
  sys.excepthook = hook


def _control_socket():
  for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
      if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
        return _socket.socket(fileno=fd)
    except OSError:
      pass  # the directory's own descriptor
  raise RuntimeError("no control socket was passed to the zygote")


def _main():
  global _CAP_LAST, _BOOT_SIGMASK, _UNHANDLED_KBI
  sock = _control_socket()
  try:
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
      _CAP_LAST = int(f.read())
    _own_user_namespace()
    # SIGUSR1 means "kill your program" to a keeper only; blocked until the keeper has its handler.
    _BOOT_SIGMASK = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGUSR1})
    try:
      _UNHANDLED_KBI = ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except ValueError:
      pass
    _serve(sock)  # raises _Start in a program's process
  except Exception as e:  # pylint: disable=broad-except
    _fail(sock, "zygote", e)


if __name__ == "__main__":
  _main()
