"""Worker mode of the local sandbox: per executor slot one long-lived bubblewrap sandbox whose pid 1 is a fork
server (`sandbox_zygote.py`), which forks a fresh, isolated, unprivileged process per program.

Why: a new bubblewrap sandbox plus a new interpreter per call cost ~85 ms here; a fork costs a few. Each program
is isolated as in per-call mode (sandbox.py), the zygote re-creating per program what bubblewrap gave per call:
new mount, pid and ipc namespaces; a private, size-limited tmpfs /tmp and /dev/shm and its own /proc; pid 1 of
its pid namespace, so nothing it starts outlives it; the rlimits, a random uid with no capabilities at all, the
parent-death signal, CHILD_ENV only. Shared by the programs of one worker, one after the other: its network
(none), uts namespace and read-only mounts, and, being forks of one interpreter, its hash seed and address layout.

Supervision stays on the host as in per-call mode: the host creates the output pipes and the code/stdin memfds,
passes them over a unix socket (SCM_RIGHTS), reads a bounded head and tail while the program runs, and on a
wall-clock timeout or the output limit tells the zygote to kill. A worker that dies or stops answering is
killed and replaced; a call it had not started yet (gone, or hung for the call's whole timeout) is retried once
on a fresh worker, one it had returns `sandbox_error` (or `timeout`), which the executor keeps only if a probe
program fails too (`base.PoolExecutor`). Nothing here raises for anything a program does.

This module also holds the process helpers both modes use (`Capture`, `memfd`, `terminate`, `parse_status`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import select
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

from agentrl_jax.tools import sandbox_memory
from agentrl_jax.tools.base import ExecResult, ToolConfig, classify_exit, limit_result, with_note

logger = logging.getLogger(__name__)

MAIN = "/tmp/main.py"
READ_CHUNK = 65536
# Root mode runs each call as a random uid in [base, base + span): never a real account, and distinct per call
# so RLIMIT_NPROC (counted per uid) of concurrent calls does not add up.
UID_BASE, UID_SPAN = 1_700_000_000, 1 << 24
_START_TIMEOUT_S = 30.0  # bubblewrap + interpreter start-up, generous for a loaded machine
_START_MEMORY = 256 << 20  # a worker's cap while its zygote starts (then: the zygote's own + the program's)
_KILL_GRACE_S = 5.0  # a killed program's namespace is gone long before this, or the worker is broken
_ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_zygote.py")


class Capture:
  """Keeps the first and last `cap // 2` bytes of a stream and counts the rest."""

  def __init__(self, cap: int):
    self.head_cap, self.tail_cap = cap // 2, cap - cap // 2
    self.head, self.tail = bytearray(), bytearray()
    self.total = 0

  def add(self, data: bytes) -> None:
    self.total += len(data)
    room = self.head_cap - len(self.head)
    if room > 0:
      self.head += data[:room]
      data = data[room:]
    if data:
      self.tail += data
      if len(self.tail) > 2 * self.tail_cap:  # trim in batches: amortised O(1) per byte
        del self.tail[:len(self.tail) - self.tail_cap]

  def text(self) -> str:
    tail = self.tail[-self.tail_cap:] if self.tail_cap else b""
    dropped = self.total - len(self.head) - len(tail)
    mid = f"\n[... {dropped} bytes omitted ...]\n".encode() if dropped > 0 else b""
    return bytes(self.head + mid + tail).decode("utf-8", errors="replace")


def memfd(name: str, data: bytes) -> int:
  """An anonymous in-memory file holding `data`, positioned at its start (code or stdin for a program)."""
  fd = os.memfd_create(name, 0)  # no MFD_CLOEXEC: the fd is handed to bubblewrap / the child
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


def terminate(proc: subprocess.Popen, pidfd: int | None) -> None:
  """SIGKILLs the sandbox's pid 1 and waits until none of its processes remain."""
  if pidfd is not None:
    try:
      signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
      pass
    # The namespace's init finishes exiting (its pidfd turns readable) only after every other process of the
    # namespace is gone; bubblewrap then reaps it and exits. Wait for both rather than kill bubblewrap.
    select.select([pidfd], [], [], 5.0)
    try:
      proc.wait(timeout=5.0)
      return
    except subprocess.TimeoutExpired:
      pass
  if proc.poll() is None:
    try:
      os.killpg(proc.pid, signal.SIGKILL)  # --die-with-parent then takes the namespace down
    except OSError:
      pass
    try:
      proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      logger.error("bubblewrap (pid %d) did not exit after SIGKILL", proc.pid)


