"""The main job: the whole recipe on the embedded arithmetic task, end to end on a 2-core CPU in ~10 minutes.

Run:  bash launch/local.sh      (= python -m agentrl_jax.main --config=configs/default.py --workdir=runs/local_demo)
Stages (agentrl_jax/pipeline): data -> teacher trajectories through the real sandbox -> SFT -> eval -> model-aware
prompt filter -> GRPO-TCR -> eval -> report (summary.json, report.md, plots; TensorBoard logs per stage).
A killed run resumes with the same command. Override any field: --config.rl.loss.clip_high=0.2.
Args: :smoke        every stage at toy size (the test suite runs it; the numbers mean nothing)
      :smoke_qwen3  the same with the real Qwen3 vocabulary and chat template

The recipe's RL constants (agentrl_jax/rl/recipe.py: token-mean loss, clip 0.2 / 0.28, dual clip, no KL, no
entropy bonus, GRPO advantages, overlong shaping in tokens, tool-call shaping) are kept; sizes, lengths, the
learning rate and the batch shape are shrunk to what a tiny model on 2 CPU cores can run, and each rollout batch
is trained on twice (the recipe: once; see `config.rl` below).
"""

import ml_collections

from agentrl_jax.models import loading
from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "smoke", "smoke_qwen3"):
    raise ValueError(f"default: unknown arg {arg!r}; expected nothing, 'smoke' or 'smoke_qwen3'")
  base = recipe.rl_config()
  config = ml_collections.ConfigDict()
  config.job = "pipeline"
  config.name = "embedded arithmetic demo"
  config.seed = 0                    # every seed of the job: the task's splits, teacher, init, sampling, data order
  config.jax_platforms = "cpu"       # a CPU job (JAX_PLATFORMS wins; "" lets JAX pick, e.g. on a TPU VM)
  config.stages = ["data", "teacher", "sft", "eval_sft", "filter", "rl", "eval_rl"]
  config.data_dir = ""               # TFDS datasets; "" = <workdir>/tfds
  config.compile_cache_dir = ""      # JAX's persistent compilation cache; "" = <workdir>/jax_cache
  config.model = loading.model_block(size="demo_1m", param_dtype="float32", dtype="float32")
  # "embedded": the task's own BPE (agentrl_jax/tasks/tokenizer.py); "qwen3" / "qwen2.5": the real Qwen
  # vocabulary and chat template (agentrl_jax/models/qwen_tokenizer.py; a 151k-wide unembedding on 2 cores)
  config.tokenizer = "embedded"
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, context=1, tensor=1, num_devices=1))

  # ---- the task: held-out / SFT / RL-pool splits of the arithmetic family (agentrl_jax/tasks), disjoint by
  # canonical form, drawn with `seed`; the RL curves evaluate the first `curve_problems` held-out problems
  config.task = ml_collections.ConfigDict(dict(
      heldout_problems=512, sft_problems=256, rl_problems=512, curve_problems=64,
      level_weights=[[0, 0.1], [1, 0.2], [2, 0.35], [3, 0.35]]))
  # ---- SFT data: the scripted teacher's code run in the sandbox ("real"), or the stitched baseline
  config.teacher = ml_collections.ConfigDict(dict(source="real", style="deliberative", p_direct=0.5,
                                                  p_mistake=0.15))
  config.sft = ml_collections.ConfigDict(dict(batch_size=32, num_epochs=25, max_seq_len=256, micro_batch_rows=8,
                                              warmup_ratio=0.1, logits_chunk_size=None))
  config.sft_optimizer = ml_collections.ConfigDict(dict(learning_rate=3e-3, b1=0.9, b2=0.95, eps=1e-8,
                                                        weight_decay=0.01, grad_clip=1.0, min_lr_ratio=0.1))

  # ---- sampling with the tool loop (evaluation, filter, RL rollouts)
  config.rollout = base.rollout
  # No tool schema in the prompt: its ~150 fixed tokens would triple every sequence on 2 CPU cores and teach
  # nothing (the format comes from SFT); a real run advertises it (recipe.rl_config).
  config.rollout.update(batch_size=128, max_turns=4, max_response_len=160, max_prompt_len=64,
                        max_tool_output_chars=256, segment_len=32, groups_per_prefill=16, pad_prefill_groups=False,
                        prompt_bucket_min=32, chunk_len=32, cache_bucket_min=224, extend_rows=None,
                        advertise_tools=False)
  config.tools = base.tools
  config.tools.update(timeout_s=5.0, memory_mb=512, max_concurrency=4)  # 4 sandboxes hide each call's latency
  config.reward = base.reward
  config.reward.update(overlong_buffer_tokens=32)
  config.prompt_style = base.prompt_style

  # ---- model-aware filter: the RL pool's pass rate under the SFT policy, k samples each
  config.filter = ml_collections.ConfigDict(dict(k=4, prompts_per_batch=256, min_pass_rate=0.0, max_pass_rate=1.0,
                                                 include_min=False, include_max=False))
  # ---- GRPO-TCR
  config.rl = base.rl
  # 16 prompts x 8 samples per step in mini-batches of 4 prompts, two passes over each step's mini-batches (the
  # recipe makes one): after SFT this tiny policy's entropy is ~0.05 nats/token, and one pass moved it so little
  # that the upper clip bound clipped ~1e-5 of the tokens; two passes make every step's later updates
  # off-policy enough for clipping to act (~1e-3 of the tokens over the first 20 steps, 3-4.5e-4 over all 70)
  # and learn more per rollout (seeds 0 and 2, measured on one machine: RL - SFT +0.148 -> +0.163 and
  # +0.145 -> +0.181 at 70 steps). The sampler's log-probs serve as the old policy's (one forward pass less per
  # step). Groups whose samples all scored alike carry no gradient: they
  # are dropped from the update (DAPO's dynamic sampling without its extra draws), which cheapens the update and
  # keeps their zero-advantage tokens out of the token mean. Episodes (~75 of the 224 tokens a padded row
  # holds) are packed into rows of `pack_len` tokens (verl's use_dynamic_bsz); the update skips the empty
  # micro-batches of 8 rows, which halves its time and pays for the second pass.
  config.rl.update(n=8, prompts_per_step=16, mini_batch_prompts=4, micro_batch_size=8, epochs_per_batch=2,
                   total_steps=70, response_bucket_min=160, logits_chunk_size=0, reuse_sampler_logp=True,
                   pack_len=224, dynamic_sampling=True, dynamic_sampling_max_extra_rounds=0)
  config.optimizer = base.optimizer
  # Cosine decay to a tenth over ~the updates a run applies (70 steps x ~3 kept mini-batches x 2 passes; later
  # ones stay at the floor): the last steps refine instead of jolting the policy, whose final state is what is
  # evaluated.
  config.optimizer.update(learning_rate=1e-4, b2=0.99, schedule="cosine", total_steps=420, min_lr_ratio=0.1)
  # RL with LoRA adapters on the SFT checkpoint when rank > 0 (the `lora` arm of configs/ablations.py); the main
  # job fine-tunes every weight.
  config.lora = base.lora
  # ---- held-out evaluation: after SFT and after RL on the whole split; during RL on `task.curve_problems`
  # Sampled as in training (T=1, top_p=1; the recipe's validation uses top_p=0.6) plus one greedy answer each.
  config.eval = ml_collections.ConfigDict(dict(n=4, temperature=1.0, top_p=1.0, top_k=0, ks=[4], every_steps=15,
                                               samples_to_log=8, greedy=True))
  config.checkpoint = ml_collections.ConfigDict(dict(every_steps=5, max_to_keep=2, async_save=False))
  config.log_every_steps = 5
  config.samples_every_steps = 10
  config.samples_per_log = 4
  config.wandb_project = ""

  if arg in ("smoke", "smoke_qwen3"):
    config.name = f"embedded arithmetic demo ({arg})"
    config.tokenizer = "qwen3" if arg == "smoke_qwen3" else "embedded"
    config.model.size = "tiny_qwen3"
    config.task.update(heldout_problems=8, sft_problems=16, rl_problems=16, curve_problems=4)
    config.sft.update(batch_size=8, num_epochs=1)
    config.rollout.update(batch_size=16, max_response_len=48, cache_bucket_min=96, max_turns=3)
    config.filter.update(k=2, min_pass_rate=0.0, include_min=True, max_pass_rate=1.0, include_max=True)
    # dynamic sampling off: an untrained policy's groups are all alike
    config.rl.update(n=2, prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=4, total_steps=2,
                     response_bucket_min=64, pack_len=128, dynamic_sampling=False)
    config.eval.update(n=2, ks=[2], every_steps=1)
    config.checkpoint.every_steps = 1
    config.log_every_steps = 1
  config.lock()
  return config
