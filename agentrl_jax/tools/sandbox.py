"""Local executor for untrusted, model-written Python: a fresh interpreter per call under bubblewrap.

Each call gets new pid, network, ipc, uts (and, when possible, cgroup) namespaces and its own mount namespace: a
read-only view of /usr, the Python installation and a few /etc files; a private tmpfs /tmp (the working directory) and
/dev/shm; a fresh /proc showing only the sandbox's processes. bubblewrap and the child start with an EMPTY inherited
environment; the child sees only the constants in `CHILD_ENV` (nothing of the caller's). Inside, a tiny launcher sets
rlimits (address space, CPU seconds, processes, file size, open files, no core files) and, when we are root, drops to
a random unprivileged uid so RLIMIT_NPROC applies (the kernel does not enforce it for root), then execs the program as
pid 1 of the namespace. Where the host has a memory cgroup to use, the whole sandbox runs in one of its own, capped at
`memory_mb` (`sandbox_memory.py`). When pid 1 exits or is killed the kernel kills every other process of the
namespace, daemons included, and the tmpfs goes with the mount namespace: a call leaves no process and no file behind.
A wall-clock timeout SIGKILLs pid 1 (through a pidfd, so a reused pid is never hit) and bubblewrap; stdout/stderr are
read while the program runs, keeping a bounded head and tail.

    from agentrl_jax.tools import sandbox
    r = sandbox.run_python("print(sum(range(10)))", timeout_s=5, memory_mb=512)
    r.status, r.stdout   # ('ok', '45\\n')

`LocalExecutor` does this per call with `ToolConfig.local_mode='per_call'`. Its default, 'worker', keeps one
long-lived sandbox per slot whose pid 1 forks each program, with the same isolation made per program
(sandbox_worker.py): no bubblewrap and no interpreter start per call, 4-6x faster per call here
(`python -m agentrl_jax.bench.sandbox`). As root and as a normal user (the zygote then works in a user
namespace of its own); where no worker starts, the executor runs per call and logs why.

Requires bubblewrap (`apt-get install bubblewrap`; launch/setup.sh does it when root). Without it, calls return
`sandbox_error` unless `ToolConfig.allow_unsandboxed` is set, which runs programs with rlimits only and warns.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

from agentrl_jax.tools import sandbox_memory, sandbox_worker
from agentrl_jax.tools.base import ExecResult, PoolExecutor, ToolConfig, classify_exit, limit_result, with_note
from agentrl_jax.tools.sandbox_worker import MAIN

logger = logging.getLogger(__name__)

# The whole environment the program sees. Thread caps keep numpy/BLAS inside RLIMIT_NPROC and RLIMIT_AS.
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
WORKDIR = "/tmp"
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
# What a worker's zygote needs to make namespaces, mounts and uids per program; never held by program code.
_WORKER_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL")

# Runs inside the sandbox as `python -I -S -c _LAUNCHER uid as_bytes cpu_s nproc fsize nofile -- prog...`.
_LAUNCHER = """
import os, resource as R, sys
a = sys.argv
uid, mem, cpu, nproc, fsize, nofile = map(int, a[1:7])
for lim, soft, hard in ((R.RLIMIT_AS, mem, mem), (R.RLIMIT_CPU, cpu, cpu + 1), (R.RLIMIT_NPROC, nproc, nproc),
                        (R.RLIMIT_FSIZE, fsize, fsize), (R.RLIMIT_NOFILE, nofile, nofile), (R.RLIMIT_CORE, 0, 0)):
  R.setrlimit(lim, (soft, hard))
if uid >= 0:
  import ctypes
  os.setgroups([])
  os.setresgid(uid, uid, uid)
  os.setresuid(uid, uid, uid)
  # A uid change clears the parent-death signal bubblewrap set; re-arm it (PR_SET_PDEATHSIG, SIGKILL).
  ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
