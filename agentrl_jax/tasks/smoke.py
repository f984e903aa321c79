"""Smoke job: build (or load) a model and tokenizer, render a chat prompt, prefill and greedily decode.

Shows that the installation works end to end on any machine; it is what `launch/local.sh` runs until the
embedded agentic RL demo lands.
"""

import logging
import time

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections

from agentrl_jax import testing
from agentrl_jax.models import hf_io, tokenizer as tok_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.tools.code_interpreter import TOOL_SCHEMA

log = logging.getLogger(__name__)


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  del workdir
  m = config.model
  if m.hf_path:
    model = hf_io.load_hf_checkpoint(m.hf_path)
    tokenizer = tok_lib.load_tokenizer(m.tokenizer_path or m.hf_path)
  else:
    tokenizer = tok_lib.load_tokenizer(m.tokenizer_path) if m.tokenizer_path else testing.tiny_tokenizer()
    model = testing.tiny_model(ModelConfig.by_name(m.size, vocab_size=len(tokenizer)), seed=config.seed)
  text = tok_lib.render_chat(tokenizer, [{"role": "user", "content": config.prompt}], tools=[TOOL_SCHEMA],
                             add_generation_prompt=True)
  prompt = jnp.asarray([tokenizer.encode(text, add_special_tokens=False)], jnp.int32)
  graphdef, state = nnx.split(model)

  @jax.jit
  def step(state, tokens, cache):
    logits, cache = nnx.merge(graphdef, state)(tokens, cache=cache)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  t0 = time.perf_counter()
  cache = KVCache.init(model.cfg, batch=1, max_len=prompt.shape[1] + config.max_new_tokens)
  token, cache = step(state, prompt, cache)
  out = [int(token[0])]
  for _ in range(config.max_new_tokens - 1):
    token, cache = step(state, token[:, None], cache)
    out.append(int(token[0]))
  completion = tokenizer.decode(out)
  msg = (f"smoke: {model.cfg.family} with {model.cfg.param_count():,} params, prompt {prompt.shape[1]} tokens, "
         f"{len(out)} greedy tokens in {time.perf_counter() - t0:.2f}s (random weights: the text is noise)")
  print(msg)
  print(f"smoke: completion {completion!r}")
  print("smoke: the embedded end-to-end agentic RL demo is not built yet; this job only checks the installation.")
  return completion
