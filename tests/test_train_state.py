"""The train state SFT and RL share: optimizer config validation and schedules; with LoRA, only the adapters
train (RL update and SFT step, one device and 8), are checkpointed and restored onto the base, and the KL
reference is the base itself."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import checkpoint, testing, train_state
from agentrl_jax.models import loading, lora, sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rl import losses
from agentrl_jax.rl import update as update_lib


@pytest.mark.parametrize("field,value", [("learning_rate", -1.0), ("b2", 1.0), ("grad_clip", 0.0),
                                         ("schedule", "linear"), ("warmup_steps", -1), ("eps", float("nan"))])
def test_optimizer_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    train_state.OptimizerConfig(**{field: value})


def test_cosine_schedule():
  with pytest.raises(ValueError, match="total_steps"):
    train_state.OptimizerConfig(schedule="cosine")
  sched = train_state.OptimizerConfig(learning_rate=1.0, schedule="cosine", warmup_steps=10, total_steps=110,
                                      min_lr_ratio=0.1).make_schedule()
  assert float(sched(0)) == 0.0 and float(sched(5)) == pytest.approx(0.5)
  assert float(sched(10)) == pytest.approx(1.0) and float(sched(110)) == pytest.approx(0.1)
  assert float(train_state.OptimizerConfig().make_schedule()(1000)) == pytest.approx(1e-6)


# ------------------------------------------------------------------------------------------------------------
# LoRA: only the adapters train, are sharded like their weights, are checkpointed and restored onto the base
# ------------------------------------------------------------------------------------------------------------

B, T = 8, 32
CFG = ModelConfig.tiny_qwen3(num_layers=2)
LORA = lora.LoraConfig(rank=4, alpha=8.0)
OPT = train_state.OptimizerConfig(learning_rate=1e-2, weight_decay=0.01)
# eps 1, no decay or clip: a step moves each param by -lr g / (|g| + 1), smooth in the gradient, so comparing
# params compares gradients (Adam's g / |g| would amplify round-off in tiny ones).
GRAD_PROBE = train_state.OptimizerConfig(learning_rate=1.0, eps=1.0, weight_decay=0.0, grad_clip=None)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  for i in range(B):
    mask[i, 6:T - i] = 1
  return {"tokens": rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32), "loss_mask": mask,
          "advantages": rng.standard_normal(B).astype(np.float32),
          "old_logp": (-6.0 + 0.5 * rng.standard_normal((B, T))).astype(np.float32)}


def _lora_model(lora_cfg=LORA):
  return lora.apply(testing.tiny_model(CFG, seed=2), lora_cfg, jax.random.key(5))


def _run(mesh, lora_cfg=LORA, steps=2, opt=OPT):
  graphdef, state = train_state.init_train_state(_lora_model(lora_cfg), opt, mesh)
  shardings = train_state.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), opt, mesh, micro_batch_size=4,
                                     logits_chunk_size=16)
  before = jax.tree.map(np.asarray, state.params)
  metrics = []
  for i in range(steps):
    state, m = update(state, _batch(i), jax.random.key(i))
    metrics.append({k: float(v) for k, v in m.items()})
  return graphdef, state, before, metrics


def _single():
  return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def test_lora_update_trains_the_adapters_alone():
  graphdef, state, before, metrics = _run(_single())
  assert all(m["skipped"] == 0.0 for m in metrics)
  # AdamW moments exist for the adapters only.
  moments = state.opt_state[0].mu
  assert all(isinstance(v, nnx.LoRAParam)
             for v in jax.tree.leaves(moments, is_leaf=lambda x: isinstance(x, nnx.Variable)))
  assert len(jax.tree.leaves(moments)) == 2 * len(lora.TARGETS)
  adapters, base = lora.split(state.params)
  adapters0, base0 = lora.split(before)
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(base0)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()  # the base weights: bit for bit
  moved = [float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(jax.tree.leaves(adapters),
                                                                      jax.tree.leaves(adapters0))]
  assert min(moved) > 0
  # A checkpoint holds the adapters (and their moments) only.
  saved = train_state.checkpointed(state)
  assert len(jax.tree.leaves(saved.params)) == 2 * len(lora.TARGETS)
  assert saved.opt_state is state.opt_state and saved.step is state.step


def test_lora_update_on_8_devices_matches_one_device():
  assert len(jax.devices()) == 8, "conftest sets 8 fake CPU devices"
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  _, s1, _, m1 = _run(_single(), opt=GRAD_PROBE)
  _, s8, _, m8 = _run(mesh, opt=GRAD_PROBE)
  q_b = s8.params["layers"]["attn"]["q_lora_b_rnh"].get_value()
  assert q_b.sharding.spec == jax.P(None, None, "tensor", None)  # B shards like q's heads
  q_a = s8.params["layers"]["attn"]["q_lora_a_dr"].get_value()
  assert q_a.sharding.spec == jax.P(None, "fsdp", None)  # A like q's embed dimension
  assert s8.opt_state[0].mu["layers"]["attn"]["q_lora_b_rnh"].get_value().sharding.spec == q_b.sharding.spec
  for a, b in zip(m1, m8):
    for k in a:
      assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), k
  assert m1[1]["grad_norm"] > 0
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_lora_dropout_uses_the_update_key():
  lora_cfg = lora.LoraConfig(rank=4, alpha=8.0, dropout=0.3)
  mesh = _single()
  graphdef, state = train_state.init_train_state(_lora_model(lora_cfg), OPT, mesh)
  shardings = train_state.train_state_shardings(state, mesh)
  host = jax.device_get(state)
  update = update_lib.make_update_fn(graphdef, shardings, losses.LossConfig(), OPT, mesh, micro_batch_size=4,
                                     logits_chunk_size=16)
  # B is 0 at the start, so the loss does not see the masks, but B's gradient (x A through the mask) does.
  norm = lambda key: float(update(jax.device_put(host, shardings), _batch(0), key)[1]["grad_norm"])  # noqa: E731
  a, b, c = norm(jax.random.key(1)), norm(jax.random.key(1)), norm(jax.random.key(2))
  assert a == b and abs(a - c) > 1e-6 * a


def test_lora_sft_step_trains_the_adapters_alone():
  from agentrl_jax.sft import step as step_lib

  mesh = sharding.make_mesh(1, 2, 1, devices=jax.devices()[:2])
  opt = train_state.OptimizerConfig(learning_rate=3e-2, b2=0.95)
  graphdef, state = train_state.init_train_state(_lora_model(), opt, mesh)
  before = jax.tree.map(np.asarray, lora.split(state.params)[1])
  step = step_lib.make_train_step(graphdef, train_state.train_state_shardings(state, mesh), opt, mesh, micro_rows=2,
                                  seq_len=T)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (2, 2, T + 1)).astype(np.int32)
  batch = {"inputs": tokens[..., :-1], "targets": tokens[..., 1:], "weights": np.ones((2, 2, T), np.float32),
           "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (2, 2, T)).copy(),
           "segment_ids": np.ones((2, 2, T), np.int32)}
  losses_ = []
  for i in range(4):
    state, m = step(state, batch, jax.random.key(i))
    losses_.append(float(m["loss"]))
  assert losses_[-1] < losses_[0] - 0.05, losses_
  for a, b in zip(jax.tree.leaves(lora.split(state.params)[1]), jax.tree.leaves(before)):
    assert np.asarray(a).tobytes() == b.tobytes()


def test_restore_puts_the_adapters_back_onto_the_base(tmp_path):
  """The trainers' start with LoRA: a checkpoint holds adapters, moments, step and key only, and a restart
  restores them onto the base that the model block loads again, bit for bit."""
  mesh = _single()
  block = loading.model_block(size="tiny_qwen3", tokenizer_path=testing.tiny_tokenizer_dir(), param_dtype="float32",
                              dtype="float32")
  _, model_cfg = loading.tokenizer_and_config(block)
  root, init_key = jax.random.key(0), jax.random.key(1)
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt", checkpoint.CheckpointConfig(every_steps=1))
  graphdef, state, rng, step, meta = train_state.init_or_restore_train_state(
      ckpt, block, model_cfg, OPT, mesh, root_key=root, init_key=init_key, lora=LORA)
  assert step == 0 and meta == {}
  update = update_lib.make_update_fn(graphdef, train_state.train_state_shardings(state, mesh), losses.LossConfig(),
                                     OPT, mesh, micro_batch_size=4, logits_chunk_size=16)
  state, _ = update(state, _batch(0), jax.random.key(0))
  ckpt.save(1, {"train": train_state.checkpointed(state), "rng": rng},
            metadata={"model_config": dataclasses.asdict(model_cfg),  # as the trainers record it
                      **train_state.checkpoint_metadata(block, init_key, LORA)})
  ckpt.close()
  want = jax.tree.map(np.asarray, state)

  with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
    saved = ckpt.saved_shapes()["train"]["params"]
    assert sorted(saved["layers"]) == ["attn", "mlp"]
    assert all("_lora_" in name for part in saved["layers"].values() for name in part)  # no base weight saved
    graphdef2, state2, _, step2, meta2 = train_state.init_or_restore_train_state(
        ckpt, block, model_cfg, OPT, mesh, root_key=root, init_key=init_key, lora=LORA)
  assert step2 == 1 and meta2["lora"]["config"]["rank"] == LORA.rank
  got = jax.tree.map(np.asarray, state2)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()

  # The checkpoint loads on its own (evaluation, export): the base of its metadata, adapters folded in.
  tokens = testing.random_tokens(jax.random.key(3), 2, 12, model_cfg.vocab_size)
  adapted = testing.jit_forward(nnx.merge(graphdef2, state2.params))(tokens)[0]
  plain = checkpoint.load_model(tmp_path / "ckpt", model_cfg, mesh)
  assert not nnx.state(plain, nnx.LoRAParam)
  assert float(jnp.max(jnp.abs(testing.jit_forward(plain)(tokens)[0] - adapted))) <= 2e-5
  # A `model` block naming the checkpoint (an eval or a later stage) loads the same model through the checkpoint
  # module; `models.loading` does not read our checkpoints and says where they are read.
  named = loading.model_block(checkpoint=str(tmp_path / "ckpt"), tokenizer_path=testing.tiny_tokenizer_dir())
  assert checkpoint.tokenizer_and_config(named)[1] == model_cfg
  by_block = checkpoint.load_policy(named, mesh, jax.random.key(9))[1]
  for a, b in zip(jax.tree.leaves(nnx.state(by_block)), jax.tree.leaves(nnx.state(plain))):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  with pytest.raises(ValueError, match="agentrl_jax.checkpoint"):
    loading.tokenizer_and_config(named)


def test_reference_policy_with_lora_is_the_base_without_a_copy():
  mesh = _single()
  graphdef, state, _, _ = _run(mesh, steps=1)
  reference = train_state.reference_policy(None, mesh, jax.random.key(0), LORA)  # no model is loaded for LoRA
  ref = reference(state.params)
  logprobs = update_lib.make_logprobs_fn(graphdef, train_state.train_state_shardings(state, mesh).params, mesh,
                                         micro_batch_size=4)
  batch = {"tokens": _batch(0)["tokens"]}
  base_model = testing.tiny_model(CFG, seed=2)
  base_graphdef, base_params = nnx.split(base_model)
  want = update_lib.token_logprobs(base_graphdef, base_params, batch, logits_chunk_size=None)[0]
  np.testing.assert_allclose(np.asarray(logprobs(ref, batch)), np.asarray(want), atol=1e-5)
  assert float(np.max(np.abs(np.asarray(logprobs(state.params, batch)) - np.asarray(want)))) > 1e-4
  q = ref["layers"]["attn"]["q_dnh"].get_value()
  assert q is state.params["layers"]["attn"]["q_dnh"].get_value()  # the policy's own base weights


def test_abstract_lora_train_state_has_adapter_moments_only():
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  graphdef, abstract = train_state.abstract_train_state(ModelConfig.qwen3_4b(), OPT, mesh, lora.LoraConfig(rank=16))
  moments = jax.tree.leaves(abstract.opt_state[0].mu)
  params = jax.tree.leaves(abstract.params)
  assert len(moments) == 14 and len(params) > len(moments)
  adapter_count = sum(int(np.prod(m.shape)) for m in moments)
  base_count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(lora.split(abstract.params)[1]))
  assert adapter_count < 0.02 * base_count  # rank 16 on a 4B model: ~0.8% of the weights
  assert isinstance(graphdef, nnx.GraphDef)


def test_sampler_policy_is_the_state_itself_or_the_merged_adapters():
  mesh = sharding.make_mesh(data=1, fsdp=2, tensor=2, devices=jax.devices()[:4])
  full_def, full = train_state.init_train_state(testing.tiny_model(CFG, seed=2), OPT, mesh)
  graphdef, to_sampler = train_state.sampler_policy(full_def, full.params, mesh)
  assert graphdef is full_def and to_sampler(full.params) is full.params  # read in place, no copy

  graphdef, state, _, _ = _run(mesh, steps=1)
  plain_def, to_sampler = train_state.sampler_policy(graphdef, state.params, mesh)
  merged = to_sampler(state.params)
  assert not nnx.state(nnx.merge(plain_def, merged), nnx.LoRAParam)
  q = merged["layers"]["attn"]["q_dnh"].get_value()
  assert q.sharding.spec == jax.P(None, "fsdp", "tensor", None)  # laid out like the weights it replaces
  tokens = _batch(0)["tokens"]
  want = testing.jit_forward(nnx.merge(graphdef, state.params))(tokens)[0]
  got = testing.jit_forward(nnx.merge(plain_def, merged))(tokens)[0]
  assert float(jnp.max(jnp.abs(got - want))) <= 2e-5
  # On an accelerator the merged copy is stored in the compute dtype, which is what the matmuls read.
  bf16_def, bf16_state = train_state.abstract_train_state(CFG.replace(dtype="bfloat16"), OPT, mesh, LORA)
  _, to_bf16 = train_state.sampler_policy(bf16_def, bf16_state.params, mesh)
  assert {x.dtype for x in jax.tree.leaves(jax.eval_shape(to_bf16, bf16_state.params))} == {jnp.dtype(jnp.bfloat16)}
