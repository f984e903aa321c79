"""Agentic RL on the embedded tasks with a tiny model: CPU runs, tests and the demo.

Run:  python -m agentrl_jax.main --config=configs/rl_toy.py --workdir=/tmp/rl_toy
Args: (none)   the arithmetic task (levels 0-2) with the real sandbox, from a tiny random or given model
      :digits  the digit-fraction sanity task (no format to learn; reward rises within a few steps)
Start from an SFT run with --config.model.checkpoint=<sft workdir>/checkpoints.
"""

import ml_collections

from agentrl_jax.models import loading


def get_config(arg=None):
  if arg not in (None, "", "digits"):
    raise ValueError(f"rl_toy: unknown arg {arg!r}; expected nothing or 'digits'")
  config = ml_collections.ConfigDict()
  config.job = "rl"
  config.seed = 0
  config.model = loading.model_block(size="tiny_qwen3", param_dtype="float32", dtype="float32")
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1, num_devices=1))
  config.data = ml_collections.ConfigDict(dict(
      train_path="", train_schema="rl", data_dir="", skip_malformed=True, shuffle=True,
      toy_task="arithmetic", toy_problems=512, toy_levels=[0, 1, 2]))
  config.prompt_style = ml_collections.ConfigDict(dict(extra_rules=[["toy_", "plain"]], default="math_units"))
  config.rollout = ml_collections.ConfigDict(dict(
      batch_size=32, max_turns=4, max_response_len=96, max_prompt_len=64, max_tool_output_chars=256,
      max_calls_per_turn=1, end_on_failed_call=False, overlap_tools=True, segment_len=16, groups_per_prefill=8,
      prompt_bucket_min=32, chunk_bucket_min=16, cache_bucket_min=64, advertise_tools=False,
      temperature=1.0, top_p=1.0, top_k=0))
  config.tools = ml_collections.ConfigDict(dict(backend="local", timeout_s=5.0, memory_mb=512, max_concurrency=0))
  config.reward = ml_collections.ConfigDict(dict(
      math_mode="strict", overlong_buffer_tokens=16, overlong_penalty_factor=1.0, tool_call_bonus=0.1,
      tool_call_cap=-0.6, sources=[]))
  config.rl = ml_collections.ConfigDict(dict(
      n=4, prompts_per_step=8, mini_batch_prompts=4, micro_batch_size=8, epochs_per_batch=1, total_epochs=1,
      total_steps=20, dynamic_sampling=False, dynamic_sampling_max_extra_rounds=2, reuse_sampler_logp=False,
      response_bucket_min=32, logits_chunk_size=0,
      loss=dict(clip_low=0.2, clip_high=0.28, dual_clip_c=10.0, loss_agg_mode="token-mean", entropy_coeff=0.0,
                kl_coeff=0.0),
      advantage=dict(estimator="grpo", norm_by_std=True)))
  config.optimizer = ml_collections.ConfigDict(dict(learning_rate=3e-3, b1=0.9, b2=0.999, weight_decay=0.01,
                                                    grad_clip=1.0, schedule="constant", warmup_steps=0))
  config.eval = ml_collections.ConfigDict(dict(sources=[], every_steps=0, at_start=False, n=4, temperature=1.0,
                                               top_p=0.6, top_k=0, ks=[1, 4], samples_to_log=8))
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=10, max_to_keep=2, async_save=False))
  config.log_every_steps = 1
  config.samples_every_steps = 10
  config.samples_per_log = 4
  config.wandb_project = ""
  if arg == "digits":
    config.data.update(toy_task="digits", toy_problems=64)
    config.rollout.update(max_turns=1, max_response_len=16, segment_len=16)
    config.reward.update(overlong_buffer_tokens=0, tool_call_bonus=0.0, sources=[["toy_digits", "digit_fraction"]])
    config.rl.update(n=8, prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=16, total_steps=12)
    config.optimizer.learning_rate = 1e-2
  config.lock()
  return config