os.execv(a[8], a[8:])
"""


@functools.cache
def bwrap_path() -> str | None:
  """Absolute path of a usable `bwrap`, or None."""
  for path in (shutil.which("bwrap"), "/usr/bin/bwrap", "/usr/local/bin/bwrap"):
    if path and os.access(path, os.X_OK):
      return path
  return None


@functools.cache
def _bwrap_options(path: str) -> frozenset[str]:
  """Long options this bubblewrap build supports (older releases lack --size, --disable-userns...)."""
  try:
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, env={}, check=False)
  except (OSError, subprocess.SubprocessError):
    return frozenset()
  return frozenset(re.findall(r"(--[a-z0-9-]+)", out.stdout + out.stderr))


def _python_roots(python: str) -> list[str]:
  """Directories to mount read-only so `python` and its packages (virtualenv included) work inside."""
  roots = []
  prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
  cfg = os.path.join(prefix, "pyvenv.cfg")
  if os.path.isfile(cfg):  # a virtualenv: its own dir (as named) plus the base installation it points to
    roots.append(prefix)
    with open(cfg, encoding="utf-8", errors="replace") as f:
      for line in f:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
          roots.append(os.path.dirname(os.path.realpath(value.strip())))
  roots.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
  # /usr is mounted anyway; nested roots are covered by their parent.
  out: list[str] = []
  for r in sorted(set(roots)):
    if r in ("", "/", "/usr") or r.startswith("/usr/") or any(r.startswith(o + "/") for o in out):
      continue
    out.append(r)
  return out


@dataclasses.dataclass(frozen=True)
class _Plan:
  """How this process runs programs: the command prefix before the launcher's arguments."""

  mode: str  # 'bwrap-root' | 'bwrap-userns' | 'unsandboxed'
  prefix: tuple[str, ...]
  python: str
  bwrap_options: frozenset[str] = frozenset()
  worker_prefix: tuple[str, ...] = ()  # a worker sandbox (sandbox_worker.py); () where there can be none


def _plan(cfg: ToolConfig) -> _Plan | str:
  """Builds the command plan for `cfg`, or returns the reason no sandbox is possible."""
  python = cfg.python or sys.executable
  if not os.access(python, os.X_OK):
    return f"the sandbox interpreter {python!r} is not executable (ToolConfig.python)"
  bwrap = bwrap_path()
  if bwrap is None:
    if cfg.allow_unsandboxed:
      return _Plan("unsandboxed", (), python)
    return ("bubblewrap (bwrap) is not installed, so model code cannot be isolated. Install it with "
            "'sudo apt-get install bubblewrap' (launch/setup.sh does this when run as root), or set "
            "ToolConfig.allow_unsandboxed=True to run code WITHOUT isolation (only on a throwaway machine).")
  opts = _bwrap_options(bwrap)
  root = os.geteuid() == 0
  args = [bwrap, "--ro-bind", "/usr", "/usr"]
  for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(name):
      args += ["--symlink", os.readlink(name), name]
    elif os.path.isdir(name):
      args += ["--ro-bind", name, name]
  for name in _ETC_FILES:
    if os.path.exists(name):
      args += ["--ro-bind", name, name]
  size = ["--size", str(cfg.max_file_mb << 20)] if "--size" in opts else []
  args += ["--proc", "/proc", "--dev", "/dev"]
  args += ["--perms", "1777", *size, "--tmpfs", WORKDIR, "--perms", "1777", *size, "--tmpfs", "/dev/shm"]
  # The interpreter's directories are bound after the tmpfs mounts, so a virtualenv that lives under /tmp
  # (a CI checkout, say) stays visible, read-only, inside the private /tmp.
  made = set()
  for r in _python_roots(python):
    # bubblewrap creates missing parents 0700, which the dropped uid could not traverse.
    parts = r.strip("/").split("/")
    for i in range(1, len(parts)):
      d = "/" + "/".join(parts[:i])
      if d not in made and d not in (WORKDIR, "/dev/shm") and not d.startswith(("/usr", "/etc", "/proc", "/dev/")):
        made.add(d)
        args += ["--perms", "0755", "--dir", d]
    args += ["--ro-bind", r, r]
  # The sandbox's root is bubblewrap's own tmpfs, owned by the program's uid where bubblewrap runs without root:
  # read-only, or a program could fill the host's memory with files (each below RLIMIT_FSIZE) outside the
  # size-limited /tmp and /dev/shm.
  args += ["--remount-ro", "/"]
  args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--hostname", "sandbox", "--die-with-parent", "--new-session", "--as-pid-1", "--chdir", WORKDIR,
           "--clearenv"]
  for key, value in CHILD_ENV.items():
    args += ["--setenv", key, value]
  if root:
    # A worker outlives the call that started it, and --die-with-parent would tie it to that *thread*
    # (PR_SET_PDEATHSIG is per thread); it lives as long as its control socket instead.
    worker = [a for a in args if a != "--die-with-parent"] + ["--cap-drop", "ALL"]
    worker += [a for cap in _WORKER_CAPS for a in ("--cap-add", cap)]
    # As root bubblewrap keeps every capability unless told; keep only what the launcher needs to drop uid.
    args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return _Plan("bwrap-root", tuple(args), python, opts, tuple(worker))
  args += ["--unshare-user"]
  # A worker's zygote makes a user namespace of its own and then closes that door to its programs itself
  # (sandbox_zygote.py); a per-call program has bubblewrap close it.
  worker = [a for a in args if a != "--die-with-parent"]
  args += ["--disable-userns"] if "--disable-userns" in opts else []
  return _Plan("bwrap-userns", tuple(args), python, opts, tuple(worker))


