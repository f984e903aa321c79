"""bf16 compute on float32 master weights: the dtype the recipe configs choose by backend, how far the bf16
policy's log-probs are from float32 on a tiny model, and how far the trainer's log-probs are from the sampler's
in bf16 (the PPO ratio's precision gap; measured on this machine: bf16 vs float32 at most 2.9e-3 nats, trainer vs
sampler at most 3.1e-4 nats, so the ratio stays within 1 +- 4e-4 of the truth, far inside the 0.2 clip: TIS is
not needed at this scale, and `rl.loss.tis_cap` covers larger gaps)."""

import jax
from flax import nnx
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import loading
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import recipe
from agentrl_jax.rl import update as update_lib
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.generate import generate
from agentrl_jax.sampling.sampler import make_sampler

PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29], [3, 6, 9, 12]]
NEW, N = 48, 4


def test_recipe_configs_choose_bf16_on_accelerators(monkeypatch):
  for config in (recipe.rl_config(), recipe.sft_config()):
    assert (config.model.dtype, config.model.param_dtype) == ("auto", "float32")
  assert loading.compute_dtype("auto") == "float32"  # this CPU: bf16 matmuls are emulated here
  for backend in ("tpu", "gpu"):
    monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
    assert loading.compute_dtype("auto") == "bfloat16"
  assert loading.compute_dtype("float32") == "float32" and loading.compute_dtype("bfloat16") == "bfloat16"


def _rollout(dtype):
  cfg = ModelConfig.tiny_qwen3(dtype=dtype, param_dtype="float32")
  graphdef, params = nnx.split(testing.tiny_model(cfg, seed=4))
  sampler = make_sampler(graphdef, cfg, SamplingConfig(temperature=1.0, segment_len=16), batch=len(PROMPTS) * N)
  out = generate(sampler, params, PROMPTS, key=jax.random.key(1), max_new_tokens=NEW, n=N)
  score = jax.jit(lambda p, t: update_lib.token_logprobs(graphdef, p, {"tokens": t}, logits_chunk_size=None)[0])
  return out, lambda tokens: np.asarray(score(params, tokens))


def _rows(out):
  """Prompt + drawn tokens per row, the mask of the drawn ones and the sampler's log-probs at them."""
  tokens = np.zeros((len(out.tokens), 8 + NEW), np.int32)
  mask, logp = np.zeros(tokens.shape, bool), np.zeros(tokens.shape, np.float32)
  for i, drawn in enumerate(out.tokens):
    p = PROMPTS[i // N]
    tokens[i, :len(p)], tokens[i, len(p):len(p) + len(drawn)] = p, drawn
    mask[i, len(p):len(p) + len(drawn)], logp[i, len(p):len(p) + len(drawn)] = True, out.logp_raw[i]
  return tokens, mask, logp


@pytest.fixture(scope="module")
def rollouts():
  return {dtype: _rollout(dtype) for dtype in ("float32", "bfloat16")}


def test_bf16_log_probs_stay_near_float32(rollouts):
  tokens, mask, _ = _rows(rollouts["float32"][0])
  gap = np.abs(rollouts["bfloat16"][1](tokens) - rollouts["float32"][1](tokens))[mask]
  assert gap.max() < 1e-2 and gap.mean() < 2e-3, (gap.max(), gap.mean())


# bf16: the sampler's decode on XLA:CPU runs its layers one by one (the cache carried per layer) while the
# trainer scans them, so XLA fuses the bf16 ops differently on each side; the float32 case (same programs,
# 1e-5) shows the paths are the same computation, and the bf16 gap stays a fraction of bf16's 2^-8.
@pytest.mark.parametrize("dtype,max_gap", [("float32", 1e-5), ("bfloat16", 3e-3)])
def test_trainer_log_probs_follow_the_samplers_precision_path(rollouts, dtype, max_gap):
  """The update's ratio exp(logp_trainer - logp_sampler) on the sampler's own draws: the same dtype path on
  both sides (bf16 matmuls, float32 logits and log-softmax), so the gap is rounding, not a bias."""
  out, score = rollouts[dtype]
  tokens, mask, sampler_logp = _rows(out)
  gap = (score(tokens) - sampler_logp)[mask]
  assert np.abs(gap).max() < max_gap, np.abs(gap).max()
  assert abs(gap.mean()) < max_gap / 10  # no systematic offset
