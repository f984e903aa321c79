"""One memory cap on a whole sandbox: a memory cgroup per sandbox (per call, or per worker) around every process
the program starts, on top of the per-process address-space limit.

Why: RLIMIT_AS holds each process; a program may start `max_processes` of them, so without a cgroup it could
hold ~64x `memory_mb` and push the host into its OOM killer. In a cgroup, the sandbox's pages (its tmpfs files
included) count together, and the kernel kills inside the sandbox when the cap is reached.

Where: cgroup v2 (`memory.max`, `memory.swap.max`) in a cgroup where memory is delegated (this process's own,
when its subtree has the controller; as root, the hierarchy's root), else cgroup v1's memory hierarchy
(`memory.limit_in_bytes`, `memory.memsw.limit_in_bytes`) under this process's own memory cgroup (root). A normal
user without a delegated cgroup has none: there the cap stays per process, and `cgroup_base()` says why.

    base = cgroup_base()            # a `Base`, or the reason there is none
    group = base.create(limit)      # a fresh cgroup; `group.wrap(cmd)` starts cmd inside it
    ...; group.oom_kills(); group.remove()
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import threading

from agentrl_jax.tools.base import ExecResult, with_note

logger = logging.getLogger(__name__)
_PREFIX = "agentrl-sandbox-"
_counter = itertools.count()
_lock = threading.Lock()


def _read(path: str) -> str:
  with open(path, encoding="ascii") as f:
    return f.read()


def _write(path: str, text: str) -> None:
  with open(path, "w", encoding="ascii") as f:
    f.write(text)


def _mounts() -> list[tuple[str, str, set[str]]]:
  """(mount point, fs type, super options) of the cgroup mounts this process sees."""
  out = []
  with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
    for line in f:
      left, _, right = line.partition(" - ")
      fields, rest = left.split(), right.split()
      if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
        out.append((fields[4].replace("\\040", " "), rest[0], set(rest[2].split(","))))
  return out


def _own_paths() -> dict[str, str]:
  """This process's cgroup path per hierarchy: '' for v2, the controller list ('memory', ...) for v1."""
  out = {}
  for line in _read("/proc/self/cgroup").splitlines():
    _, controllers, path = line.split(":", 2)
    out[controllers] = path
  return out


@dataclasses.dataclass(frozen=True)
class Base:
  """A cgroup directory under which this process can make memory-capped cgroups."""

  path: str
  version: int

  def create(self, limit_bytes: int) -> Cgroup:
    """A new, empty cgroup capped at `limit_bytes` of memory (swap included)."""
    with _lock:
      name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
    path = os.path.join(self.path, name)
    os.mkdir(path)
    group = Cgroup(path, self.version)
    try:
      group.set_limit(limit_bytes)
    except OSError:
      group.remove()
      raise
    return group

  def sweep(self) -> None:
    """Removes empty cgroups left by processes of ours that died without removing them."""
    for name in os.listdir(self.path):
      if not name.startswith(_PREFIX):
        continue
      pid = name[len(_PREFIX):].split("-")[0]
      if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
        try:
          os.rmdir(os.path.join(self.path, name))
        except OSError:
          pass


