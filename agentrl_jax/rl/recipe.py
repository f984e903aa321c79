"""The recipe of "Demystifying Reinforcement Learning in Agentic Reasoning" as config blocks: GRPO-TCR RL
(`rl_config`) and the SFT stage before it (`sft_config`).

`configs/demystify_*.py` build on `rl_config()` and `configs/sft_*.py` on `sft_config()`, changing the model;
`configs/rl_toy.py` shrinks the RL config. Every recipe constant lives here once; tests/test_recipe_constants.py
holds each against the line of the reference script (Gen-Verse/Open-AgentRL, recipe/demystify/) it comes from:

  loss        token-mean, clip 0.2 / 0.28 (clip-higher), dual clip 10, KL 0, entropy coefficient 0
  optimizer   AdamW lr 1e-6 constant, weight decay 0.01, betas (0.9, 0.999), grad clip 1.0
  batch       64 prompts x 16 samples per step, mini-batch 16 prompts, 1 epoch per batch, 3 epochs of data
  lengths     prompt <= 2560 tokens (eval: 4096), response <= 20480 tokens (tool output included), <= 16 turns
  tool        code interpreter, 30 s and 2048 MB per call, one call per turn
  shaping     overlong buffer 4096 tokens with factor 1.0 (DAPO), counted in tokens
  sampling    train T=1.0 top_p=1.0; validation n=32, T=1.0, top_p=0.6, 20 generations logged; test every 10
              steps, save every 30
  SFT         AdamW lr 1e-5, betas (0.9, 0.95), weight decay 0.01, 10% warmup then cosine, grad clip 1.0, batch
              32, 5 epochs, 32768 tokens with right truncation, save every 62 steps

Choices where the reference is silent or buggy (documented at the field): tool output kept to 2048 characters
(the reference's 256 hides tracebacks), tool-call shaping applied with the number of executed calls (the
reference's is silently constant), dynamic sampling available but off (the reference defines it and never
applies it), malformed tool calls answered with an error the model can recover from.
"""

from __future__ import annotations

import os

import ml_collections

from agentrl_jax.models import loading
from agentrl_jax.models import lora

# The real AIME 2024 copy shipped beside the project checkout (../shared/data); never copied into the repo.
SHARED_AIME2024 = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                "shared", "data", "aime2024.jsonl"))
_TRAINING_BLOCKS = ("rl", "optimizer", "lora", "eval", "checkpoint", "log_every_steps", "samples_every_steps",
                    "samples_per_log", "wandb_project")


def eval_sources(root: str) -> list[dict]:
  """The recipe's four evaluation sets as local files under `root` (names as the public datasets ship them)."""
  return [
      dict(name="AIME2024", path=f"{root}/aime2024.jsonl", schema="aime2024"),
      dict(name="AIME2025", path=f"{root}/aime2025.parquet", schema="aime2025"),
      dict(name="GPQA-Diamond", path=f"{root}/gpqa_diamond.parquet", schema="gpqa_diamond"),
      dict(name="LiveCodeBench-v6", path=f"{root}/livecodebench_v6.parquet", schema="livecodebench_v6"),
  ]