def run_python(code: str, *, timeout_s: float, memory_mb: int, stdin: str = "", cfg: ToolConfig | None = None,
               on_start: Callable[[dict], None] | None = None) -> ExecResult:
  """Runs `code` as a Python program in a fresh sandbox and waits for it.

  Args:
    code: program text (run as a file, so tracebacks show source lines).
    timeout_s: wall-clock limit; the CPU-time rlimit is the same number of seconds (rounded up).
    memory_mb: address-space limit of each process.
    stdin: text fed to the program's standard input (empty: it reads EOF at once).
    cfg: other limits and the interpreter; `timeout_s` / `memory_mb` above take precedence.
    on_start: called with bubblewrap's status record (`child-pid`, `pid-namespace`...) once the sandbox is up;
      for monitoring and tests.

  Returns:
    The `ExecResult`; never raises for anything the program does.
  """
  if not isinstance(code, str) or not isinstance(stdin, str):
    return ExecResult("error", stderr=f"code and stdin must be str, got {type(code).__name__} and "
                      f"{type(stdin).__name__}")
  cfg = dataclasses.replace(cfg or ToolConfig(), timeout_s=timeout_s, memory_mb=memory_mb)
  plan = _plan(cfg)
  if isinstance(plan, str):
    return ExecResult("sandbox_error", stderr=f"[sandbox] {plan}")
  if plan.mode == "unsandboxed":
    _warn_unsandboxed()
  return _run(plan, cfg, code, stdin, on_start)


def _memory_group(plan: _Plan, cfg: ToolConfig) -> sandbox_memory.Cgroup | None:
  """A cgroup capping the whole sandbox at `cfg.memory_mb` (None where cgroups are not available)."""
  base = sandbox_memory.cgroup_base()
  if plan.mode == "unsandboxed" or isinstance(base, str):
    return None
  try:
    return base.create(cfg.memory_mb << 20)
  except OSError as e:
    logger.warning("sandbox: no memory cgroup for this call (%s); the limit is per process only", e)
    return None


def _run(plan: _Plan, cfg: ToolConfig, code: str, stdin: str, on_start: Callable[[dict], None] | None) -> ExecResult:
  group = _memory_group(plan, cfg)
  try:
    result = _run_in(plan, cfg, code, stdin, on_start, group)
    return sandbox_memory.after_oom(result, group.oom_kills(), cfg.memory_mb << 20) if group else result
  finally:
    if group is not None:
      group.remove()