@dataclasses.dataclass
class Cgroup:
  """One sandbox's cgroup."""

  path: str
  version: int

  @property
  def procs_file(self) -> str:
    return os.path.join(self.path, "cgroup.procs")

  def set_limit(self, limit_bytes: int) -> None:
    if self.version == 2:
      _write(os.path.join(self.path, "memory.max"), str(limit_bytes))
      if os.path.exists(os.path.join(self.path, "memory.swap.max")):
        _write(os.path.join(self.path, "memory.swap.max"), "0")
    else:  # memory+swap may never be below memory: raise it first, lower it last
      names = ["memory.limit_in_bytes"]
      if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
        current = int(_read(os.path.join(self.path, "memory.limit_in_bytes")))
        names = names + ["memory.memsw.limit_in_bytes"] if limit_bytes < current else [
            "memory.memsw.limit_in_bytes"] + names
      for name in names:
        _write(os.path.join(self.path, name), str(limit_bytes))

  def usage(self) -> int:
    name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
    return int(_read(os.path.join(self.path, name)))

  def oom_kills(self) -> int:
    """Processes the kernel has killed in this cgroup for its memory cap so far."""
    name = "memory.events" if self.version == 2 else "memory.oom_control"
    try:
      for line in _read(os.path.join(self.path, name)).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
          return int(value)
      if self.version == 1:  # kernels before 4.13 have no oom_kill count: the limit was hit at least
        return int(_read(os.path.join(self.path, "memory.failcnt")) > "0")
    except (OSError, ValueError):
      pass
    return 0

  def wrap(self, cmd: list[str] | tuple[str, ...]) -> list[str]:
    """`cmd` started inside this cgroup: a shell moves itself in, then execs it (no thread-unsafe preexec_fn,
    and every process the command starts is born inside)."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs_file, *cmd]

  def remove(self) -> None:
    """Removes the (empty) cgroup; logs instead of raising if processes still hold it."""
    try:
      os.rmdir(self.path)
    except FileNotFoundError:
      pass
    except OSError as e:
      logger.warning("sandbox cgroup %s not removed: %s", self.path, e)


def _writable(path: str) -> bool:
  return os.access(path, os.W_OK | os.X_OK) and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)


@functools.cache
def cgroup_base() -> Base | str:
  """Where sandbox cgroups go here, or why there is no memory cgroup to use."""
  try:
    mounts, own = _mounts(), _own_paths()
  except OSError as e:
    return f"cgroups are not readable here ({e})"
  tried = []
  for point, kind, _ in mounts:
    if kind != "cgroup2":
      continue
    candidates = [os.path.join(point, own.get("", "/").lstrip("/"))]
    if os.geteuid() == 0:
      candidates.append(point)
    for path in candidates:
      try:
        delegated = "memory" in _read(os.path.join(path, "cgroup.subtree_control")).split()
      except OSError:
        continue
      if delegated and _writable(path):
        return _probe(Base(path, 2))
      tried.append(f"{path}: memory {'delegated' if delegated else 'not in cgroup.subtree_control'}"
                   f"{'' if _writable(path) else ', not writable'}")
  for point, kind, options in mounts:
    if kind == "cgroup" and "memory" in options:
      own_path = next((p for c, p in own.items() if "memory" in c.split(",")), "/")
      path = os.path.join(point, own_path.lstrip("/"))
      if _writable(path):
        return _probe(Base(path, 1))
      tried.append(f"{path}: cgroup v1 memory, not writable")
  return "no memory cgroup this process may create children in (" + ("; ".join(tried) or "none mounted") + ")"


def _probe(base: Base) -> Base | str:
  """`base` if a capped cgroup can be made there (and removed again)."""
  try:
    base.sweep()
    base.create(64 << 20).remove()
  except OSError as e:
    return f"cannot create a capped cgroup under {base.path} ({e})"
  return base


def after_oom(result: ExecResult, kills: int, limit_bytes: int) -> ExecResult:
  """`result` of a sandbox in which the kernel killed `kills` processes for the memory cap: `memory` unless the
  program still ended well (one of its processes died, it carried on)."""
  if kills <= 0:
    return result
  note = f"the sandbox's memory cap of {limit_bytes >> 20} MiB was reached; {kills} process(es) killed"
  status = result.status if result.status in ("ok", "timeout") else "memory"
  return dataclasses.replace(result, status=status, stderr=with_note(result.stderr, note))


# ----------------------------------------------------------------------------------------------- no cgroup


class Watch:
  """The equivalent where there is no cgroup (a normal user without a delegated one): the host polls the memory
  of every process under the sandbox's root process (proportional set size where readable, else resident) and
  reports when their sum passes the cap; the caller then kills the sandbox. Reactive, so a program can overshoot
  by what it allocates within one `interval_s`; each process stays under RLIMIT_AS as well."""

  def __init__(self, cap_bytes: int, interval_s: float = 0.02):
    self.cap, self.interval_s = cap_bytes, interval_s
    self._next = 0.0
    self.peak = 0

  def over(self, root_pid: int | None, now: float, *, include_root: bool = True) -> bool:
    """Whether the processes under `root_pid` hold more than the cap (checked at most once per interval)."""
    if root_pid is None or now < self._next:
      return False
    self._next = now + self.interval_s
    used = sum(_process_memory(pid) for pid in _descendants(root_pid, include_root))
    self.peak = max(self.peak, used)
    return used > self.cap


def _descendants(root: int, include_root: bool) -> list[int]:
  out, todo = [], [root]
  while todo:
    pid = todo.pop()
    if pid != root or include_root:
      out.append(pid)
    try:
      tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
      continue
    for tid in tasks:
      try:
        todo.extend(int(c) for c in _read(f"/proc/{pid}/task/{tid}/children").split())
      except (OSError, ValueError):
        pass
  return out


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _process_memory(pid: int) -> int:
  try:  # shared pages (a forked interpreter's) counted once across the processes that share them
    for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
      if line.startswith("Pss:"):
        return int(line.split()[1]) << 10
  except (OSError, ValueError, IndexError):
    pass
  try:  # a process we may not inspect (the harness's non-dumpable tester): its resident size
    return int(_read(f"/proc/{pid}/statm").split()[1]) * _PAGE
  except (OSError, ValueError, IndexError):
    return 0


def over_result(result: ExecResult, watch: Watch) -> ExecResult:
  """The result of a sandbox killed by `watch` for holding more than the cap."""
  note = (f"the sandbox's memory ({watch.peak >> 20} MiB) passed its cap of {watch.cap >> 20} MiB; killed "
          "(no memory cgroup here: the host polls the sandbox's processes)")
  return dataclasses.replace(result, status="memory", stderr=with_note(result.stderr, note))
