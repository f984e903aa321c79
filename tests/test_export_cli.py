"""`python -m agentrl_jax.checkpoint RUN/checkpoints OUT`: a trained run's Orbax checkpoint becomes a HF directory
with standard file names that `transformers` loads with the same logits, the same tokenizer and chat template."""

import json
import os

import jax
import jax.numpy as jnp
import transformers

from agentrl_jax import checkpoint, testing
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.sft import trainer


def test_export_of_a_trained_run_loads_in_transformers(tmp_path):
  config = testing.load_config("sft_tiny", None, **{"model.tokenizer_path": testing.tiny_tokenizer_dir(),
                                                    "sft.num_epochs": 1})
  trainer.run(config, str(tmp_path / "run"))
  ckpt_dir = tmp_path / "run" / "checkpoints"
  out = checkpoint.main([str(ckpt_dir), str(tmp_path / "hf")])  # tokenizer from the checkpoint's metadata
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    assert os.path.isfile(os.path.join(out, name)), name
  hf_config = json.load(open(os.path.join(out, "config.json")))
  assert hf_config["architectures"] == ["Qwen3ForCausalLM"] and hf_config["model_type"] == "qwen3"
  tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  ours_tok = tok_lib.load_tokenizer(testing.tiny_tokenizer_dir())
  messages = [{"role": "user", "content": "Compute 3*4."}]
  assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
      ours_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  gen = json.load(open(os.path.join(out, "generation_config.json")))
  assert tok.convert_tokens_to_ids(tok_lib.IM_END) in gen["eos_token_id"]

  cfg = checkpoint.model_config_of(ckpt_dir)
  ours = checkpoint.load_model(ckpt_dir, cfg, sharding_lib.make_mesh(1, 1, 1, jax.devices()[:1]))
  tokens = testing.random_tokens(jax.random.key(0), 2, 11, cfg.vocab_size)
  diff = jnp.abs(testing.jit_forward(ours)(tokens)[0] - testing.hf_logits(testing.load_hf_torch(out), tokens))
  assert float(jnp.max(diff)) <= 1e-4



def test_export_of_a_lora_run_folds_the_adapters_in(tmp_path):
  """A LoRA SFT run's checkpoint holds its adapters only; the export folds them into the base weights, and
  `transformers` computes the logits of the adapted (unmerged) model."""
  from flax import nnx

  from agentrl_jax import train_state
  from agentrl_jax.models import lora as lora_lib

  config = testing.load_config("sft_tiny", None, **{"model.tokenizer_path": testing.tiny_tokenizer_dir(),
                                                    "sft.num_epochs": 1, "lora.rank": 4, "lora.alpha": 8.0,
                                                    "optimizer.learning_rate": 3e-2})
  trainer.run(config, str(tmp_path / "run"))
  ckpt_dir = tmp_path / "run" / "checkpoints"
  with checkpoint.Checkpointer(ckpt_dir) as ckpt:
    saved = jax.tree_util.tree_flatten_with_path(ckpt.saved_shapes()["train"]["params"])[0]
    assert saved and all("_lora_" in jax.tree_util.keystr(path) for path, _ in saved)  # adapters only
  out = checkpoint.main([str(ckpt_dir), str(tmp_path / "hf")])

  # The adapted model as the trainer left it: the base of the run's model block, the adapters restored onto it.
  mesh = sharding_lib.make_mesh(1, 1, 1, jax.devices()[:1])
  cfg = checkpoint.model_config_of(ckpt_dir)
  lora = lora_lib.LoraConfig.from_block(config.lora)
  with checkpoint.Checkpointer(ckpt_dir) as ckpt:
    graphdef, state, _, _, _ = train_state.init_or_restore_train_state(
        ckpt, config.model, cfg, train_state.OptimizerConfig(), mesh, root_key=jax.random.key(0),
        init_key=jax.random.split(jax.random.key(config.seed))[0], lora=lora)
  adapted = nnx.merge(graphdef, state.params)
  assert float(jnp.max(jnp.abs(adapted.layers.attn.q_lora_b_rnh[...]))) > 0  # the adapters did train
  tokens = testing.random_tokens(jax.random.key(0), 2, 11, cfg.vocab_size)
  want = testing.jit_forward(adapted)(tokens)[0]
  base = testing.jit_forward(checkpoint.load_policy(config.model, mesh, jax.random.split(jax.random.key(0))[0])[1])
  assert float(jnp.max(jnp.abs(base(tokens)[0] - want))) > 1e-3
  diff = jnp.abs(testing.hf_logits(testing.load_hf_torch(out), tokens) - want)
  assert float(jnp.max(diff)) <= 1e-4