def _run_in(plan: _Plan, cfg: ToolConfig, code: str, stdin: str, on_start: Callable[[dict], None] | None,
            group: sandbox_memory.Cgroup | None) -> ExecResult:
  start = time.monotonic()
  deadline = start + cfg.timeout_s
  uid = sandbox_worker.random_uid() if plan.mode == "bwrap-root" else -1
  limits = [str(x) for x in (uid, *sandbox_worker.limits(cfg))]
  # Lone surrogates cannot be UTF-8; passing them through makes the interpreter report a clear decode error.
  code_bytes = code.encode("utf-8", errors="surrogatepass")
  fds: list[int] = []
  tmpdir = None
  try:
    stdin_fd = subprocess.DEVNULL
    if stdin:
      stdin_fd = sandbox_worker.memfd("stdin", stdin.encode("utf-8", errors="surrogatepass"))
      fds.append(stdin_fd)
    status_r = status_w = -1
    if plan.mode == "unsandboxed":
      tmpdir = tempfile.mkdtemp(prefix="agentrl_unsandboxed_")
      main = os.path.join(tmpdir, "main.py")
      with open(main, "wb") as f:
        f.write(code_bytes)
      cmd = [plan.python, "-I", "-S", "-c", _LAUNCHER, *limits, "--", plan.python, "-I", "-B", "-u", main]
      popen_kw = {"cwd": tmpdir, "env": dict(CHILD_ENV, TMPDIR=tmpdir, HOME=tmpdir), "pass_fds": ()}
    else:
      code_fd = sandbox_worker.memfd("main.py", code_bytes)
      fds.append(code_fd)
      status_r, status_w = os.pipe()
      fds += [status_r, status_w]
      cmd = [*plan.prefix, "--file", str(code_fd), MAIN, "--json-status-fd", str(status_w), "--",
             plan.python, "-I", "-S", "-c", _LAUNCHER, *limits, "--", plan.python, "-I", "-B", "-u", MAIN]
      popen_kw = {"env": {}, "pass_fds": (code_fd, status_w)}
      if group is not None:
        cmd = group.wrap(cmd)
    try:
      proc = subprocess.Popen(cmd, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True, close_fds=True, **popen_kw)
    except OSError as e:
      return ExecResult("sandbox_error", stderr=f"[sandbox] could not start: {e}", wall_s=time.monotonic() - start)
    if status_w >= 0:
      os.close(status_w)
      fds.remove(status_w)
    watch = sandbox_memory.Watch(cfg.memory_mb << 20) if group is None else None
    return _supervise(proc, cfg, status_r, deadline, start, on_start, watch)
  finally:
    for fd in fds:
      try:
        os.close(fd)
      except OSError:
        pass
    if tmpdir is not None:
      shutil.rmtree(tmpdir, ignore_errors=True)


