"""Disaggregated weight transfer: trainer and sampler on disjoint devices, layouts that differ (FSDP on the
trainer, tensor parallel on the sampler), one compiled program over the union of both meshes; the same across
two processes (one host's devices on each side, or both hosts split between the sides)."""

import os
import re
import socket
import subprocess
import sys

from flax import nnx
import jax
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import sharding
from agentrl_jax.rl import transfer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _params(mesh):
  model = testing.tiny_model(seed=3)
  _, params = nnx.split(model)
  return jax.device_put(params, sharding.state_shardings(params, mesh)), params


def test_split_devices_gives_each_process_the_same_share():
  trainer, sampler = transfer.split_devices(4)
  devs = jax.devices()
  assert trainer == devs[:4] and sampler == devs[4:]
  with pytest.raises(ValueError, match="leaves the trainer no device"):
    transfer.split_devices(8)
  for bad in (0, -2):  # an empty sampler would fail later, far from the setting that caused it
    with pytest.raises(ValueError, match=f"async_sampler_devices={bad}: the disaggregated sampler needs >= 1"):
      transfer.split_devices(bad)


def test_a_parameter_laid_out_otherwise_is_refused_not_scrambled():
  # The union places the trainer's shards by device: params on a permuted mesh of the same spec would arrive
  # in the wrong order (and from devices outside the trainer's, as zeros).
  mesh_t, mesh_s = transfer.split_meshes(dict(data=1, fsdp=-1, tensor=1, num_devices=0), dict(data=1, fsdp=1, tensor=-1), 4)
  src, host = _params(mesh_t)
  xfer = transfer.WeightTransfer(sharding.state_shardings(host, mesh_t), sharding.state_shardings(host, mesh_s))
  permuted = sharding.make_mesh(1, -1, 1, devices=list(mesh_t.devices.flat)[::-1])
  with pytest.raises(ValueError, match="laid out as .* not as the trainer's"):
    xfer(jax.device_put(host, sharding.state_shardings(host, permuted)))
  out = xfer(src)  # the zero placeholders of the sampler's half are made per call, not kept
  held = [v for v in vars(xfer).values() if isinstance(v, dict) and any(isinstance(x, jax.Array) for x in v.values())]
  assert not held
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(host)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("sampler_sizes", [dict(data=1, fsdp=1, tensor=-1), dict(data=1, fsdp=-1, tensor=1)])
def test_transfer_between_disjoint_meshes_with_other_layouts(sampler_sizes):
  mesh_t, mesh_s = transfer.split_meshes(dict(data=1, fsdp=-1, tensor=1, num_devices=0), sampler_sizes, 4)
  assert set(mesh_t.devices.flat).isdisjoint(mesh_s.devices.flat)
  src, host = _params(mesh_t)
  dst_sh = sharding.state_shardings(host, mesh_s)
  xfer = transfer.WeightTransfer(sharding.state_shardings(host, mesh_t), dst_sh)
  assert xfer.union is not None  # same mesh shape: the union program
  out = xfer(src)
  for got, want, sh in zip(jax.tree.leaves(out), jax.tree.leaves(host), jax.tree.leaves(dst_sh)):
    assert got.sharding == sh
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # A second call reuses the compiled program (new values arrive).
  bumped = jax.tree.map(lambda x: x + 1, src)
  again = xfer(bumped)
  for got, want in zip(jax.tree.leaves(again), jax.tree.leaves(host)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want) + 1)


def test_meshes_of_other_shapes_use_device_put_in_one_process():
  devs = jax.devices()
  mesh_t = sharding.make_mesh(1, -1, 1, devices=devs[:6])
  mesh_s = sharding.make_mesh(1, 1, -1, devices=devs[6:])
  src, host = _params(mesh_t)
  xfer = transfer.WeightTransfer(sharding.state_shardings(host, mesh_t), sharding.state_shardings(host, mesh_s))
  assert xfer.union is None
  for got, want in zip(jax.tree.leaves(xfer(src)), jax.tree.leaves(host)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


SCRIPT = r'''
import sys, jax, numpy as np
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from flax import nnx
from agentrl_jax import testing
from agentrl_jax.models import sharding
from agentrl_jax.rl import transfer
devs = jax.devices()
if sys.argv[3] == "split_hosts":   # host 0's devices train, host 1's sample
  t, s = devs[:2], devs[2:]
else:                              # each host gives one device to each side
  t, s = transfer.split_devices(2)
mesh_t, mesh_s = sharding.make_mesh(1, -1, 1, devices=t), sharding.make_mesh(1, 1, -1, devices=s)
_, host = nnx.split(testing.tiny_model(seed=3))
src = jax.device_put(jax.device_get(host), sharding.state_shardings(host, mesh_t))
out = transfer.WeightTransfer(sharding.state_shardings(host, mesh_t), sharding.state_shardings(host, mesh_s))(src)
bad = 0
for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(host)):
  for shard in got.addressable_shards:
    bad += not np.array_equal(np.asarray(shard.data), np.asarray(want)[shard.index])
print("RESULT", jax.process_index(), sum(len(x.addressable_shards) for x in jax.tree.leaves(out)), bad, flush=True)
'''


@pytest.mark.parametrize("layout", ["split_hosts", "interleaved"])
def test_transfer_across_two_processes(tmp_path, layout):
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  script = tmp_path / "xfer.py"
  script.write_text(SCRIPT)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  procs = [subprocess.Popen([sys.executable, str(script), f"127.0.0.1:{port}", str(i), layout], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  results = {}
  for out in outs:
    # Found anywhere in the output: the runtime's own log lines share the pipe and may split the line.
    for proc, shards, bad in re.findall(r"RESULT (\d+) (\d+) (\d+)", out):
      results[int(proc)] = (int(shards), int(bad))
  assert set(results) == {0, 1}, outs
  assert all(bad == 0 for _, bad in results.values()), results
  # Every sampler shard landed on its host: all on host 1 (split), one device per host (interleaved).
  total = sum(shards for shards, _ in results.values())
  assert total > 0 and (results[0][0] == 0 if layout == "split_hosts" else results[0][0] == results[1][0])
