"""Asynchronous RL, disaggregated, on 2 processes x 2 CPU devices (gloo collectives) against 1 process holding the
same 4 devices: each host gives one device to the sampler and one to the trainer, the weights cross hosts by the
union-mesh transfer after every update, and both runs make the same decisions and reach the same parameters."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from agentrl_jax import testing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--config=configs/rl_toy.py:digits", "--config.rl.total_steps=4", "--config.checkpoint.every_steps=2",
         "--config.mesh.num_devices=0", "--config.rollout.batch_size=64", "--config.rl.max_staleness=1",
         "--config.rl.async_placement=disaggregated", "--config.rl.async_sampler_devices=2",
         "--config.rl.async_weight_sync_segments=1"]


def _run(workdir: str, processes: int, devices: int) -> None:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  os.makedirs(workdir, exist_ok=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
  procs = []
  for i in range(processes):
    cmd = [sys.executable, "-m", "agentrl_jax.main", *FLAGS, f"--workdir={workdir}",
           f"--config.model.tokenizer_path={testing.tiny_tokenizer_dir()}"]
    if processes > 1:
      cmd += [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={i}"]
    log = open(os.path.join(workdir, f"process_{i}.log"), "w")
    procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log.name))
  try:
    for p, path in procs:
      if p.wait(timeout=900) != 0:
        pytest.fail(f"process exited with {p.returncode}: {open(path, errors='replace').read()[-4000:]}")
  finally:
    for p, _ in procs:
      if p.poll() is None:
        p.kill()


@pytest.mark.slow
def test_disaggregated_async_on_two_hosts_equals_one(tmp_path):
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  _run(one, processes=1, devices=4)
  _run(two, processes=2, devices=2)
  logs = open(os.path.join(two, "process_0.log")).read()
  assert "sampler on 2 devices, trainer on 2" in logs
  strip = lambda d: [{k: v for k, v in json.loads(l).items() if not k.startswith(("time/", "compile/"))}  # noqa: E731
                     for l in open(os.path.join(d, "metrics.jsonl"))]
  m1, m2 = strip(one), strip(two)
  assert [m["step"] for m in m1] == [m["step"] for m in m2] == [1, 2, 3, 4]
  assert max(m["async/staleness_max"] for m in m1) == 1.0 and max(m["async/weight_syncs"] for m in m1) >= 1
  for a, b in zip(m1, m2):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {k}")
  s1, state1, _ = testing.latest_checkpoint_state(os.path.join(one, "checkpoints"))
  s2, state2, _ = testing.latest_checkpoint_state(os.path.join(two, "checkpoints"))
  assert s1 == s2 == 4
  for a, b in zip(jax.tree.leaves(state1), jax.tree.leaves(state2)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
