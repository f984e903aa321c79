"""Worker mode of the local sandbox: programs see what they see per call, calls stay apart though they share a
worker, and a worker that dies or hangs is replaced; plus the fallback to per-call mode."""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from agentrl_jax import tools
from agentrl_jax.tools import executors, sandbox, sandbox_worker
from agentrl_jax.tools.base import ToolConfig
from tests import normal_user
from tests.tools.sandbox_testing import boot_time, bwrap_children, leftovers, missing, needs_bwrap

pytestmark = needs_bwrap

CFG = {"timeout_s": 5.0, "memory_mb": 512}


def worker_executor(**cfg) -> sandbox.LocalExecutor:
  executor = sandbox.LocalExecutor(ToolConfig(**{**CFG, "max_concurrency": 1, **cfg}))
  if executor.local_mode != "worker":
    why = executor.worker_unavailable
    executor.close()
    missing(f"worker mode is not available here: {why}")
  return executor


@pytest.fixture(scope="module")
def pair():
  """(per-call executor, single-slot worker executor), same limits."""
  per_call = sandbox.LocalExecutor(ToolConfig(**CFG, max_concurrency=1, local_mode="per_call"))
  worker = worker_executor()
  yield per_call, worker
  per_call.close()
  worker.close()


@pytest.fixture
def one():
  executor = worker_executor()
  yield executor
  executor.close()


# What a program can see of how it was started: equal in both modes (addresses and random uids aside).
SAME_PROGRAMS = {
    "print": "print('hi', 6 * 7)",
    "exception": "def f(x):\n  return 1 / x\n\nf(0)",
    "chained": "try:\n  {}['k']\nexcept KeyError as e:\n  raise ValueError('bad') from e",
    "syntax_error": "def f(:\n  pass",
    "unclosed": "x = (1,\n",
    "null_byte": "print(1)\x00",
    "lone_surrogate": "print('\udc80')",
    "exit_3": "import sys\nsys.exit(3)",
    "exit_message": "raise SystemExit('bye')",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "stdin": "import sys\nprint(repr(sys.stdin.read()))\nprint(input())",
    "tmp_files": "open('/tmp/a', 'w').write('x')\nimport os\nprint(sorted(os.listdir('/tmp')), os.getcwd(), "
                 "oct(os.stat('/tmp/main.py').st_mode), os.stat('/tmp/main.py').st_uid)",
    "numpy": "import numpy as np\nprint(np.arange(10).sum())",
    "atexit_and_thread": "import atexit, threading, time\natexit.register(print, 'atexit')\n"
                         "threading.Thread(target=lambda: (time.sleep(0.1), print('thread'))).start()\nprint('main')",
    "collector_and_finalizers": "import gc\nclass A:\n  def __del__(self):\n    print('freed', type(self).__name__)\n"
                                "a = A()\na.me = a\ndel a\nprint(gc.collect() > 0, gc.isenabled())\n"
                                "class B(A):\n  pass\nb = B()\nb.me = b\nprint('end')\n",
    "closed_stdout": "import os\nprint('a')\nos.close(1)\nprint('b')",
    "recursion_depth": "import sys\ndef f(n):\n  try:\n    return f(n + 1)\n  except RecursionError:\n    return n\n"
                       "print(f(0), sys.getrecursionlimit())",
    "no_caller_frame": "import sys, traceback\ntraceback.print_stack()\nprint(sys._getframe().f_back)",
    "interpreter_state": "import sys, os\nprint(sys.argv, sys.orig_argv, sys.flags, sys.path, sorted(sys.modules))\n"
                         "print(open('/proc/self/cmdline', 'rb').read(), sorted(os.listdir('/proc/self/fd')))\n"
                         "print(sorted(globals()), __file__, __loader__.path, hasattr(sys, 'last_type'))\n"
                         "print(sys.excepthook is sys.__excepthook__, sorted(os.environ), os.getpid(), os.getppid())",
    "signals_and_limits": "import signal, resource\nprint([signal.getsignal(s) for s in signal.valid_signals()])\n"
                          "print(signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
                          "print([resource.getrlimit(r) for r in range(16)])",
    "subprocess_and_ctypes": "import subprocess, sys, ctypes\n"
                             "print(subprocess.run([sys.executable, '-c', 'print(42)'], capture_output=True).stdout)\n"
                             "print(ctypes.CDLL(None).getpid())",
    "segfault": "import ctypes\nctypes.string_at(0)",
}


