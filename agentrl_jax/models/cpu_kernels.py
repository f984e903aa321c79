"""XLA:CPU kernels of our own, called from compiled programs as FFI custom calls.

`single_query_attention`: a decode step's attention over the KV cache that reads each row's own length
(`cpu_attention.cc`), where the XLA form (`attention_kernels.single_query_attention`) reads every row's whole
capacity under a mask. The sampler's decode program on XLA:CPU takes it when `available()`.

`causal_attention`: causal self-attention of whole rows with packed segments, forward and gradient (training and
scoring), that computes each query against its own segment's earlier keys only, where the XLA form
(`attention_kernels.causal_blocked_attention`) computes every query block against every key block up to it under a
mask: a row of packed episodes costs what its episodes do, and its padding nothing. The model takes it on XLA:CPU
for packed rows longer than 256 tokens (`attention_kernels.row_attention_kernel`).

The C++ source is compiled on first use, on the machine that runs it (`-O3 -march=native`), into a cache directory
(`AGENTRL_KERNEL_CACHE`, default `~/.cache/agentrl_jax/kernels`), keyed by the source, the jaxlib version (its FFI
headers), the compiler and the CPU's flags: a build takes a few seconds once per machine, and concurrent processes
publish the library atomically. It needs a C++17 compiler (`CXX`, else `c++` / `g++`; `launch/setup.sh` installs
one as root). Without one, or when a build fails, `available()` is False with the reason logged once, and decode
keeps the XLA form (`AGENTRL_CPU_KERNELS=0` asks for that form on purpose, e.g. to time the two).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int
import numpy as np

log = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("cpu_attention.cc")
TARGET = "agentrl_single_query_attention"
FWD_TARGET = "agentrl_causal_attention_fwd"
BWD_TARGET = "agentrl_causal_attention_bwd"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")


def cache_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get("AGENTRL_KERNEL_CACHE") or pathlib.Path.home() / ".cache/agentrl_jax/kernels")


def compiler() -> str | None:
  """The C++ compiler the kernels are built with: `CXX`, else the first of c++ / g++ / clang++ on the PATH."""
  if os.environ.get("CXX"):
    return shutil.which(os.environ["CXX"])
  return next((p for p in map(shutil.which, ("c++", "g++", "clang++")) if p), None)


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return next((line for line in f if line.startswith("flags")), "")
  except OSError:
    return ""


def build(cxx: str) -> pathlib.Path:
  """Compiles `SOURCE` into the cache (if not there yet) and returns the shared library's path.

  Raises:
    RuntimeError: the compiler failed (its output in the message).
  """
  import jaxlib  # pylint: disable=import-outside-toplevel
  version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
  key = hashlib.sha256("\0".join([SOURCE.read_text(), jaxlib.__version__, cxx, version, *FLAGS, _cpu_flags()]).encode())
  out = cache_dir() / f"cpu_attention-{key.hexdigest()[:16]}.so"
  if out.exists():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
  os.close(fd)
  cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", tmp]
  res = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if res.returncode != 0:
    os.unlink(tmp)
    raise RuntimeError(f"building {SOURCE.name} failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
  os.replace(tmp, out)  # atomic: a concurrent build publishes the same bytes
  return out


@functools.cache
def available() -> bool:
  """True when this process can call the kernels: the library built (or found in the cache) and registered with
  XLA:CPU. False, with the reason logged once, when `AGENTRL_CPU_KERNELS=0`, there is no C++ compiler, or the
  build failed."""
  if os.environ.get("AGENTRL_CPU_KERNELS", "1") == "0":
    log.info("cpu_kernels: off (AGENTRL_CPU_KERNELS=0); decode and the packed rows' attention use the XLA forms")
    return False
  cxx = compiler()
  if cxx is None:
    log.warning("cpu_kernels: no C++ compiler (CXX, c++, g++, clang++) found: decode attention on XLA:CPU reads "
                "every row's whole cache capacity (install g++ for the length-aware kernel)")
    return False
  try:
    lib = ctypes.cdll.LoadLibrary(str(build(cxx)))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.AgentrlSingleQueryAttention), platform="cpu")
    jax.ffi.register_ffi_target(FWD_TARGET, jax.ffi.pycapsule(lib.AgentrlCausalAttentionFwd), platform="cpu")
    jax.ffi.register_ffi_target(BWD_TARGET, jax.ffi.pycapsule(lib.AgentrlCausalAttentionBwd), platform="cpu")
  except (OSError, RuntimeError, AttributeError) as e:
    log.warning("cpu_kernels: the kernels are unavailable, decode and the packed rows' attention keep the XLA forms: "
                "%s", e)
    return False
  return True


def single_query_attention(q: Float[Array, "B K G H"], k_t: Float[Array, "B K H S"], v: Float[Array, "B K S H"],
                           valid: Int[Array, "B"], scale: float) -> Float[Array, "B K G H"]:
  """One query per row and kv-head group over the first `valid[b]` slots of each row's cache (float32; `valid`
  at most S): the same sums as `attention_kernels.single_query_attention` under the mask `slot < valid[b]`, in
  another order. A row with `valid[b] <= 0` takes no part: its output is zeros and none of its cache is read (a
  decode step's rows that have stopped or wait on a tool). Requires `available()`."""
  call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
  return call(q.astype(jnp.float32), k_t.astype(jnp.float32), v.astype(jnp.float32), valid.astype(jnp.int32),
              scale=np.float32(scale))


def _lse_shape(q):
  b, t, k, g, _ = q.shape
  return jax.ShapeDtypeStruct((b, k, g, t), jnp.float32)


def _fwd_call(q, k, v, seg, scale, pad_zero):
  call = jax.ffi.ffi_call(FWD_TARGET, (jax.ShapeDtypeStruct(q.shape, jnp.float32), _lse_shape(q)),
                          vmap_method="sequential")
  return call(q, k, v, seg, scale=np.float32(scale), pad_zero=np.int32(pad_zero))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _causal_attention(q, k, v, seg, scale, pad_zero):
  return _fwd_call(q, k, v, seg, scale, pad_zero)[0]


def _causal_attention_fwd(q, k, v, seg, scale, pad_zero):
  out, lse = _fwd_call(q, k, v, seg, scale, pad_zero)
  return out, (q, k, v, seg, out, lse)


def _causal_attention_bwd(scale, pad_zero, res, dout):
  q, k, v, seg, out, lse = res
  call = jax.ffi.ffi_call(BWD_TARGET, (jax.ShapeDtypeStruct(q.shape, jnp.float32),
                                       jax.ShapeDtypeStruct(k.shape, jnp.float32),
                                       jax.ShapeDtypeStruct(v.shape, jnp.float32)), vmap_method="sequential")
  dq, dk, dv = call(q, k, v, seg, out, lse, dout.astype(jnp.float32), scale=np.float32(scale),
                    pad_zero=np.int32(pad_zero))
  return dq, dk, dv, np.zeros(seg.shape, jax.dtypes.float0)


_causal_attention.defvjp(_causal_attention_fwd, _causal_attention_bwd)


def causal_attention(qg: Float[Array, "B T K G H"], k: Float[Array, "B T K H"], v: Float[Array, "B T K H"],
                     segment_ids: Int[Array, "B T"] | None, scale: float) -> Float[Array, "B T K G H"]:
  """Causal self-attention of whole rows (float32; differentiable in q, k and v): query t attends the keys s <= t
  of its own segment, as `attention_kernels.causal_blocked_attention` under the model's causal + segment mask, the
  same sums in another order. `segment_ids` None: one sequence per row. With segment ids, id 0 is padding
  (`rl.batch.pack_minibatch`, `sft.packing`): its queries attend nothing and output zeros, where the dense form
  lets them attend the padding before them; nothing reads those outputs (every loss masks padding) and no other
  token sees them. Requires `available()`."""
  seg = jnp.ones(qg.shape[:2], jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
  return _causal_attention(qg.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), seg,
                           float(scale), int(segment_ids is not None))