def rl_config(**model) -> ml_collections.ConfigDict:
  """The full RL config with the recipe's constants; `model` fields go to the model block."""
  config = ml_collections.ConfigDict()
  config.job = "rl"
  config.seed = 0
  config.model = loading.model_block(**{"size": "qwen3_4b", "param_dtype": "float32", "dtype": "auto",
                                        "attention_impl": "auto", "remat": True, **model})
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, context=1, tensor=1, num_devices=0))
  # The rollouts' layout over the same devices (e.g. data=1, fsdp=1, tensor=-1); all zero: the trainer's mesh.
  config.sampler_mesh = ml_collections.ConfigDict(dict(data=0, fsdp=0, tensor=0))
  config.data = ml_collections.ConfigDict(dict(
      train_path="",                 # the recipe's RL parquet (prompt, data_source, reward_model, extra_info)
      train_schema="rl", data_dir="", skip_malformed=True, shuffle=True,
      toy_task="arithmetic", toy_problems=0, toy_levels=[0, 1, 2, 3]))
  config.prompt_style = ml_collections.ConfigDict(dict(extra_rules=[["toy_", "plain"]], default="math_units"))
  config.rollout = ml_collections.ConfigDict(dict(
      # Row slots decoded together (a finished episode frees its slot). Each holds the full 23,105-slot KV cache:
      # 128 rows fit a v5p-16 beside the training state (256 need ~106 GiB a chip of its 95); on a larger slice
      # raise it to what `python -m agentrl_jax.aot --topology=...` says fits.
      batch_size=128,
      max_turns=16, max_response_len=20480, max_prompt_len=2560,
      max_tool_output_chars=2048,    # the reference keeps 256 characters, which hides most tracebacks
      max_calls_per_turn=1,
      end_on_failed_call=False,      # the reference ends the episode; we answer with the error instead
      overlap_tools=False,           # pause the batch while tools run: measured faster up to ~1 s per call
      # Few programs (`python -m agentrl_jax.aot` lists them): every prefill call pads to 8 groups and to one
      # prompt bucket (the longest prompt), so prefill compiles once; on a TPU the padding rows cost a fraction
      # of a second per wave next to minutes of decoding, where each program costs tens of seconds to compile.
      segment_len=64, groups_per_prefill=8, pad_prefill_groups=True, prompt_bucket_min=2560, chunk_len=64,
      cache_bucket_min=1024,
      extend_rows=0,                 # tool responses appended to every row slot in place (RolloutConfig)
      advertise_tools=True,
      temperature=1.0, top_p=1.0, top_k=0))
  config.tools = ml_collections.ConfigDict(dict(
      backend="local",               # or "sandbox_fusion" with sandbox_fusion_url (the recipe's service)
      sandbox_fusion_url="", timeout_s=30.0, memory_mb=2048, max_concurrency=0, allow_unsandboxed=False,
      local_mode="worker"))          # local: one long-lived sandbox per slot forks each call ("per_call": fresh)
  config.reward = ml_collections.ConfigDict(dict(
      math_mode="strict",            # the recipe's exact compare; "equiv" accepts LaTeX-equivalent answers
      overlong_buffer_tokens=4096, overlong_penalty_factor=1.0,
      tool_call_bonus=0.1, tool_call_cap=-0.6,   # min(-0.6, score + 0.1 * calls) for wrong answers
      tool_call_count="executed",    # which calls count: only those the executor ran (not malformed text)
      sources=[]))                   # extra [data_source, reward kind] pairs
  config.rl = ml_collections.ConfigDict(dict(
      n=16, prompts_per_step=64, mini_batch_prompts=16, micro_batch_size=16, epochs_per_batch=1, total_epochs=3,
      total_steps=0,                 # 0: total_epochs over the training prompts
      dynamic_sampling=False, dynamic_sampling_max_extra_rounds=3,
      reuse_sampler_logp=False,      # True: the sampler's log-probs as the old policy's (no recompute pass)
      max_infra_failure_frac=0.05,   # stop when more of a step's responses cannot be scored (sandbox down, ...)
      max_consecutive_nonfinite_steps=3,  # stop after this many steps in a row with a non-finite update
      response_bucket_min=1024, logits_chunk_size=1024,
      # > 0: episodes packed into rows of this many tokens for scoring and the update, as the reference runs
      # (verl's use_dynamic_bsz with ppo_max_token_len_per_gpu = max prompt + max response = 23040): one update
      # and one scoring program whatever the lengths, no padding computed; 0: one episode per row, rows padded
      # to a length bucket (a program per bucket).
      pack_len=2560 + 20480,
      # Asynchronous RL (agentrl_jax/rl/stream.py): > 0 keeps one rollout stream running across updates, each
      # token trained at most this many policy versions after it was drawn; 0 is the synchronous loop (the
      # recipe's). Placement colocated | disaggregated (async_sampler_devices of the devices sample); partial
      # rollouts continue on their cache or recompute it under new weights; weights reach the sampler
      # async_weight_sync_segments decode segments after their update was dispatched (async_weight_sync
      # "segments": deterministic), or once they have arrived ("arrival": never waiting, not reproducible).
      max_staleness=0, async_placement="colocated", async_partial="continue", async_weight_sync_segments=0,
      async_sampler_devices=0, async_weight_sync="segments",
      loss=dict(policy_loss="ppo_clip", clip_low=0.2, clip_high=0.28, dual_clip_c=10.0, loss_agg_mode="token-mean",
                entropy_coeff=0.0, kl_coeff=0.0, kl_type="low_var_kl",
                # Off-policy correction between the sampler (behaviour) and the trainer's recomputation
                # (proximal), for asynchronous runs; off in the recipe. `rl.offpolicy.preset(name)` gives verl's
                # and AReaL's presets (e.g. "decoupled_token_is": verl's decoupled mode with token TIS 2.0,
                # "areal_decoupled": AReaL's decoupled PPO with its weight cap 5.0).
                tis_cap=ml_collections.FieldReference(None, field_type=float), is_level="token",
                behav_imp_weight_cap=ml_collections.FieldReference(None, field_type=float),
                rejection=ml_collections.FieldReference(None, field_type=str),
                rejection_threshold=ml_collections.FieldReference(None, field_type=str)),
      advantage=dict(estimator="grpo", norm_by_std=True)))
  config.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-6, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, grad_clip=1.0, schedule="constant",
      warmup_steps=0))
  # LoRA adapters instead of full fine-tuning when rank > 0 (`models.lora`: targets by pattern over q, k, v, o,
  # gate, up, down); only they train, checkpoints hold only them, the KL reference is the base itself.
  config.lora = lora.config_block()
  config.eval = ml_collections.ConfigDict(dict(
      sources=[],                    # e.g. recipe.eval_sources("/data/eval")
      every_steps=10, at_start=True, n=32, temperature=1.0, top_p=0.6, top_k=0, ks=[1, 8, 16, 32],
      samples_to_log=20))
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=30, max_to_keep=3, async_save=True))
  config.log_every_steps = 1
  config.samples_every_steps = 10
  config.samples_per_log = 8
  config.wandb_project = ""
  return config


