"""Shared benchmark helpers: a matmul peak measured in the same run, model FLOPs, timing, the Tunix venv.

Performance method (DESIGN.md): ours and the peer run side by side in one process run on the same weights and
shapes; MFU is against a matmul peak measured in that same run; report min/median over repeats. This machine
is noisy (shared cores), so measurements are interleaved and ratios are taken round by round.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp

from agentrl_jax.models.config import ModelConfig

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUNIX_VENV = os.path.join(REPO_ROOT, ".venv-tunix")
TUNIX_REQUIREMENTS = os.path.join(REPO_ROOT, "agentrl_jax", "bench", "requirements-tunix.txt")


def timed(fn: Callable[[], object]) -> float:
  """Wall seconds of `fn()`, blocking until every array it returns is ready."""
  t = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t


def matmul_peak_flops(n: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
  """Best FLOP/s of a jitted [n, n] @ [n, n] matmul over `repeats` runs (after one compile/warm-up run).

  The best (not the mean) run is the peak: on a shared machine the slow runs measure other people's work.
  """
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(jnp.matmul)
  jax.block_until_ready(f(a, b))
  return 2.0 * n**3 / min(timed(lambda: f(a, b)) for _ in range(repeats))


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters that take part in a matmul per token: all but norms and the (untied) input embedding table,
  whose lookup is free; a tied table counts once, as the LM head."""
  d, h = cfg.hidden_size, cfg.head_dim
  norms = cfg.num_layers * (2 * d + (2 * h if cfg.qk_norm else 0)) + d
  biases = cfg.num_layers * (cfg.num_heads + 2 * cfg.num_kv_heads) * h if cfg.qkv_bias else 0
  table = 0 if cfg.tie_embeddings else cfg.vocab_size * d
  return cfg.param_count() - norms - biases - table


