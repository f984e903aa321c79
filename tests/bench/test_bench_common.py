"""`common.start_backend`: what the backends write to the native stderr while they start goes to a log file."""

import os
import subprocess
import sys
import textwrap

# A backend that writes to file descriptor 2 as libtpu's probing does (C code: no Python logging reaches it);
# the benchmark's own line after it must still reach the console.
_SCRIPT = textwrap.dedent("""
  import os, sys
  import jax
  from agentrl_jax.bench import common
  noisy = sys.argv[1] == "noisy"
  jax.devices = lambda: os.write(2, b"E0000 could not determine TPU accelerator type\\n") if noisy else None
  print(common.start_backend("probe"))
  os.write(2, b"[bench.probe] after start-up\\n")
""")


def _run(tmp_path, mode):
  env = dict(os.environ, AGENTRL_BENCH_LOG_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, env=env, check=True,
                        timeout=120)


def test_start_backend_sends_native_stderr_to_the_log(tmp_path):
  proc = _run(tmp_path, "noisy")
  log = tmp_path / "agentrl_jax_bench_probe.log"
  assert proc.stdout.strip() == str(log)
  assert log.read_text() == "E0000 could not determine TPU accelerator type\n"
  assert "could not determine" not in proc.stderr
  assert f"the backends' start-up messages: {log}" in proc.stderr
  assert proc.stderr.endswith("[bench.probe] after start-up\n")  # fd 2 is the console again


def test_start_backend_quiet_backend_says_nothing(tmp_path):
  log = tmp_path / "agentrl_jax_bench_probe.log"
  log.write_text("E0000 an earlier run's probing\n")
  proc = _run(tmp_path, "quiet")
  assert proc.stdout.strip() == "None"
  assert proc.stderr == "[bench.probe] after start-up\n"
  assert not log.exists()  # no empty file left, and no earlier run's messages read as this run's