def parse_status(buf: bytes) -> tuple[bytes, list[dict]]:
  """Splits complete JSON documents off bubblewrap's status stream."""
  text = buf.decode("utf-8", errors="replace")
  dec, pos, out = json.JSONDecoder(), 0, []
  while True:
    while pos < len(text) and text[pos].isspace():
      pos += 1
    try:
      obj, end = dec.raw_decode(text, pos)
    except ValueError:
      break
    if isinstance(obj, dict):
      out.append(obj)
    pos = end
  return text[pos:].encode(), out


def limits(cfg: ToolConfig) -> list[int]:
  """[address space, CPU seconds, processes, file size, open files] of one program."""
  return [cfg.memory_mb << 20, max(1, int(-(-cfg.timeout_s // 1))), cfg.max_processes, cfg.max_file_mb << 20,
          cfg.max_open_files]


def random_uid() -> int:
  """A uid for one program (root mode): unprivileged, no real account's."""
  return UID_BASE + random.randrange(UID_SPAN)


class WorkerError(RuntimeError):
  """No worker sandbox could be started (the message says why)."""


@dataclasses.dataclass
class _Call:
  """What one call has seen so far."""

  out: Capture
  err: Capture
  started: bool = False
  exit_code: int | None = None
  error: str | None = None
  lost: bool = False  # the zygote hung up


class _Worker:
  """One worker sandbox and its control socket; one program at a time."""

  def __init__(self, prefix: tuple[str, ...], python: str, memory: sandbox_memory.Base | None = None):
    self.proc: subprocess.Popen | None = None
    self.pidfd: int | None = None
    self.zygote_pid: int | None = None  # host pid of the zygote (bubblewrap's child)
    self.healthy = True
    # The whole worker's cgroup: its program's cap plus what the idle zygote holds (`baseline`).
    self.group = memory.create(_START_MEMORY) if memory is not None else None
    self.baseline = 0
    self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.status_r, status_w = os.pipe()
    with open(_ZYGOTE, "rb") as f:
      src_fd = memfd("zygote", f.read())
    try:
      cmd = [*prefix, "--file", str(src_fd), MAIN, "--json-status-fd", str(status_w), "--", python, "-I", "-B", "-u",
             MAIN]
      if self.group is not None:
        cmd = self.group.wrap(cmd)
      self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env={}, pass_fds=(src_fd, status_w, child.fileno()), start_new_session=True)
    except OSError as e:
      self.kill()
      raise WorkerError(f"could not start bubblewrap: {e}") from e
    finally:
      for fd in (src_fd, status_w):
        os.close(fd)
      child.close()
    try:
      self._handshake()
      if self.group is not None:
        self.baseline = self.group.usage()
    except BaseException:
      self.kill()
      raise

  def _handshake(self) -> None:
    """Waits for the zygote's `ready` and bubblewrap's record of its pid."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    status_buf, output, ready = b"", bytearray(), False
    sel = selectors.DefaultSelector()
    sel.register(self.sock, selectors.EVENT_READ, "ctl")
    sel.register(self.status_r, selectors.EVENT_READ, "status")
    sel.register(self.proc.stdout, selectors.EVENT_READ, "output")
    try:
      while not (ready and self.pidfd is not None):
        left = deadline - time.monotonic()
        if left <= 0:
          raise WorkerError(f"the zygote did not start within {_START_TIMEOUT_S:g} s; "
                            f"output: {bytes(output)[-2000:]!r}")
        for key, _ in sel.select(left):
          if key.data == "ctl":
            msg = self.sock.recv(4096)
            if msg != b"ready":
              os.set_blocking(self.proc.stdout.fileno(), False)
              try:  # bubblewrap's or the interpreter's last words, if any
                while data := os.read(self.proc.stdout.fileno(), READ_CHUNK):
                  output += data
              except BlockingIOError:
                pass
              raise WorkerError(f"the zygote failed: {msg.decode('utf-8', 'replace') or 'it exited'}; "
                                f"output: {bytes(output)[-2000:].decode('utf-8', 'replace')!r}")
            ready = True
          elif key.data == "status":
            data = os.read(self.status_r, READ_CHUNK)
            if not data:
              sel.unregister(self.status_r)
              continue
            status_buf, records = parse_status(status_buf + data)
            for rec in records:
              if "child-pid" in rec and self.pidfd is None:
                self.zygote_pid = rec["child-pid"]
                self.pidfd = os.pidfd_open(self.zygote_pid)
          else:
            data = os.read(self.proc.stdout.fileno(), READ_CHUNK)
            if data:
              output += data
            else:
              sel.unregister(self.proc.stdout)
    finally:
      sel.close()
    self.proc.stdout.close()  # a healthy zygote writes nothing; after this a write would just fail (EPIPE)

  def alive(self) -> bool:
    return self.healthy and self.proc is not None and self.proc.poll() is None

  def kill(self) -> None:
    """Ends the worker and every process in it; idempotent."""
    self.healthy = False
    self.sock.close()  # on its own enough to make a healthy zygote exit
    if self.proc is not None:
      terminate(self.proc, self.pidfd)
      if self.proc.stdout is not None:
        self.proc.stdout.close()
    for fd in (self.status_r, self.pidfd):
      if fd is not None:
        try:
          os.close(fd)
        except OSError:
          pass
    self.status_r = self.pidfd = None
    if self.group is not None:
      self.group.remove()
      self.group = None

  def run(self, code: bytes, stdin: bytes, job: bytes, cfg: ToolConfig, start: float, deadline: float,
          on_start: Callable[[dict], None] | None) -> ExecResult | None:
    """Runs one program; None when the worker was dead before the program started (retry elsewhere)."""
    if not self.alive():
      self.healthy = False
      return None
    kills = 0
    if self.group is not None:
      try:
        self.group.set_limit(self.baseline + (cfg.memory_mb << 20))
        kills = self.group.oom_kills()
      except OSError as e:
        logger.warning("sandbox worker: memory cap not set (%s)", e)
    result = self._run(code, stdin, job, cfg, start, deadline, on_start)
    if result is not None and self.group is not None:
      result = sandbox_memory.after_oom(result, self.group.oom_kills() - kills, cfg.memory_mb << 20)
    return result

  def _run(self, code: bytes, stdin: bytes, job: bytes, cfg: ToolConfig, start: float, deadline: float,
           on_start: Callable[[dict], None] | None) -> ExecResult | None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
      fds = [out_w, err_w]
      try:
        fds.insert(0, memfd("main.py", code))
        if stdin:
          fds.append(memfd("stdin", stdin))
        socket.send_fds(self.sock, [job], fds, socket.MSG_NOSIGNAL)  # a dead peer: EPIPE, not SIGPIPE
      except OSError:
        self.healthy = False
        return None
      finally:
        for fd in fds:
          os.close(fd)  # the zygote holds its own copies now: EOF comes when the program's processes are gone
      call = _Call(Capture(cfg.max_output_bytes), Capture(cfg.max_output_bytes))
      watch = sandbox_memory.Watch(cfg.memory_mb << 20) if self.group is None else None
      timed_out, too_much, too_big = self._supervise(call, out_r, err_r, cfg, deadline, on_start, watch)
    finally:
      os.close(out_r)
      os.close(err_r)
    wall = time.monotonic() - start
    stdout, stderr = call.out.text(), call.err.text()
    if timed_out and not call.started:
      self.healthy = False
      logger.warning("a sandbox worker did not start a program in %g s; it is replaced", cfg.timeout_s)
      return None  # the program never ran: the pool runs it on a fresh worker
    limited = limit_result(cfg, stdout, stderr, wall, timed_out=timed_out, too_much=too_much)
    if limited is not None:
      return limited
    if too_big:
      return sandbox_memory.over_result(ExecResult("memory", stdout, stderr, None, wall), watch)
    if call.error is not None:
      self.healthy = False  # its `exit` is still to come: do not reuse the socket
      return ExecResult("sandbox_error", stdout, with_note(stderr, f"the sandbox could not run the program: "
                                                           f"{call.error}"), None, wall)
    if call.lost:
      self.healthy = False
      if not call.started:
        return None
      return ExecResult("sandbox_error", stdout, with_note(stderr, "the sandbox worker died while the program ran"),
                        None, wall)
    status, exit_code, stderr = classify_exit(call.exit_code, stderr)
    return ExecResult(status, stdout, stderr, exit_code, wall)

  def _supervise(self, call: _Call, out_r: int, err_r: int, cfg: ToolConfig, deadline: float,
                 on_start: Callable[[dict], None] | None,
                 watch: sandbox_memory.Watch | None = None) -> tuple[bool, bool, bool]:
    """Reads output and control messages until the program ends, the deadline passes, the output limit is hit
    or (without a memory cgroup) `watch` finds the program's processes over the cap; then kills or drains.
    Returns (timed_out, too_much, too_big)."""
    timed_out = too_much = too_big = False
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, call.out)
    sel.register(err_r, selectors.EVENT_READ, call.err)
    sel.register(self.sock, selectors.EVENT_READ, None)
    try:
      while call.exit_code is None and call.error is None and not call.lost:
        left = deadline - time.monotonic()
        if left <= 0:
          timed_out = True
          break
        for key, _ in sel.select(timeout=min(left, 1.0 if watch is None else watch.interval_s)):
          if key.data is None:
            self._on_message(call, on_start)
            continue
          data = os.read(key.fd, READ_CHUNK)
          if data:
            key.data.add(data)
          else:
            sel.unregister(key.fd)
        if call.out.total + call.err.total > cfg.output_limit_bytes:
          too_much = True
          break
        # The zygote's children are the keepers: their trees are the program's processes (and a keeper each).
        if watch is not None and watch.over(self.zygote_pid, time.monotonic(), include_root=False):
          too_big = True
          break
    finally:
      sel.close()
    if timed_out or too_much or too_big:
      self._kill_program(call)
      return timed_out, too_much, too_big
    if call.exit_code is not None:
      # Every writer is gone by now (the zygote reports after the last process of the namespace): the rest of
      # the output is in the pipes. Non-blocking, should a descriptor have leaked somewhere.
      for fd, cap in ((out_r, call.out), (err_r, call.err)):
        os.set_blocking(fd, False)
        try:
          while data := os.read(fd, READ_CHUNK):
            cap.add(data)
        except BlockingIOError:
          pass
      too_much = call.out.total + call.err.total > cfg.output_limit_bytes
    return False, too_much, False

  def _on_message(self, call: _Call, on_start: Callable[[dict], None] | None) -> None:
    try:
      msg = self.sock.recv(4096)
    except OSError:
      msg = b""
    if not msg:
      call.lost = True
    elif msg.startswith(b"start "):
      call.started = True
      if on_start is not None:
        on_start({"pid-namespace": int(msg.split()[1])})
    elif msg.startswith(b"exit "):
      call.exit_code = int(msg.split()[1])
    elif msg.startswith(b"error "):
      call.error = msg[6:].decode("utf-8", "replace")

  def _kill_program(self, call: _Call) -> None:
    """Has the zygote kill the running program; the worker is marked broken unless it confirms in time."""
    try:
      self.sock.send(b"kill", socket.MSG_NOSIGNAL)
    except OSError:
      self.healthy = False
      return
    deadline = time.monotonic() + _KILL_GRACE_S
    with selectors.DefaultSelector() as sel:
      sel.register(self.sock, selectors.EVENT_READ)
      while (left := deadline - time.monotonic()) > 0:
        if not sel.select(left):
          continue
        try:
          msg = self.sock.recv(4096)
        except OSError:
          msg = b""
        if not msg or msg.startswith(b"error "):
          break
        call.started |= msg.startswith(b"start ")
        if msg.startswith(b"exit "):
          return
    self.healthy = False


class WorkerPool:
  """Up to `size` workers, started on demand; each runs one program at a time. A worker lives until it is
  killed or its control socket closes (this process exits): its zygote then exits, and the kernel takes
  every process of its namespaces with it."""

  def __init__(self, prefix: tuple[str, ...], python: str, cfg: ToolConfig, size: int, *, root: bool = True,
               roots: list[str] | tuple[str, ...] = (), memory: sandbox_memory.Base | None = None):
    """`root`: programs run as random uids (else as the user's own); `roots`: the interpreter's directories
    under /tmp or /dev/shm, bound back over each program's private tmpfs; `memory`: where each worker's
    memory cgroup goes (None: the cap is per process only)."""
    self._prefix, self._python, self.cfg, self._size = prefix, python, cfg, size
    self._root, self._roots, self._memory = root, tuple(roots), memory
    self._idle: list[_Worker] = []
    self._count = 0
    self._cv = threading.Condition()
    self._closed = False

  def run(self, code: str, stdin: str = "", *, cfg: ToolConfig | None = None,
          on_start: Callable[[dict], None] | None = None) -> ExecResult:
    """Runs `code` on a worker and waits; `cfg` overrides the pool's limits for this call.

    Raises:
      WorkerError: no worker could be started (the caller may run the program another way).
    """
    cfg = cfg or self.cfg
    start = time.monotonic()
    # Lone surrogates cannot be UTF-8; passing them through makes the interpreter report a clear decode error.
    code_b = code.encode("utf-8", errors="surrogatepass")
    stdin_b = stdin.encode("utf-8", errors="surrogatepass")
    tmpfs = cfg.max_file_mb << 20
    for _ in range(2):
      uid = random_uid() if self._root else -1
      job = b"\0".join([" ".join(map(str, ["run", uid, *limits(cfg), tmpfs])).encode(),
                         *(os.fsencode(r) for r in self._roots)])
      worker = self._acquire()
      try:
        result = worker.run(code_b, stdin_b, job, cfg, start, time.monotonic() + cfg.timeout_s, on_start)
      finally:
        self._release(worker)
      if result is not None:
        return result
      logger.info("sandbox worker was gone before the program started; retrying on a fresh one")
    return ExecResult("sandbox_error", stderr="[sandbox] two sandbox workers in a row died before the program "
                      "started", wall_s=time.monotonic() - start)

  def _acquire(self) -> _Worker:
    dead = []
    try:
      with self._cv:
        while True:
          if self._closed:
            raise WorkerError("the sandbox worker pool is closed")
          while self._idle:
            worker = self._idle.pop()  # most recently used first: its pages are warm
            if worker.alive():
              return worker
            dead.append(worker)
            self._count -= 1
          if self._count < self._size:
            self._count += 1
            break
          self._cv.wait()
    finally:
      for worker in dead:
        worker.kill()
    try:
      return _Worker(self._prefix, self._python, self._memory)
    except BaseException:
      with self._cv:
        self._count -= 1
        self._cv.notify()
      raise

  def _release(self, worker: _Worker) -> None:
    with self._cv:
      if worker.healthy and not self._closed:
        self._idle.append(worker)
        self._cv.notify()
        return
      self._count -= 1
      self._cv.notify()
    worker.kill()

  def zygote_pids(self) -> list[int]:
    """Host pids of the idle workers' zygotes (monitoring and tests)."""
    with self._cv:
      return [w.zygote_pid for w in self._idle if w.zygote_pid is not None]

  def close(self) -> None:
    """Kills every idle worker (busy ones are killed when their call returns); idempotent."""
    with self._cv:
      self._closed = True
      idle, self._idle = self._idle, []
      self._count -= len(idle)
      self._cv.notify_all()
    for worker in idle:
      worker.kill()