@pytest.mark.parametrize("name", sorted(SAME_PROGRAMS))
def test_program_sees_the_same_in_both_modes(pair, name):
  per_call, worker = pair
  a = per_call.run(SAME_PROGRAMS[name], stdin="line 1\nline 2\n")
  b = worker.run(SAME_PROGRAMS[name], stdin="line 1\nline 2\n")
  assert (b.status, b.exit_code, b.stdout, b.stderr) == (a.status, a.exit_code, a.stdout, a.stderr)
  if name == "exception":  # tracebacks as the interpreter prints them, no zygote frame
    assert b.stderr.splitlines()[1:] == ['  File "/tmp/main.py", line 4, in <module>', "    f(0)",
                                         '  File "/tmp/main.py", line 2, in f', "    return 1 / x",
                                         "           ~~^~~", "ZeroDivisionError: division by zero"]


def test_calls_on_one_worker_leave_nothing_to_the_next(one):
  zygotes = one.zygote_pids()
  daemon = ("import os, time\nopen('/tmp/left', 'w').write('x')\nopen('/dev/shm/left', 'w').write('x')\n"
            "if os.fork() == 0:\n  os.setsid()\n  if os.fork() == 0:\n    time.sleep(60)\n  os._exit(0)\n"
            "print('spawned')")
  record: dict = {}
  r = one.run(daemon, on_start=record.update)
  assert r.status == "ok" and r.stdout == "spawned\n", r
  assert leftovers(record["pid-namespace"], boot_time()) == []  # the daemon died with its pid 1
  look = ("import os\nprint(sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')))\n"
          "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
  r = one.run(look)
  # A checkout under /tmp has its interpreter's directories bound back there (read-only).
  bound = sorted({r.split("/")[2] for r in sandbox._python_roots(sys.executable) if r.startswith("/tmp/")})
  assert r.stdout == f"{sorted(['main.py', *bound])} []\n[1]\n", r
  assert one.zygote_pids() == zygotes  # all on the same worker


def test_each_call_is_pid_1_alone_with_its_own_uid_and_no_capabilities(one):
  code = ("import os, subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)'])\n"
          "print(os.getpid(), os.getuid(), os.getgid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) "
          "== sorted([1, child.pid]))\n"
          "print(sorted(line.split()[1] for line in open('/proc/self/status') if line.startswith(('Cap', 'NoNew'))))")
  uids = set()
  for _ in range(4):
    r = one.run(code)
    assert r.status == "ok", r
    pid, uid, gid, alone = r.stdout.split("\n")[0].split()
    assert (pid, uid, alone) == ("1", gid, "True")
    uids.add(int(uid))
    assert r.stdout.split("\n")[1] == str(["0000000000000000"] * 5 + ["1"])  # Cap{Amb,Bnd,Eff,Inh,Prm}, NoNewPrivs
  if os.geteuid() == 0:  # a random uid per call
    assert len(uids) == 4 and all(sandbox_worker.UID_BASE <= u < sandbox_worker.UID_BASE + sandbox_worker.UID_SPAN
                                  for u in uids)
  else:  # a normal user has one uid to run programs as: their own (as per call)
    assert uids == {os.getuid()}


@pytest.mark.parametrize("mode", ["per_call", "worker"])
def test_a_normal_users_programs_cannot_make_user_namespaces(mode):
  """Without root the sandbox is a user namespace; no program may make another (bubblewrap's --disable-userns per
  call; the zygote sets its own namespace's max_user_namespaces to 0). Run as a normal user (this process, or an
  unprivileged uid when the suite runs as root)."""
  script = ("import sys\nfrom agentrl_jax.tools import sandbox\nfrom agentrl_jax.tools.base import ToolConfig\n"
            f"ex = sandbox.LocalExecutor(ToolConfig(timeout_s=10, memory_mb=512, max_concurrency=1, "
            f"local_mode={mode!r}))\n"
            "r = ex.run('import ctypes\\nlibc = ctypes.CDLL(None, use_errno=True)\\n"
            "print(libc.unshare(0x10000000), ctypes.get_errno())')\n"
            "print(ex.local_mode, r.status, r.stdout.strip())\nex.close()\n")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run(normal_user.command([sys.executable, "-c", script]), cwd=root, env=normal_user.env(),
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  local_mode, status, rc, _ = proc.stdout.split()
  assert (local_mode, status, rc) == (mode, "ok", "-1"), proc.stdout


def test_ipc_objects_do_not_survive_a_call(one):
  make = "import ctypes\nprint(ctypes.CDLL(None).shmget(0x5A5A, 4096, 0o1666) >= 0)"  # IPC_CREAT
  find = "import ctypes\nprint(ctypes.CDLL(None).shmget(0x5A5A, 4096, 0o666) >= 0)"
  assert one.run(make + "\n" + find.split("\n")[1]).stdout == "True\nTrue\n"
  assert one.run(find).stdout == "False\n"  # a fresh ipc namespace per call: the segment is gone


def worker_bwraps(executor: sandbox.LocalExecutor) -> list[int]:
  """Pids of the bubblewrap processes of the executor's idle workers."""
  return sorted(w.proc.pid for w in executor._workers._idle)  # pylint: disable=protected-access


def test_killed_zygote_is_replaced_and_the_call_retried(one):
  assert one.run("print(1)").ok
  (zygote,), (bwrap,) = one.zygote_pids(), worker_bwraps(one)
  os.kill(zygote, signal.SIGKILL)
  time.sleep(0.2)
  r = one.run("print(2)")
  assert (r.status, r.stdout) == ("ok", "2\n"), r
  assert one.zygote_pids() != [zygote]
  assert bwrap not in bwrap_children()  # the dead worker's bubblewrap was reaped


def test_hung_zygote_is_detected_and_replaced(monkeypatch):
  monkeypatch.setattr(sandbox_worker, "_KILL_GRACE_S", 0.5)
  with worker_executor(timeout_s=1.5) as executor:
    assert executor.run("print(1)").ok
    (zygote,), (bwrap,) = executor.zygote_pids(), worker_bwraps(executor)
    os.kill(zygote, signal.SIGSTOP)
    start = time.monotonic()
    r = executor.run("print(2)")  # never started by the hung worker: run again on a fresh one
    assert (r.status, r.stdout) == ("ok", "2\n"), r
    assert time.monotonic() - start < 2 * 1.5 + 3.0
    assert not os.path.exists(f"/proc/{zygote}") and bwrap not in bwrap_children()  # killed, not left stopped
    assert executor.run("print(3)").stdout == "3\n"


def test_timeout_kill_leaves_the_worker_usable():
  code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('x', flush=True)\ntime.sleep(60)"
  executor = worker_executor(timeout_s=1.0)
  try:
    record: dict = {}
    r = executor.run(code, on_start=record.update)
    assert (r.status, r.stdout) == ("timeout", "x\n") and "wall-clock limit" in r.stderr, r
    assert leftovers(record["pid-namespace"], boot_time()) == []
    zygotes = executor.zygote_pids()
    assert executor.run("print(1)").ok and executor.zygote_pids() == zygotes  # the same worker, still healthy
  finally:
    executor.close()


def test_two_slots_run_concurrently_and_close_leaves_no_process():
  executor = worker_executor(max_concurrency=2)
  # Each program reports when it ran (the host's wall clock; the sandbox has no time namespace). Two slots: two
  # programs at a time, never three. Read from the programs' own intervals, not from the batch's wall time,
  # which a loaded host stretches.
  results = executor.run_batch([f"import time\nt = time.time()\ntime.sleep(1.0)\nprint({i}, t, time.time())"
                                for i in range(4)])
  runs = [r.stdout.split() for r in results]
  assert [int(r[0]) for r in runs] == list(range(4)), [r.stdout for r in results]
  spans = [(float(r[1]), float(r[2])) for r in runs]
  depth = max(sum(s <= t < e for s, e in spans) for t, _ in spans)  # most programs running at one start
  assert depth == 2, spans
  zygotes, bwraps = executor.zygote_pids(), worker_bwraps(executor)
  assert len(zygotes) == 2 and len(bwraps) == 2 and set(bwraps) <= set(bwrap_children())
  executor.close()
  assert not set(bwraps) & set(bwrap_children()) and not any(os.path.exists(f"/proc/{z}") for z in zygotes)
  executor.close()  # idempotent


def test_falls_back_to_per_call_with_one_log_line(monkeypatch, caplog, tmp_path):
  broken = tmp_path / "zygote.py"
  broken.write_text("import sys\nprint('zygote exploded', file=sys.stderr)\nsys.exit(3)\n")
  monkeypatch.setattr(sandbox_worker, "_ZYGOTE", str(broken))
  with caplog.at_level(logging.WARNING, logger="agentrl_jax.tools.sandbox"):
    with sandbox.LocalExecutor(ToolConfig(**CFG, max_concurrency=1)) as executor:
      assert executor.local_mode == "per_call"
      assert executor.run("print(5)").stdout == "5\n"
  lines = [r.getMessage() for r in caplog.records if "per call" in r.getMessage()]
  assert len(lines) == 1 and "zygote exploded" in lines[0], caplog.text


def test_no_worker_sandbox_means_per_call(monkeypatch, caplog):
  real = sandbox._plan
  monkeypatch.setattr(sandbox, "_plan", lambda cfg: dataclasses.replace(real(cfg), worker_prefix=()))
  with caplog.at_level(logging.INFO, logger="agentrl_jax.tools.sandbox"):
    with sandbox.LocalExecutor(ToolConfig(**CFG, max_concurrency=1)) as executor:
      assert executor.local_mode == "per_call" and executor.run("print(6)").stdout == "6\n"
  assert "worker mode needs bubblewrap" in caplog.text


def test_worker_mode_as_root_and_as_a_normal_user():
  """Both: root programs run as random uids, a normal user's as their own uid in a user namespace the zygote
  made (tests/tools/test_tools_as_normal_user.py runs this file as a normal user when the suite runs as root)."""
  with worker_executor() as executor:
    r = executor.run("import os\nprint(os.getuid())")
  assert r.ok and (int(r.stdout) >= sandbox_worker.UID_BASE if os.geteuid() == 0 else int(r.stdout) == os.getuid())


@pytest.mark.parametrize("mode", ["per_call", "worker"])
def test_an_interpreter_under_tmp_stays_visible_read_only(monkeypatch, tmp_path, mode):
  """A checkout (and its virtualenv) under /tmp: each program's private /tmp would hide the interpreter, so both
  modes bind its directories back over it, read-only."""
  root = tmp_path / "venv"
  root.mkdir()
  (root / "marker.txt").write_text("seen")
  assert str(root).startswith("/tmp/")
  real = sandbox._python_roots
  monkeypatch.setattr(sandbox, "_python_roots", lambda python: [*real(python), str(root)])
  code = (f"import os\nprint(open('{root}/marker.txt').read())\ntry:\n  open('{root}/new', 'w')\n"
          f"except OSError as e:\n  print(os.strerror(e.errno))\nopen('/tmp/mine', 'w').write('x')\n"
          f"print(sorted(os.listdir('/tmp/')))")
  with sandbox.LocalExecutor(ToolConfig(**CFG, max_concurrency=1, local_mode=mode)) as executor:
    assert executor.local_mode == mode
    r = executor.run(code)
  top = str(root).split("/")[2]
  assert r.stdout.split("\n")[:2] == ["seen", "Read-only file system"], r
  assert top in r.stdout.split("\n")[2] and "'mine'" in r.stdout.split("\n")[2], r


def test_per_call_mode_is_selectable_and_worker_is_the_default():
  assert ToolConfig().local_mode == "worker"
  with executors.make_executor(ToolConfig(**CFG, max_concurrency=1, local_mode="per_call")) as executor:
    assert executor.local_mode == "per_call" and executor.zygote_pids() == []
    assert executor.run("print(7)").stdout == "7\n"
  with tools.make_executor(ToolConfig(**CFG, max_concurrency=1)) as executor:
    assert isinstance(executor, sandbox.LocalExecutor)


def test_interface_module_does_not_import_its_implementations():
  path = os.path.join(os.path.dirname(tools.__file__), "base.py")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
  imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
  assert not [m for m in imported if "sandbox" in m or "executors" in m], imported


def test_workers_die_with_the_host_process():
  script = ("import sys, time\nfrom agentrl_jax.tools import sandbox\nfrom agentrl_jax.tools.base import ToolConfig\n"
            "ex = sandbox.LocalExecutor(ToolConfig(timeout_s=5, memory_mb=512, max_concurrency=1))\n"
            "print(ex.local_mode, *ex.zygote_pids(), flush=True)\ntime.sleep(60)")
  host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  try:
    mode, *zygotes = host.stdout.readline().split()
  finally:
    host.kill()  # SIGKILL: no close(), no atexit; only its descriptors close
    host.wait()
  if mode != "worker":
    missing("worker mode is not available here")
  deadline = time.monotonic() + 10.0
  while time.monotonic() < deadline and any(alive(int(z)) for z in zygotes):
    time.sleep(0.05)
  assert not any(alive(int(z)) for z in zygotes)


def alive(pid: int) -> bool:
  """Whether `pid` exists and is not a zombie."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False
