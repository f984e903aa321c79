"""Executor interface shared by the code tool backends: `ExecResult`, `ToolConfig`, `Executor`, `PoolExecutor`.

Two backends run model-written Python behind the same interface (`tools/executors.py` picks one):
  local           bubblewrap sandboxes (`tools/sandbox.py`), a bounded thread pool.
  sandbox_fusion  a SandboxFusion server's `/run_code` over HTTP (`tools/sandbox_fusion.py`).

Callers submit code and get futures that never raise: every failure (a crash of the program, of the sandbox, of
the server) arrives as an `ExecResult` whose `status` says what happened. `sandbox_error` means the
infrastructure is shown broken: when a run fails in a way that could be the program's doing (a worker dying
under it, an exception while the host handled its output), the executor runs the program once more, and if that
fails too, a probe program; only if the probe fails as well is the result `sandbox_error`, else it is the
program's failure (`killed`), so no program can turn its own wrong answer into an infrastructure failure.

    executor = executors.make_executor(ToolConfig(backend="local", timeout_s=10))
    results = executor.run_batch(["print(1 + 1)", "import time; time.sleep(60)"])
    results[0].stdout == "2\\n"; results[1].status == "timeout"
    executor.close()
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

logger = logging.getLogger(__name__)

# ok: exit code 0.  error: non-zero exit (an exception's traceback is in stderr).  timeout: wall clock or CPU
# limit.  memory: the address-space limit was hit.  killed: ended by a signal or by the sandbox (output limit).
# sandbox_error: the sandbox itself failed; the program may not have run at all.
_MEMORY_RE = re.compile(r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory", re.IGNORECASE)
STATUSES = ("ok", "error", "timeout", "memory", "killed", "sandbox_error")
BACKENDS = ("local", "sandbox_fusion")
LOCAL_MODES = ("worker", "per_call")


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """Outcome of running one program.

  Attributes:
    status: one of `STATUSES`.
    stdout: decoded standard output (UTF-8, undecodable bytes replaced), capped by the backend.
    stderr: decoded standard error (tracebacks included), capped; sandbox notes are appended here.
    exit_code: the process exit code; -N when ended by signal N; None when it never ran or was not reported.
    wall_s: wall-clock seconds of the call as seen by the caller.
  """

  status: str
  stdout: str = ""
  stderr: str = ""
  exit_code: int | None = None
  wall_s: float = 0.0

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"ExecResult.status must be one of {STATUSES}, got {self.status!r}")

  @property
  def ok(self) -> bool:
    return self.status == "ok"


@dataclasses.dataclass(frozen=True)
class ToolConfig:
  """Code tool / executor settings.

  Attributes:
    backend: 'local' (bubblewrap sandbox) or 'sandbox_fusion' (HTTP service).
    timeout_s: wall-clock limit per program, seconds (the recipe uses 30).
    memory_mb: local: the address-space limit of each process and one memory cap on the whole sandbox (a
      memory cgroup, where the host has one to use: `sandbox_memory.py`); SandboxFusion: `memory_limit_MB`.
    max_concurrency: programs running at once; None = number of CPU cores (local) or 32 (SandboxFusion).
    allow_unsandboxed: local backend only: when bubblewrap is missing, run programs without isolation (rlimits
      and a private temp dir only) instead of refusing. Never use this on a machine holding anything of value.
    local_mode: local backend only: 'worker' (one long-lived sandbox per slot forks each program, as root or
      as a normal user; falls back with a log line where no worker starts) or 'per_call' (a new bubblewrap
      sandbox and interpreter per program).
    sandbox_fusion_url: full `/run_code` URL of a SandboxFusion server, e.g. 'http://localhost:8080/run_code'.
    max_output_bytes: bytes kept per stream (head and tail; the middle is dropped while reading).
    output_limit_bytes: a program writing more than this (both streams together) is killed.
    max_processes: RLIMIT_NPROC inside the sandbox (processes and threads).
    max_open_files: RLIMIT_NOFILE inside the sandbox.
    max_file_mb: RLIMIT_FSIZE and the size of each private tmpfs (/tmp, /dev/shm).
    python: interpreter to run inside the sandbox; '' = the interpreter running this code (its installation
      and virtualenv are mounted read-only, so numpy/sympy/... are available to model code).
    retries: SandboxFusion only: attempts after the first on HTTP 5xx, connection errors and timeouts.
    retry_backoff_s: SandboxFusion only: first retry delay, doubled per attempt.
    request_timeout_s: SandboxFusion only: HTTP timeout per attempt; None = timeout_s + 30 (queueing, start-up).
  """

  backend: str = "local"
  timeout_s: float = 10.0
  memory_mb: int = 1024
  max_concurrency: int | None = None
  allow_unsandboxed: bool = False
  local_mode: str = "worker"
  sandbox_fusion_url: str = ""
  max_output_bytes: int = 64 * 1024
  output_limit_bytes: int = 16 * 1024 * 1024
  max_processes: int = 64
  max_open_files: int = 256
  max_file_mb: int = 64
  python: str = ""
  retries: int = 3
  retry_backoff_s: float = 0.5
  request_timeout_s: float | None = None

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ValueError(f"ToolConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
    if self.local_mode not in LOCAL_MODES:
      raise ValueError(f"ToolConfig.local_mode must be one of {LOCAL_MODES}, got {self.local_mode!r}")
    if not self.timeout_s > 0:
      raise ValueError(f"ToolConfig.timeout_s must be > 0, got {self.timeout_s!r}")
    if self.memory_mb < 64:
      raise ValueError(f"ToolConfig.memory_mb must be >= 64 (a Python interpreter needs ~30 MB), got {self.memory_mb}")
    if self.max_concurrency is not None and self.max_concurrency < 1:
      raise ValueError(f"ToolConfig.max_concurrency must be >= 1 or None, got {self.max_concurrency}")
    if self.backend == "sandbox_fusion" and not self.sandbox_fusion_url.startswith(("http://", "https://")):
      raise ValueError(f"ToolConfig.sandbox_fusion_url must be an http(s) URL, got {self.sandbox_fusion_url!r}")
    if self.max_output_bytes < 256:
      raise ValueError(f"ToolConfig.max_output_bytes must be >= 256, got {self.max_output_bytes}")
    if self.output_limit_bytes < self.max_output_bytes:
      raise ValueError("ToolConfig.output_limit_bytes must be >= max_output_bytes, got "
                       f"{self.output_limit_bytes} < {self.max_output_bytes}")
    for name in ("max_processes", "max_open_files", "max_file_mb"):
      if getattr(self, name) < 1:
        raise ValueError(f"ToolConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.max_open_files < 16:
      raise ValueError(f"ToolConfig.max_open_files must be >= 16 (the interpreter needs some), got "
                       f"{self.max_open_files}")
    if self.request_timeout_s is not None and not self.request_timeout_s > 0:
      raise ValueError(f"ToolConfig.request_timeout_s must be > 0 or None, got {self.request_timeout_s!r}")
    if self.retries < 0 or self.retry_backoff_s < 0:
      raise ValueError(f"ToolConfig.retries and retry_backoff_s must be >= 0, got {self.retries}, "
                       f"{self.retry_backoff_s}")

  @property
  def concurrency(self) -> int:
    """Resolved `max_concurrency`."""
    if self.max_concurrency is not None:
      return self.max_concurrency
    return 32 if self.backend == "sandbox_fusion" else max(1, len(os.sched_getaffinity(0)))


def with_note(stderr: str, note: str) -> str:
  """Appends a `[sandbox] ...` line (what the sandbox did, e.g. a kill) to a program's stderr."""
  return f"{stderr}{'' if not stderr or stderr.endswith(chr(10)) else chr(10)}[sandbox] {note}"