# The recipe's RL config on each TPU generation's 16-chip slice: the layout, the rollout rows, and where the
# chips' HBM requires it LoRA and an 8-bit KV cache. Each entry is proved by the TPU compiler from a CPU host
# (`python -m agentrl_jax.aot --config=configs/demystify_<size>.py:<family> --topology=<topology>`; README,
# "Choosing the axes for a slice"); the default config (no argument) is the v5p layout.
#   context       devices each 23,040-token row's tokens are split over (context parallelism; fsdp takes the
#                 rest): what lets a 16 GiB v5e chip hold a row's activations. Qwen2.5-7B on v5e takes 4,
#                 not 2: at 2 its update needs all but 2 GiB of the usable HBM as the memory plan counts it, and
#                 the compiler fits it only by squeezing the backward pass's working set (12.1 GiB where the
#                 plan counts 14.7 and the same layout on a v6e takes 13.8); at 4 it needs 9.9 GiB, as planned
#   micro         rows per micro-batch of the update and scoring (one row per row shard)
#   rows, groups  rollout row slots (a multiple of the 16 chips), and prompts per prefill call
#   lora          adapter rank (0: full fine-tuning); alpha = 2 x rank, learning rate 10x the recipe's 1e-6
#                 (LoRA's best learning rate runs ~10x full fine-tuning's: Thinking Machines, "LoRA Without
#                 Regret", 2025)
#   kv            the rollout cache's storage dtype ("": bf16)
SLICE_LAYOUTS = {
    ("qwen3_4b", "v5e"): dict(topology="v5e:4x4", context=2, micro=8, rows=48, groups=3, lora=0, kv=""),
    ("qwen3_4b", "v6e"): dict(topology="v6e:4x4", context=1, micro=16, rows=256, groups=8, lora=64,
                              kv="float8_e4m3fn"),
    ("qwen2p5_7b", "v5e"): dict(topology="v5e:4x4", context=4, micro=4, rows=96, groups=6, lora=64, kv=""),
    ("qwen2p5_7b", "v6e"): dict(topology="v6e:4x4", context=2, micro=8, rows=256, groups=8, lora=64, kv=""),
}
SLICE_FAMILIES = ("v5e", "v6e")
LORA_LEARNING_RATE = 1e-5  # 10x the recipe's full fine-tuning rate


def for_slice(config: ml_collections.ConfigDict, size: str, family: str) -> ml_collections.ConfigDict:
  """Sets `config` (an `rl_config`) to `SLICE_LAYOUTS[(size, family)]`: mesh, micro-batch, rollout rows,
  LoRA and KV cache storage for that generation's 16-chip slice."""
  if (size, family) not in SLICE_LAYOUTS:
    raise ValueError(f"recipe.for_slice: no layout for {size} on {family}; known: {sorted(SLICE_LAYOUTS)}")
  s = SLICE_LAYOUTS[(size, family)]
  config.mesh.update(data=1, fsdp=-1, context=s["context"], tensor=1)
  config.rl.micro_batch_size = s["micro"]
  config.rollout.update(batch_size=s["rows"], groups_per_prefill=s["groups"])
  config.model.kv_cache_dtype = s["kv"]
  if s["lora"]:
    config.lora.update(rank=s["lora"], alpha=2.0 * s["lora"])
    config.optimizer.learning_rate = LORA_LEARNING_RATE
  return config


