"""SFT end to end: a tiny model overfits a handful of tool conversations and then reproduces an assistant turn
greedily with its KV cache; the run's HF export and the checkpoint export agree."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import checkpoint
from agentrl_jax.models import hf_io
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.sft import masking, toy_data, trainer


def greedy(model, prompt: list[int], max_new: int, stop: int) -> list[int]:
  """Greedy decode with the model's KV cache: one prefill, then one token per step until `stop`."""

  @jax.jit
  def forward(tokens, cache):
    logits, cache = model(tokens, cache=cache)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  cache = KVCache.init(model.cfg, batch=1, max_len=len(prompt) + max_new)
  token, cache = forward(jnp.asarray([prompt], jnp.int32), cache)
  out = [int(token[0])]
  while out[-1] != stop and len(out) < max_new:
    token, cache = forward(token[:, None], cache)
    out.append(int(token[0]))
  return out


def test_sft_overfits_and_reproduces_assistant_turn(tmp_path, sft_config):
  config = sft_config("sft_tiny", "overfit")
  metrics = trainer.run(config, str(tmp_path))
  assert metrics["loss"] < 0.05, metrics
  assert metrics["skipped"] == 0.0

  lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert lines[0]["loss"] > 3.0 and lines[-1]["step"] == config.sft.num_epochs  # 4 conversations, batch 4
  assert (tmp_path / "tensorboard").is_dir() and (tmp_path / "samples.jsonl").exists()
  programs = [line["compile/programs"] for line in lines]  # the job's compiles so far: all in the first epoch
  assert len(lines) > 2 and programs[0] > 0 and programs[1:] == programs[:1] * (len(lines) - 1), programs

  # The final HF export, loaded back, answers a training conversation's first assistant turn verbatim.
  tok = tok_lib.load_tokenizer(tmp_path / "hf")
  model = hf_io.load_hf_checkpoint(tmp_path / "hf")
  row = toy_data.rows(config.data.toy_conversations, seed=config.seed, tools=config.data.toy_tools)[1]
  messages, tools = row["messages"], row["tools"]
  prompt = tok.encode(tok_lib.render_chat(tok, messages[:2], tools=tools, add_generation_prompt=True),
                      add_special_tokens=False)
  pieces = masking.render_pieces(tok, messages, tools)
  first_turn = pieces[1][0]  # "Let me compute it.\n<tool_call>...</tool_call><|im_end|>"
  assert pieces[1][1] and "print(" in first_turn
  im_end = tok.convert_tokens_to_ids(tok_lib.IM_END)
  out = greedy(model, prompt, max_new=80, stop=im_end)
  assert tok.decode(out) == first_turn

  # The checkpoint export helper writes the same weights as the trainer's in-memory export.
  hf_io_dir = checkpoint.export_hf(tmp_path / "checkpoints", tmp_path / "hf_from_ckpt")
  again = hf_io.load_hf_checkpoint(hf_io_dir)
  for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, _params(model))),
                  jax.tree.leaves(jax.tree.map(np.asarray, _params(again)))):
    np.testing.assert_array_equal(a, b)


def _params(model):
  from flax import nnx

  return nnx.state(model, nnx.Param)


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("warmup_ratio", 1.0), ("logits_chunk_size", 3)])
def test_sft_config_validates(field, value):
  from agentrl_jax.sft.step import SFTConfig

  with pytest.raises(ValueError, match=field):
    SFTConfig(**{"max_seq_len": 64, field: value})


def test_sft_recipe_config_constants(sft_config):
  config = sft_config("sft_qwen3_4b")
  assert config.job == "sft" and config.sft.batch_size == 32 and config.sft.num_epochs == 5
  assert config.sft.warmup_ratio == 0.1
  assert dict(config.optimizer) == dict(learning_rate=1e-5, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01,
                                        grad_clip=1.0, min_lr_ratio=0.0)
  smoke = sft_config("sft_qwen3_4b", "smoke")
  assert smoke.model.size == "tiny_qwen3" and smoke.data.toy_conversations > 0 and smoke.sft.max_seq_len <= 512
  with pytest.raises(ValueError, match="unknown arg"):
    sft_config("sft_qwen3_4b", "big")