def limit_result(cfg: ToolConfig, stdout: str, stderr: str, wall: float, *, timed_out: bool,
                 too_much: bool) -> ExecResult | None:
  """The result of a program the sandbox killed for its wall-clock or output limit (None if neither)."""
  if timed_out:
    return ExecResult("timeout", stdout, with_note(stderr, f"wall-clock limit of {cfg.timeout_s:g} s exceeded; "
                                                   "process killed"), None, wall)
  if too_much:
    return ExecResult("killed", stdout, with_note(stderr, f"output limit of {cfg.output_limit_bytes} bytes "
                                                  "exceeded; process killed"), -signal.SIGKILL, wall)
  return None


def classify_exit(code: int | None, stderr: str) -> tuple[str, int | None, str]:
  """Maps an exit code to (status, exit_code, stderr with a note).

  A negative code -N or 128 + N (bubblewrap's and shells' convention) means death by signal N; a program that
  itself exits with 129..192 is therefore reported as killed by a signal.
  """
  if code is None:
    return "sandbox_error", None, with_note(stderr, "no exit status was reported")
  memory = _MEMORY_RE.search(stderr[-4096:]) is not None
  if code < 0 or 128 < code <= 128 + 64:
    sig = -code if code < 0 else code - 128
    try:
      name = signal.Signals(sig).name
    except ValueError:
      name = f"signal {sig}"
    if sig == signal.SIGXCPU:
      return "timeout", -sig, with_note(stderr, "CPU time limit exceeded; process killed (SIGXCPU)")
    return ("memory" if memory else "killed"), -sig, with_note(stderr, f"process terminated by {name}")
  if code == 0:
    return "ok", 0, stderr
  return ("memory" if memory else "error"), code, stderr