def shrink_for_smoke(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The same experiment at CPU size: tiny model, the embedded arithmetic task, a few short steps (and tool limits
  a CPU machine can afford)."""
  config.model.update(size="tiny_qwen3", hf_path="", checkpoint="", tokenizer_path="", param_dtype="float32",
                      dtype="float32", remat=False)
  config.mesh.num_devices = 1
  config.data.update(train_path="", toy_problems=64, toy_levels=[0, 1, 2])
  config.rollout.update(batch_size=16, max_turns=3, max_response_len=64, max_prompt_len=64, max_tool_output_chars=256,
                        segment_len=16, pad_prefill_groups=False, prompt_bucket_min=32, chunk_len=16,
                        cache_bucket_min=64, extend_rows=None, advertise_tools=False)
  config.tools.update(timeout_s=5.0, memory_mb=512)
  config.reward.overlong_buffer_tokens = 16
  config.rl.update(n=4, prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=8, total_steps=2,
                   response_bucket_min=32, logits_chunk_size=0, pack_len=128)
  config.eval.update(sources=[], at_start=False, n=2, ks=[1, 2])
  config.checkpoint.update(every_steps=1, async_save=False)
  return config


def sampling_job_config(job: str, *, smoke: bool = False) -> ml_collections.ConfigDict:
  """The RL config as the base of a job that only samples the policy (eval, collect, filter): no remat; with
  `smoke`, CPU size on the embedded arithmetic task (levels 1-3, room for a tool call and an answer)."""
  config = rl_config(size="qwen3_4b")
  config.job = job
  config.model.remat = False
  if smoke:
    shrink_for_smoke(config)
    config.data.update(toy_problems=16, toy_levels=[1, 2, 3])
    config.rollout.update(max_response_len=128, max_turns=3)
  return config


def sft_config(**model) -> ml_collections.ConfigDict:
  """The recipe's SFT stage (verl `fsdp_sft_trainer` with recipe/demystify/qwen*_sft.sh); `model` fields go to
  the model block (its size and tokenizer come from `hf_path` when set)."""
  config = ml_collections.ConfigDict()
  config.job = "sft"
  config.seed = 0
  config.model = loading.model_block(**{"size": "qwen3_4b", "hf_path": "", "tokenizer_path": "",
                                        "param_dtype": "float32", "dtype": "auto", "attention_impl": "auto",
                                        "remat": True, **model})
  config.data = ml_collections.ConfigDict(dict(
      path="",                  # the recipe's SFT parquet (`messages`, `tools`) or JSONL
      data_dir="",              # built ArrayRecord datasets; default WORKDIR/tfds
      skip_malformed_rows=True,  # rows that do not fit the schema are skipped and counted at build
      shuffle=True,
      toy_conversations=0,      # > 0 and no path: generate this many tiny tool-use conversations
      toy_malformed=0,          # ... plus this many malformed ones (exercise the skip path)
      toy_tools=True,           # ... with the tool schema in the system turn
  ))
  config.sft = ml_collections.ConfigDict(dict(
      batch_size=32,
      num_epochs=5,
      max_seq_len=32768,        # packed row length (the reference's data.max_length)
      truncation="right",       # longer conversations keep their first max_seq_len tokens; "skip" drops them
      micro_batch_rows=8,       # rows per micro-batch; a multiple of the data-parallel devices
      warmup_ratio=0.1,
      logits_chunk_size=1024,
  ))
  config.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-5, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01, grad_clip=1.0, min_lr_ratio=0.0))
  config.lora = lora.config_block()  # rank > 0: LoRA adapters instead of full fine-tuning (`models.lora`)
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, context=1, tensor=1, num_devices=0))  # 0: all
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=62, max_to_keep=3, async_save=True))
  config.log_every_steps = 10
  config.wandb_project = ""     # log to W&B too when set and wandb is installed
  config.export_hf = True       # write the final params as a HF directory to WORKDIR/hf
  return config


def shrink_sft_for_smoke(config: ml_collections.ConfigDict, size: str = "tiny_qwen3") -> ml_collections.ConfigDict:
  """The SFT stage at CPU size: a tiny random model and tiny conversations generated locally, under a minute."""
  config.model.update(size=size, hf_path="", tokenizer_path="", param_dtype="float32", dtype="float32", remat=False)
  config.data.update(toy_conversations=24, toy_malformed=2)
  config.sft.update(batch_size=8, num_epochs=2, max_seq_len=512, micro_batch_rows=2, logits_chunk_size=None)
  config.optimizer.learning_rate = 1e-3
  config.checkpoint.update(every_steps=2, max_to_keep=2, async_save=False)
  config.log_every_steps = 1
  return config


def drop_training_blocks(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Removes the blocks only the RL trainer reads, so a sampling job's config shows what it uses."""
  for block in _TRAINING_BLOCKS:
    del config[block]
  return config
