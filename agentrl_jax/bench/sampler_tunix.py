"""Tunix's native sampler on a HF Qwen3 directory, driven by `agentrl_jax.bench.sampler` (runs in .venv-tunix).

    .venv-tunix/bin/python agentrl_jax/bench/sampler_tunix.py --hf-dir DIR --prompts PROMPTS.npy --new-tokens 256

Imports only Tunix, JAX and NumPy (no agentrl_jax). Tunix's Qwen3 is loaded from the same safetensors
(`tunix.models.qwen3.params.create_model_from_safe_tensors`) and sampled with `tunix.generate.sampler.Sampler`
at temperature 1, top_p 1 (Tunix then draws with `jax.random.categorical` over the full vocabulary), with
log-probs returned (ours always computes them), and a cache of exactly prompt + new tokens. The prompts are
token ids; a small id tokenizer passes them through Tunix's string interface unchanged.

Protocol (stdout, one JSON object per line): after loading and one warm-up (compiling) call it prints
{"ready": true, "compile_s": ..., "new_tokens_per_row": [...]}; then for each stdin line "run N" it runs N
timed calls and prints {"times": [...]}; "quit" ends it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


class IdTokenizer:
  """Strings of space-separated ids <-> ids, with pad 0 and an end id the benchmark never stops on."""

  def __init__(self, eos: int):
    self._eos = eos

  def encode(self, text, **kwargs):
    del kwargs
    return [int(t) for t in text.split()]

  def decode(self, ids, **kwargs):
    del kwargs
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return 0  # falsy: Tunix prepends nothing

  def eos_id(self):
    return self._eos

  def pad_id(self):
    return 0



def _backend() -> dict:
  """The backend and devices this worker runs on (the parent passes its own JAX_PLATFORMS)."""
  import jax

  return {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "device_count": jax.device_count()}


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--hf-dir", required=True)
  p.add_argument("--prompts", required=True, help=".npy int32 [B, P] prompt ids (no zeros: 0 is Tunix's pad)")
  p.add_argument("--new-tokens", type=int, required=True)
  args = p.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np
  from tunix.generate import sampler as sampler_lib
  from tunix.models.qwen3 import model as qwen3_lib
  from tunix.models.qwen3 import params as qwen3_params

  with open(f"{args.hf_dir}/config.json") as f:
    hf = json.load(f)
  theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 1_000_000)
  cfg = qwen3_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(theta), norm_eps=hf["rms_norm_eps"],
      use_tied_embedding=hf["tie_word_embeddings"], dtype=jnp.float32, param_dtype=jnp.float32)
  auto = (jax.sharding.AxisType.Auto,) * 2
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1], axis_types=auto)
  prompts = np.load(args.prompts)
  b, plen = prompts.shape
  strings = [" ".join(str(int(t)) for t in row) for row in prompts]
  # An end id outside the vocabulary: every row draws exactly new_tokens tokens, as in ours and HF.
  tok = IdTokenizer(eos=hf["vocab_size"] + 7)
  with jax.set_mesh(mesh):
    model = qwen3_params.create_model_from_safe_tensors(args.hf_dir, cfg, mesh)
    cache = sampler_lib.CacheConfig(cache_size=plen + args.new_tokens, num_layers=cfg.num_layers,
                                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(transformer=model, tokenizer=tok, cache_config=cache)

    def call(seed: int):
      return sampler(strings, max_generation_steps=args.new_tokens, max_prompt_length=plen, temperature=1.0,
                     top_p=1.0, top_k=None, seed=seed, return_logprobs=True, echo=False)

    t0 = time.perf_counter()
    out = call(0)
    compile_s = time.perf_counter() - t0
    print(json.dumps({"ready": True, "compile_s": compile_s, "new_tokens_per_row": [len(t) for t in out.tokens],
                      **_backend()}),
          flush=True)
    seed = 1
    for line in sys.stdin:
      cmd = line.split()
      if not cmd or cmd[0] == "quit":
        break
      times = []
      for _ in range(int(cmd[1])):
        t0 = time.perf_counter()
        out = call(seed)
        jax.block_until_ready(out.tokens)
        times.append(time.perf_counter() - t0)
        seed += 1
      print(json.dumps({"times": times}), flush=True)


if __name__ == "__main__":
  main()