def attention_pairs(cfg: ModelConfig, seq_len: int, impl: str | None = None) -> float:
  """Query-key pairs one head of one sequence computes in causal self-attention of `seq_len` tokens, with the
  attention kernel `impl` (default `cfg.attention_impl`; 'auto' as the model resolves it) as that kernel runs:

    xla (blocked)  query block i (cfg.attention_block tokens) against keys [0, end of block i): the blocks above
                   the diagonal are skipped, the diagonal blocks computed whole: T (T + block) / 2 when the block
                   divides T; T x T when T <= block (one dense block, the mask applied after).
    splash         blocks of `attention_kernels.splash_block(T)` on or below the diagonal: T (T + block) / 2.
    cudnn          the causal triangle, T (T + 1) / 2 (its tiles are internal to cuDNN).
    dense          every pair, T x T (a kernel that masks but computes the whole square, e.g. Tunix's on a CPU).
  """
  from agentrl_jax.models import attention_kernels  # pylint: disable=import-outside-toplevel

  t = seq_len
  impl = impl or cfg.attention_impl
  if impl == "auto":
    impl = attention_kernels.auto_impl()
  if impl == "dense":
    return float(t * t)
  if impl in ("splash", "ragged_paged"):
    block = attention_kernels.splash_block(t)
    n = t // block
    return float(block * block * n * (n + 1) // 2)
  if impl == "cudnn":
    return t * (t + 1) / 2.0
  block = cfg.attention_block
  if not block or t <= block:
    return float(t * t)
  return float(sum((min(s + block, t) - s) * min(s + block, t) for s in range(0, t, block)))


def train_flops_per_token(cfg: ModelConfig, seq_len: int, impl: str | None = None) -> float:
  """Model FLOPs of one training token (forward + backward), PaLM's MFU convention (arXiv 2204.02311, B) with
  attention counted as the kernel in use computes it:

      6 * N + 12 * L * n_heads * head_dim * P / T

  N = matmul_params(cfg) (the LM head included), T = sequence length, P = `attention_pairs(cfg, T, impl)` (PaLM
  counts the full square, P = T x T; a causal kernel that skips the blocks above the diagonal does about half).
  Rematerialisation is not counted.
  """
  pairs = attention_pairs(cfg, seq_len, impl)
  return 6.0 * matmul_params(cfg) + 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs / seq_len


def flops_convention(cfg: ModelConfig, seq_len: int, impl: str | None = None) -> str:
  """The FLOP count's convention, for a benchmark's JSON line."""
  impl = impl or cfg.attention_impl
  pairs = attention_pairs(cfg, seq_len, impl)
  return (f"6*N + 12*L*n_heads*head_dim*P/T per token (PaLM, N = matmul params incl. LM head), attention as the "
          f"{impl!r} kernel computes it: P = {pairs:.0f} query-key pairs per head at T={seq_len} "
          f"({pairs / seq_len ** 2:.4f} of the T x T square; causal blocks above the diagonal skipped)")


def summary(xs: list[float]) -> dict[str, float]:
  return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def tunix_python() -> str | None:
  """The side venv's python (Tunix pins safetensors<0.8, which our pinned transformers cannot use, so it
  lives outside .venv: `python3.11 -m venv .venv-tunix && .venv-tunix/bin/pip install -r
  agentrl_jax/bench/requirements-tunix.txt`); None when it is missing."""
  exe = os.path.join(TUNIX_VENV, "bin", "python")
  return exe if os.path.exists(exe) else None


def log(msg: str) -> None:
  """Progress to stderr, so stdout carries only the one JSON line."""
  print(msg, file=sys.stderr, flush=True)


def host_devices(n: int) -> None:
  """Gives the CPU backend `n` devices (XLA's host platform device count), unless XLA_FLAGS already sets a count.
  Call before the backends start. The devices share the host's cores; what they add is separate execution
  streams: programs on one device run one after another in dispatch order, on two devices side by side."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "--xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def start_backend(bench: str) -> str | None:
  """Starts JAX's backends (the first device query) with this process's native stderr sent to a log file, so the
  console keeps the benchmark's own lines: an installed libtpu on a machine without a TPU writes its probing
  errors ("could not determine TPU accelerator type", ...) straight to file descriptor 2, where no Python
  logging setting reaches. The file is `$AGENTRL_BENCH_LOG_DIR` (default the temp dir) /
  `agentrl_jax_bench_<bench>.log`; returns its path when something was written there (one console line says
  where), else None and removes the empty file (a quiet backend leaves nothing behind, not even last run's log).
  A benchmark calls it before anything else touches a device."""
  import tempfile

  import jax

  path = os.path.join(os.environ.get("AGENTRL_BENCH_LOG_DIR") or tempfile.gettempdir(),
                      f"agentrl_jax_bench_{bench}.log")
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(path, "wb") as f:
      os.dup2(f.fileno(), 2)
      try:
        jax.devices()
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
  finally:
    os.close(saved)
  if os.path.getsize(path) == 0:
    os.remove(path)
    return None
  log(f"[bench.{bench}] the backends' start-up messages: {path}")
  return path


def backend_info() -> dict:
  """This process's JAX backend and devices, for the JSON line of every side of a comparison."""
  import jax

  devices = jax.devices()
  return {"backend": jax.default_backend(), "device_kind": devices[0].device_kind, "device_count": len(devices)}


def jax_platforms() -> str:
  """`JAX_PLATFORMS` naming the backend this process runs on, so a peer's process runs on the same one."""
  import jax

  backend = jax.default_backend()
  return os.environ.get("JAX_PLATFORMS") or {"gpu": "cuda"}.get(backend, backend)


class SideProcess:
  """A worker script run in another interpreter (Tunix's side venv), driven by a line protocol on stdin/stdout:
  it prints one JSON line when ready, answers `run N` with one JSON line, and exits on `quit`.

  The worker runs on this process's backend (`JAX_PLATFORMS` passed on), and its first line says which backend
  and devices it got (`backend_info`), so a comparison never pits an accelerator against a CPU."""

  def __init__(self, python: str, script: str, args: list[str]):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    env = dict(os.environ, JAX_PLATFORMS=jax_platforms())
    self.proc = subprocess.Popen([python, path, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env)
    self.first = self._read()

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"worker {self.proc.args[1]} exited with code {self.proc.wait()} (its stderr is above)")
    return json.loads(line)

  def run(self, n: int) -> dict:
    self.proc.stdin.write(f"run {n}\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self, timeout: float = 120):
    if self.proc.poll() is None:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.close()
      self.proc.wait(timeout=timeout)
