"""Multi-process runs on localhost: 2 JAX processes (2 CPU devices each, CPU collectives over gloo) against one
process holding the same 4 devices, with the same global batch and seed.

Each process is `python -m agentrl_jax.main ... --coordinator_address=127.0.0.1:<port> --num_processes=2
--process_id=i`, exactly what `launch/tpu_vm.sh run` starts on every host of a slice.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from agentrl_jax import checkpoint as ckpt_lib
from agentrl_jax import testing
from agentrl_jax.tools import sandbox
from tests.tools import sandbox_testing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, config: str, overrides: list[str], *, processes: int, devices_per_process: int,
            command: list[str] | None = None):
  """Starts the run's processes (`agentrl_jax.main`, or `command` + coordinator, count, id); returns them with
  their log files."""
  port = _free_port()
  os.makedirs(workdir, exist_ok=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
             TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
  procs = []
  for i in range(processes):
    if command is None:
      cmd = [sys.executable, "-m", "agentrl_jax.main", f"--config={config}", f"--workdir={workdir}", *overrides,
             f"--config.model.tokenizer_path={testing.tiny_tokenizer_dir()}"]
      if processes > 1:
        cmd += [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={i}"]
    else:
      cmd = [*command, *([f"127.0.0.1:{port}", str(processes), str(i)] if processes > 1 else [])]
    log_path = os.path.join(workdir, f"process_{i}.log")
    with open(log_path, "ab") as log:
      procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log_path))
  return procs


def _wait(procs):
  failed = []
  try:
    for p, log_path in procs:
      if p.wait(timeout=TIMEOUT_S) != 0:
        failed.append((p.returncode, log_path))
  finally:
    for p, _ in procs:
      if p.poll() is None:
        p.kill()
  if failed:
    rc, log_path = failed[0]
    with open(log_path, errors="replace") as f:
      tail = f.read()[-4000:]
    pytest.fail(f"process exited with {rc}; {log_path}:\n{tail}")


def _run(workdir, config, overrides, *, processes, devices_per_process, command=None):
  _wait(_launch(workdir, config, overrides, processes=processes, devices_per_process=devices_per_process,
                command=command))


def _metrics(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


SFT = ["--config.sft.micro_batch_rows=4", "--config.sft.num_epochs=2", "--config.export_hf=True",
       "--config.checkpoint.every_steps=2"]


def test_multiprocess_sft_equals_one_process(tmp_path):
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  _run(one, "configs/sft_tiny.py", SFT, processes=1, devices_per_process=4)
  _run(two, "configs/sft_tiny.py", SFT, processes=2, devices_per_process=2)

  # Only process 0 writes metrics; every logged step matches.
  m1, m2 = _metrics(one), _metrics(two)
  assert [m["step"] for m in m1] == [m["step"] for m in m2] and len(m1) >= 4
  for a, b in zip(m1, m2):
    for k in ("loss", "grad_norm", "tokens", "learning_rate", "skipped_conversations", "trained_tokens"):
      np.testing.assert_allclose(b[k], a[k], rtol=1e-5, err_msg=f"step {a['step']} {k}")
  # The checkpoints: same steps, same host-side counters; the final params (exported by process 0) agree.
  c1, c2 = ckpt_lib.Checkpointer(os.path.join(one, "checkpoints")), ckpt_lib.Checkpointer(os.path.join(two, "checkpoints"))
  assert c1.all_steps() == c2.all_steps()
  assert c1.read_metadata()["counters"] == c2.read_metadata()["counters"]
  c1.close()
  c2.close()
  assert sorted(os.listdir(os.path.join(two, "checkpoints", str(c2.all_steps()[-1]), "data"))) == [
      "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]  # each process saved its iterator position
  p1, p2 = load_file(os.path.join(one, "hf", "model.safetensors")), load_file(os.path.join(two, "hf", "model.safetensors"))
  assert p1.keys() == p2.keys()
  for k in p1:
    np.testing.assert_allclose(p2[k], p1[k], atol=1e-5, rtol=0, err_msg=k)


def test_multiprocess_rollout_runs_each_hosts_tools_and_equals_one_process(tmp_path):
  """The agent loop with the real sandbox: 2 processes draw the same episodes as 1 (same global program), each
  process ran exactly the tool calls of its own rows (slot blocks), and every transcript holds every result."""
  if sandbox.bwrap_path() is None:
    sandbox_testing.missing("bubblewrap is not installed")
  script = [sys.executable, "-m", "tests.rollout.multiprocess_rollout_script"]
  one, two = tmp_path / "one", tmp_path / "two"
  _run(str(one), "", [], processes=1, devices_per_process=4, command=[*script, str(tmp_path / "one.pkl")])
  _run(str(two), "", [], processes=2, devices_per_process=2, command=[*script, str(tmp_path / "two.pkl")])
  a, b = (pickle.load(open(tmp_path / f"{name}.pkl", "rb")) for name in ("one", "two"))
  assert len(a["episodes"]) == len(b["episodes"]) == 8
  for x, y in zip(a["episodes"], b["episodes"]):
    assert x["tokens"] == y["tokens"] and x["mask"] == y["mask"] and x["transcript"] == y["transcript"]
    np.testing.assert_allclose(y["logp"], x["logp"], atol=1e-6, rtol=0)
  assert sum(e["calls"] for e in b["episodes"]) >= 4 and b["extend_calls"] >= 1
  assert "42" in b["episodes"][0]["transcript"] and "True 42" in b["episodes"][2]["transcript"]
  ran_one, ran_two = a["ran"][0], b["ran"]
  assert len(ran_two) == 2 and all(ran_two)  # both hosts ran calls: the first slots' and the last slots'
  assert sorted(ran_two[0] + ran_two[1]) == sorted(ran_one)  # each call ran once, on one host


RL = ["--config.mesh.num_devices=0", "--config.rl.total_steps=4", "--config.checkpoint.every_steps=2", "--config.checkpoint.max_to_keep=5",
      "--config.rl.micro_batch_size=4"]


def _rl_state(workdir):
  step, state, meta = testing.latest_checkpoint_state(os.path.join(workdir, "checkpoints"))
  return step, jax.tree.leaves(state), meta


@pytest.mark.parametrize("arg", [None, "digits"])
def test_rl_toy_packs_its_longest_episode(arg):
  """The slow test below runs configs/rl_toy.py; a packed row must hold its longest episode (the trainer refuses
  a shorter `rl.pack_len`, which broke that test once RL episodes were packed)."""
  config = testing.load_config("rl_toy", arg)
  assert config.rl.pack_len >= config.rollout.max_prompt_len + config.rollout.max_response_len


@pytest.mark.slow
def test_multiprocess_rl_equals_one_process_and_resumes_after_sigkill(tmp_path):
  """GRPO-TCR steps of configs/rl_toy.py (arithmetic, real sandbox) on 2 processes vs 1 with the same 4 devices:
  same metrics and checkpoint (params, Adam moments, key, counters); then a 2-process run killed after its
  step-2 checkpoint and restarted ends where the uninterrupted one did."""
  if sandbox.bwrap_path() is None:
    sandbox_testing.missing("bubblewrap is not installed")
  one, two, killed = (str(tmp_path / x) for x in ("one", "two", "killed"))
  _run(one, "configs/rl_toy.py", RL, processes=1, devices_per_process=4)
  _run(two, "configs/rl_toy.py", RL, processes=2, devices_per_process=2)
  strip = lambda ms: [{k: v for k, v in m.items() if not k.startswith(("time/", "compile/"))} for m in ms]  # noqa: E731
  m1, m2 = strip(_metrics(one)), strip(_metrics(two))
  assert [m["step"] for m in m1] == [m["step"] for m in m2] == [1, 2, 3, 4]
  for a, b in zip(m1, m2):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {k}")
  s1, leaves1, meta1 = _rl_state(one)
  s2, leaves2, meta2 = _rl_state(two)
  assert s1 == s2 == 4 and meta1["counters"] == meta2["counters"] and len(leaves1) == len(leaves2) > 20
  for a, b in zip(leaves1, leaves2):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)

  procs = _launch(killed, "configs/rl_toy.py", RL, processes=2, devices_per_process=2)
  deadline = time.time() + TIMEOUT_S
  while not os.path.exists(os.path.join(killed, "checkpoints", "2", "commit_success.txt")):
    assert time.time() < deadline and all(p.poll() is None for p, _ in procs), "no step-2 checkpoint"
    time.sleep(0.2)
  for p, _ in procs:
    p.send_signal(signal.SIGKILL)
  for p, _ in procs:
    p.wait(timeout=60)
  _, _, meta = testing.latest_checkpoint_state(os.path.join(killed, "checkpoints"))
  assert 2 <= meta["step"] < 4
  _run(killed, "configs/rl_toy.py", RL, processes=2, devices_per_process=2)
  logs = "".join(open(os.path.join(killed, f"process_{i}.log")).read() for i in range(2))
  assert f"resumed at step {meta['step']} of 4" in logs
  s3, leaves3, meta3 = _rl_state(killed)
  assert s3 == 4 and meta3["counters"] == meta2["counters"]
  for a, b in zip(leaves2, leaves3):
    np.testing.assert_array_equal(b, a)  # same processes, same devices: bit for bit
  assert strip(_metrics(killed)) == m2
