"""The one testing helper: tiny models, a tiny tokenizer and random-weight HF checkpoints, built locally.

Used by the tests and the notebooks; production code (the package, its benchmarks and jobs) never imports it: the
helpers they share live in `models.tokenizer` and `models.hf_io` and are re-exported here. Nothing here downloads
anything.
"""

from __future__ import annotations

import functools
import os
import re

from flax import nnx
import jax
import jax.numpy as jnp

from agentrl_jax.models import hf_io
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen import Qwen

# Built by production modules (the benchmarks use them too, and production code never imports this module).
tiny_tokenizer_dir = tokenizer_lib.tiny_tokenizer_dir
tiny_tokenizer = tokenizer_lib.tiny_tokenizer
save_random_hf_checkpoint = hf_io.save_random_checkpoint


def tiny_model(cfg: ModelConfig | None = None, seed: int = 0) -> Qwen:
  """A randomly initialised model (default `ModelConfig.tiny_qwen3()`)."""
  return Qwen(cfg or ModelConfig.tiny_qwen3(), rngs=nnx.Rngs(seed))


def jit_forward(model: Qwen):
  """`model.__call__` compiled once per input shape (eager mode compiles every op separately: ~3x slower)."""
  graphdef, state = nnx.split(model)

  @functools.partial(jax.jit, static_argnames=("return_hidden",))
  def forward(state, tokens, **kwargs):
    return nnx.merge(graphdef, state)(tokens, **kwargs)

  return lambda tokens, **kwargs: forward(state, tokens, **kwargs)


def load_hf_torch(path: str | os.PathLike):
  """Loads a HF directory with `transformers` (torch CPU, float32, eager attention) in eval mode."""
  import torch
  import transformers

  model = transformers.AutoModelForCausalLM.from_pretrained(os.fspath(path), dtype=torch.float32,
                                                            attn_implementation="eager")
  return model.eval()


def hf_logits(model, tokens) -> jax.Array:
  """Full-sequence logits of a HF torch model for int tokens `[B, T]` (no padding)."""
  import numpy as np
  import torch

  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(np.array(tokens), dtype=torch.long)).logits
  return jnp.asarray(out.float().numpy())


def random_tokens(key, batch: int, length: int, vocab: int) -> jax.Array:
  return jax.random.randint(key, (batch, length), 0, vocab, dtype=jnp.int32)


__all__ = ["tiny_tokenizer", "tiny_tokenizer_dir", "tiny_model", "jit_forward", "save_random_hf_checkpoint", "load_hf_torch",
           "hf_logits", "random_tokens", "hf_io", "launch_main", "latest_checkpoint_state", "load_config", "tpu_mesh",
           "tpu_kernel_names"]


def launch_main(flags: list[str], workdir, *, log_path=None, cache_dir=None):
  """Starts `python -m agentrl_jax.main <flags> --workdir=...` on the CPU (resume tests kill and restart it).

  The tiny tokenizer is passed as a directory so the child does not train it again; a persistent compilation
  cache shared with the parent (its `JAX_COMPILATION_CACHE_DIR`, or `cache_dir`) lets later processes reuse
  the executables the first one compiled. Output goes to a pipe, or to `log_path`.
  """
  import subprocess
  import sys

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  if cache_dir is not None:
    env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(cache_dir)
  env.pop("XLA_FLAGS", None)
  flags = [*flags, f"--config.model.tokenizer_path={tiny_tokenizer_dir()}", f"--workdir={os.fspath(workdir)}"]
  out = open(log_path, "w") if log_path else subprocess.PIPE
  return subprocess.Popen([sys.executable, "-m", "agentrl_jax.main", *flags], cwd=repo, env=env, stdout=out,
                          stderr=subprocess.STDOUT, text=True)


def run_killed_and_resumed(flags: list[str], tmp_path, *, total_steps: int, kill_wait_s: float, run_wait_s: float):
  """The RL resume tests' protocol: an uninterrupted run in `tmp_path/full` beside one in `tmp_path/killed` that
  is SIGKILLed right after its step-3 checkpoint and rerun with the same command. Asserts each process ended as
  it should (killed, then resumed at its last checkpoint; the reference completes) and returns both workdirs."""
  import pathlib
  import signal

  tmp_path = pathlib.Path(tmp_path)
  full, killed = tmp_path / "full", tmp_path / "killed"
  reference = launch_main(flags, full, log_path=tmp_path / "full.log")
  victim = launch_main(flags, killed)
  log = []
  for line in victim.stdout:
    log.append(line)
    if "saved checkpoint at step 3 " in line:
      victim.send_signal(signal.SIGKILL)
      break
  victim.wait(timeout=kill_wait_s)
  assert victim.returncode == -signal.SIGKILL, "".join(log)[-3000:]
  _, _, meta = latest_checkpoint_state(killed / "checkpoints")
  killed_at = meta["step"]
  assert 3 <= killed_at < total_steps
  resumed = launch_main(flags, killed)
  out = resumed.communicate(timeout=run_wait_s)[0]
  assert resumed.returncode == 0, out[-3000:]
  assert f"resumed at step {killed_at} of {total_steps}" in out
  reference.wait(timeout=run_wait_s)
  assert reference.returncode == 0, (tmp_path / "full.log").read_text()[-3000:]
  return full, killed


def latest_checkpoint_state(checkpoint_dir):
  """(step, state as numpy, metadata) of the latest checkpoint, restored as stored onto one device."""
  import numpy as np

  from agentrl_jax import checkpoint

  with checkpoint.Checkpointer(checkpoint_dir) as ckpt:
    step = ckpt.latest_step()
    shapes = ckpt.saved_shapes()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state, meta = ckpt.restore(checkpoint.abstract_state(shapes, jax.tree.map(lambda _: device, shapes)))
  return step, jax.tree.map(np.asarray, state), meta


def tpu_mesh(shape: tuple[int, ...] = (1,), axes: tuple[str, ...] = ("data",),
             device_kind: str = "TPU v5 lite") -> jax.sharding.AbstractMesh:
  """An abstract mesh of TPU chips. Under `jax.sharding.use_abstract_mesh(tpu_mesh(...))`,
  `jax.export(f, platforms=["tpu"])` lowers `f` for a TPU slice from any host (the TPU kernels' lowering tests)."""
  from jax._src import mesh as mesh_lib  # AbstractDevice has no public name

  device = mesh_lib.AbstractDevice(device_kind=device_kind, num_cores=1, platform="tpu")
  return jax.sharding.AbstractMesh(shape, axes, abstract_device=device)


def tpu_kernel_names(mlir_text: str) -> set[str]:
  """The Pallas TPU kernels a lowered module (StableHLO text) calls."""
  return set(re.findall(r'kernel_name = "([^"]+)"', mlir_text))


def load_config(name: str, arg: str | None = None, **overrides):
  """`configs/<name>.py:get_config(arg)`, as `--config=configs/<name>.py:arg` loads it, with dotted-key
  overrides passed as a dict: `load_config("rl_toy", "digits", **{"rl.total_steps": 4})` (a locked ConfigDict
  still accepts new values for existing fields)."""
  import importlib.util

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location(f"config_{name}", os.path.join(repo, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(arg)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config