def _supervise(proc: subprocess.Popen, cfg: ToolConfig, status_r: int, deadline: float, start: float,
               on_start: Callable[[dict], None] | None, watch: sandbox_memory.Watch | None = None) -> ExecResult:
  """Reads output and status until the program ends, the deadline passes, the output limit is hit or (without a
  memory cgroup) `watch` finds the sandbox over its memory cap."""
  out, err = sandbox_worker.Capture(cfg.max_output_bytes), sandbox_worker.Capture(cfg.max_output_bytes)
  status_buf, records = b"", []
  pidfd, timed_out, too_much, too_big = None, False, False, False
  root_pid = proc.pid if status_r < 0 else None  # unsandboxed: the launcher; else bubblewrap's child, once known
  sel = selectors.DefaultSelector()
  sel.register(proc.stdout, selectors.EVENT_READ, out)
  sel.register(proc.stderr, selectors.EVENT_READ, err)
  if status_r >= 0:
    sel.register(status_r, selectors.EVENT_READ, "status")
  try:
    while sel.get_map():
      left = deadline - time.monotonic()
      if left <= 0:
        timed_out = True
        break
      for key, _ in sel.select(timeout=min(left, 1.0 if watch is None else watch.interval_s)):
        data = os.read(key.fd, sandbox_worker.READ_CHUNK)
        if not data:
          sel.unregister(key.fileobj)
        elif key.data == "status":
          status_buf += data
          status_buf, new = sandbox_worker.parse_status(status_buf)
          for rec in new:
            records.append(rec)
            if "child-pid" in rec and pidfd is None:
              root_pid = rec["child-pid"]
              try:
                pidfd = os.pidfd_open(rec["child-pid"])
              except OSError:
                pass
              if on_start is not None:
                on_start(rec)
        else:
          key.data.add(data)
      if out.total + err.total > cfg.output_limit_bytes:
        too_much = True
        break
      if watch is not None and watch.over(root_pid, time.monotonic()):
        too_big = True
        break
    if timed_out or too_much or too_big:
      sandbox_worker.terminate(proc, pidfd)
    try:
      proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
    except subprocess.TimeoutExpired:
      timed_out = True
      sandbox_worker.terminate(proc, pidfd)
      proc.wait()
  finally:
    sel.close()
    proc.stdout.close()
    proc.stderr.close()
    if pidfd is not None:
      os.close(pidfd)
  wall = time.monotonic() - start
  stdout, stderr = out.text(), err.text()
  limited = limit_result(cfg, stdout, stderr, wall, timed_out=timed_out, too_much=too_much)
  if limited is not None:
    return limited
  if too_big:
    return sandbox_memory.over_result(ExecResult("memory", stdout, stderr, None, wall), watch)
  if status_r < 0:  # unsandboxed: the interpreter's own exit status
    exit_code = proc.returncode
  else:
    exits = [r["exit-code"] for r in records if "exit-code" in r]
    if not exits:  # bubblewrap failed before the program ran (bad mount, no namespaces...)
      return ExecResult("sandbox_error", stdout, with_note(stderr.strip(), f"bubblewrap failed (exit "
                                                           f"{proc.returncode}); the program did not run"), None, wall)
    exit_code = exits[-1]
  status, exit_code, stderr = classify_exit(exit_code, stderr)
  return ExecResult(status, stdout, stderr, exit_code, wall)


_warned = False


def _warn_unsandboxed() -> None:
  global _warned
  if not _warned:
    _warned = True
    msg = ("agentrl_jax.tools.sandbox: bubblewrap is missing and ToolConfig.allow_unsandboxed=True: model-written "
           "code runs WITHOUT isolation (rlimits and a temp dir only). It can read your files, use the network "
           "and leave processes behind. Install bubblewrap ('apt-get install bubblewrap').")
    logger.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


@functools.cache
def _probe(cfg: ToolConfig) -> str | None:
  """Runs a trivial program once per config; returns why the sandbox does not work, or None."""
  r = run_python("print(6 * 7)", timeout_s=max(cfg.timeout_s, 30.0), memory_mb=max(cfg.memory_mb, 256), cfg=cfg)
  if r.status == "ok" and r.stdout == "42\n":
    return None
  return f"status={r.status} exit={r.exit_code} stdout={r.stdout[:200]!r} stderr={r.stderr[-1500:]!r}"