@runtime_checkable
class Executor(Protocol):
  """Runs Python programs; thread-safe. Futures resolve to `ExecResult` and never raise.

  `output_limit_bytes`: None = the configured limits (a head and tail of `max_output_bytes` per stream kept,
  killed beyond `output_limit_bytes`); a number = the whole output kept up to that many bytes (both streams
  together), the program killed beyond it (test runs compare whole outputs).
  """

  def submit(self, code: str, *, stdin: str = "",
             output_limit_bytes: int | None = None) -> concurrent.futures.Future[ExecResult]:
    ...

  def run_batch(self, codes: Sequence[str], stdins: Sequence[str] | None = None, *,
                output_limit_bytes: int | None = None) -> list[ExecResult]:
    ...

  def close(self) -> None:
    ...


PROBE_CODE, PROBE_STDOUT = "print(6 * 7)", "42\n"


class PoolExecutor:
  """A bounded thread pool around a blocking `run_one(code, stdin, **kw) -> ExecResult`.

  Both backends are this class with a different `run_one`: each worker thread blocks on one program (a child
  process or an HTTP request), so `max_concurrency` programs run at once and the rest queue.
  """

  def __init__(self, run_one: Callable[..., ExecResult], max_concurrency: int, name: str):
    self._run_one = run_one
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix=name)
    self._closed = False
    self._lock = threading.Lock()
    self._probe_lock = threading.Lock()
    self._probe_started, self._probe_ok = -1.0, True
    self.max_concurrency = max_concurrency

  def _attempt(self, code: str, stdin: str, start: float, **kw) -> ExecResult:
    try:
      return self._run_one(code, stdin, **kw)
    except Exception as e:  # pylint: disable=broad-except
      # A bug in a backend must not turn into an exception inside the caller's rollout loop.
      logger.exception("executor backend failed")
      return ExecResult("sandbox_error", stderr=f"[sandbox] internal error: {type(e).__name__}: {e}",
                        wall_s=time.monotonic() - start)

  def _guarded(self, code: str, stdin: str, **kw) -> ExecResult:
    start = time.monotonic()
    result = self._attempt(code, stdin, start, **kw)
    if result.status != "sandbox_error":
      return result
    # Once more: a transient failure (a loaded host) gives the program its run; one the program provokes (a
    # worker it kills, output the host cannot process) happens again, and a probe then tells the two apart.
    result = self._attempt(code, stdin, start, **kw)
    if result.status != "sandbox_error" or not self.infrastructure_ok(time.monotonic()):
      return result
    return ExecResult("killed", result.stdout, with_note(result.stderr, "a probe program runs fine here, so this "
                                                         "is the program's failure"), result.exit_code,
                      time.monotonic() - start)

  def infrastructure_ok(self, since: float) -> bool:
    """Whether a probe program runs correctly, from a probe started at `since` or later (one probe at a time;
    callers that failed while it ran share its answer)."""
    with self._probe_lock:
      if self._probe_started >= since:
        return self._probe_ok
      started = time.monotonic()
      try:
        r = self._run_one(PROBE_CODE, "")
        ok = r.status == "ok" and r.stdout == PROBE_STDOUT
      except Exception:  # pylint: disable=broad-except
        ok = False
      if not ok:
        logger.warning("executor: a probe program failed; the infrastructure is broken")
      self._probe_started, self._probe_ok = started, ok
      return ok

  def submit(self, code: str, *, stdin: str = "",
             output_limit_bytes: int | None = None) -> concurrent.futures.Future[ExecResult]:
    """Queues one program; the future resolves to its `ExecResult`."""
    if not isinstance(code, str) or not isinstance(stdin, str):
      future: concurrent.futures.Future[ExecResult] = concurrent.futures.Future()
      future.set_result(ExecResult("error", stderr=f"code and stdin must be str, got {type(code).__name__} "
                                   f"and {type(stdin).__name__}"))
      return future
    kw = {} if output_limit_bytes is None else {"output_limit_bytes": int(output_limit_bytes)}
    with self._lock:
      if self._closed:
        raise RuntimeError("executor is closed")
      return self._pool.submit(self._guarded, code, stdin, **kw)

  def run_batch(self, codes: Sequence[str], stdins: Sequence[str] | None = None, *,
                output_limit_bytes: int | None = None) -> list[ExecResult]:
    """Runs programs concurrently (at most `max_concurrency` at once); results in input order."""
    if stdins is not None and len(stdins) != len(codes):
      raise ValueError(f"run_batch: {len(codes)} codes but {len(stdins)} stdins")
    futures = [self.submit(c, stdin=stdins[i] if stdins is not None else "", output_limit_bytes=output_limit_bytes)
               for i, c in enumerate(codes)]
    return [f.result() for f in futures]

  def close(self) -> None:
    """Waits for running programs and stops the workers; idempotent."""
    with self._lock:
      self._closed = True
    self._pool.shutdown(wait=True, cancel_futures=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
