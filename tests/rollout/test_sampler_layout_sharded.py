"""The sampler on its own layout (tensor parallel) while the trainer's params are FSDP, on 8 fake CPU devices:
params move device to device, and multi-turn rollouts equal those under the trainer's layout."""

import json

from flax import nnx
import jax
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import sharding
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.rollout import agent_loop
from agentrl_jax.rollout.chat import stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.sampler import make_sampler
from agentrl_jax.tools import ExecResult

B, SEG, F = 8, 16, 64
CFG = RolloutConfig(batch_size=B, segment_len=SEG, max_prompt_len=64, max_response_len=96, max_turns=3,
                    prompt_bucket_min=64, chunk_len=64, cache_bucket_min=256)
CALL = "Let me compute.\n<tool_call>\n" + json.dumps(
    {"name": "code_interpreter", "arguments": {"code": "print(6*7)"}}) + "\n</tool_call>"


def _rollout(sampler, params, tok, prompts, scripts):
  ex = stub_executor(lambda code: ExecResult("ok", stdout="42\n"))
  try:
    return agent_loop.run_rollout(sampler, params, prompts, n=2, tokenizer=tok, executor=ex, cfg=CFG,
                                  key=jax.random.key(5), scripts=scripts)
  finally:
    ex.close()


def test_sharded_rollouts_under_the_sampler_layout_equal_the_trainer_layout():
  assert jax.device_count() == 8
  tok = testing.tiny_tokenizer()
  model = testing.tiny_model(seed=3)
  graphdef, params = nnx.split(model)
  end, tool_end = stop_token_ids(tok)
  sc = SamplingConfig(end_token_ids=end, tool_end_token_ids=tool_end, segment_len=SEG, temperature=1.0)
  train_mesh = sharding.make_mesh(data=1, fsdp=8, tensor=1)
  sampler_mesh = sharding.sampler_mesh_from_config(dict(data=4, fsdp=1, tensor=2), train_mesh)
  assert sharding.sampler_mesh_from_config(dict(data=0, fsdp=0, tensor=0), train_mesh) is train_mesh
  assert set(sampler_mesh.devices.flat) == set(train_mesh.devices.flat)

  on_train = make_sampler(graphdef, model.cfg, sc, batch=B, mesh=train_mesh, params=params, n_forced=F)
  train_params = on_train.place_params(params)  # the trainer's layout: FSDP over the embed dimension
  q = train_params["layers"]["attn"]["q_dnh"].get_value()
  assert q.sharding.spec == jax.P(None, "fsdp", None, None)

  on_tp = make_sampler(graphdef, model.cfg, sc, batch=B, mesh=sampler_mesh, params=train_params, n_forced=F)
  # Device to device: a host round trip of any parameter would raise here.
  with jax.transfer_guard_device_to_host("disallow"), jax.transfer_guard_host_to_device("disallow"):
    tp_params = on_tp.place_params(train_params)
    jax.block_until_ready(tp_params)
  q_tp = tp_params["layers"]["attn"]["q_dnh"].get_value()
  assert q_tp.sharding.spec == jax.P(None, None, "tensor", None)  # heads split over the tensor axis
  assert q_tp.sharding.mesh.shape == sampler_mesh.shape
  np.testing.assert_array_equal(np.asarray(q_tp), np.asarray(q))

  questions = ["What is 6*7?", "Compute 12+30.", "What is 2**5?", "Sum 1..5?"]
  prompts = [tok.encode(tokenizer_lib.render_chat(tok, [{"role": "user", "content": text}], add_generation_prompt=True),
                        add_special_tokens=False) for text in questions]
  # Half the episodes open with a tool call (forced), so the tool response extends the cache under each layout;
  # everything after is sampled freely.
  call = tok.encode(CALL, add_special_tokens=False)
  scripts = [[call] if i % 2 == 0 else [] for i in range(len(prompts) * 2)]
  ref, _ = _rollout(on_train, train_params, tok, prompts, scripts)
  out, stats = _rollout(on_tp, tp_params, tok, prompts, scripts)
  assert sum(e.num_tool_calls for e in out) >= 4 and stats.extend_calls >= 1
  for a, b in zip(ref, out):
    assert a.response_ids.tolist() == b.response_ids.tolist()
    assert a.loss_mask.tolist() == b.loss_mask.tolist()
    # Tensor-parallel matmuls sum their partial products in another order: equal up to float32 rounding.
    np.testing.assert_allclose(a.logp_raw, b.logp_raw, atol=2e-5, rtol=0)


@pytest.mark.parametrize("block", [dict(data=3, fsdp=1, tensor=1), dict(data=-1, fsdp=-1, tensor=1)])
def test_sampler_mesh_that_does_not_fit_the_devices_is_refused(block):
  train_mesh = sharding.make_mesh(data=1, fsdp=8, tensor=1)
  with pytest.raises(ValueError, match="make_mesh"):
    sharding.sampler_mesh_from_config(block, train_mesh)