class LocalExecutor(PoolExecutor):
  """`Executor` running each program in its own sandbox, `cfg.concurrency` at a time.

  `cfg.local_mode='worker'` (default): one worker sandbox per slot forks each program (sandbox_worker.py); when
  that is not possible here (no bubblewrap, or a worker does not start), it logs why and runs per call instead.
  `local_mode` says which is in use: 'worker' or 'per_call'; `worker_unavailable` why worker mode is off.
  """

  def __init__(self, cfg: ToolConfig):
    plan = _plan(cfg)
    if isinstance(plan, str):
      raise RuntimeError(f"local code executor: {plan}")
    if plan.mode == "unsandboxed":
      _warn_unsandboxed()
    super().__init__(self._run_call, cfg.concurrency, "sandbox")
    self.cfg, self.mode, self._plan = cfg, plan.mode, plan
    self._workers: sandbox_worker.WorkerPool | None = None
    self._warned_worker = False
    # Why worker mode is off when it was asked for (None when it runs, or when per-call mode was asked for).
    self.worker_unavailable: str | None = None
    if cfg.local_mode == "worker":
      why = self.worker_unavailable = self._start_workers()
      if why is not None:  # info when expected (no bubblewrap), a warning when a worker failed
        logger.log(logging.INFO if not self._plan.worker_prefix else logging.WARNING,
                   "local code executor: %s; running one sandbox per call instead", why)
    self.local_mode = "worker" if self._workers is not None else "per_call"
    if self._workers is None:
      problem = _probe(cfg)
      if problem is not None:
        self._pool.shutdown()
        raise RuntimeError(f"local code executor ({plan.mode}): a trivial program failed in the sandbox; "
                           "bubblewrap may lack permission to create namespaces here (containers often forbid it; "
                           f"run as root or enable unprivileged user namespaces). Details: {problem}")

  def _start_workers(self) -> str | None:
    """Starts the worker pool with a trivial program; returns why worker mode is unavailable, or None."""
    if not self._plan.worker_prefix:
      return f"worker mode needs bubblewrap (the sandbox runs in {self._plan.mode} mode here)"
    # Each program's private /tmp covers these; the zygote binds them back (per-call sandboxes bind them on top).
    hidden = [r for r in _python_roots(self._plan.python) if r.startswith((WORKDIR + "/", "/dev/shm/"))]
    if WORKDIR in _python_roots(self._plan.python):
      return f"the sandbox interpreter lives in {WORKDIR} itself, which each program's private {WORKDIR} replaces"
    memory = sandbox_memory.cgroup_base()
    workers = sandbox_worker.WorkerPool(self._plan.worker_prefix, self._plan.python, self.cfg, self.cfg.concurrency,
                                        root=self._plan.mode == "bwrap-root", roots=hidden,
                                        memory=None if isinstance(memory, str) else memory)
    probe_cfg = dataclasses.replace(self.cfg, timeout_s=max(self.cfg.timeout_s, 30.0),
                                    memory_mb=max(self.cfg.memory_mb, 256))
    try:
      r = workers.run("print(6 * 7)", cfg=probe_cfg)
    except sandbox_worker.WorkerError as e:
      workers.close()
      return f"the sandbox worker did not start ({e})"
    if r.status != "ok" or r.stdout != "42\n":
      workers.close()
      return (f"a trivial program failed in a sandbox worker (status={r.status} exit={r.exit_code} "
              f"stdout={r.stdout[:200]!r} stderr={r.stderr[-1500:]!r})")
    self._workers = workers
    return None

  def _run_call(self, code: str, stdin: str, on_start: Callable[[dict], None] | None = None,
                output_limit_bytes: int | None = None) -> ExecResult:
    cfg = self.cfg if output_limit_bytes is None else dataclasses.replace(
        self.cfg, max_output_bytes=output_limit_bytes, output_limit_bytes=output_limit_bytes)
    if self._workers is not None:
      try:
        return self._workers.run(code, stdin, cfg=cfg, on_start=on_start)
      except sandbox_worker.WorkerError as e:
        if not self._warned_worker:
          self._warned_worker = True
          logger.warning("local code executor: a sandbox worker did not start (%s); running this call (and "
                         "others that hit this) in a sandbox of its own", e)
    return _run(self._plan, cfg, code, stdin, on_start)

  def run(self, code: str, *, stdin: str = "", on_start: Callable[[dict], None] | None = None) -> ExecResult:
    """Runs one program on a pool thread and waits for it.

    Args:
      code: program text.
      stdin: its standard input.
      on_start: called with the sandbox's start record once the program's sandbox is up; it always has
        `pid-namespace` (the inode of the program's pid namespace). For monitoring and tests.

    Returns:
      The `ExecResult`, as `submit(...).result()` would.
    """
    with self._lock:
      if self._closed:
        raise RuntimeError("executor is closed")
      future = self._pool.submit(self._guarded, code, stdin, on_start=on_start)
    return future.result()

  def zygote_pids(self) -> list[int]:
    """Host pids of the idle worker sandboxes' pid 1 (monitoring and tests); [] in per-call mode."""
    return self._workers.zygote_pids() if self._workers is not None else []

  def close(self) -> None:
    """Waits for running programs, then ends every worker sandbox; idempotent."""
    super().close()
    if self._workers is not None:
      self._workers.close()
