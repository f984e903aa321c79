"""Every constant of the recipe configs against the reference (Gen-Verse/Open-AgentRL), script and line.

Each leaf of configs/demystify_qwen3_4b.py, demystify_qwen2p5_7b.py, sft_qwen3_4b.py, sft_qwen2p5_7b.py and
eval_demystify.py is one of:
  REFERENCE       the reference's value, with the file:line it is set at (a recipe script, or the verl default
                  the script leaves in force) and that line's text;
  DEVIATIONS      a deliberate difference, with the reference's value and the reason;
  IMPLEMENTATION  a knob the reference has no counterpart for (paths, shapes, logging, the CPU demo), by prefix.
A new config field fails `test_every_field_is_classified` until it is put in one of them. Line numbers are those
of the reference's snapshot read for issue 11 (its last commit: "Update README.md", 1fe5dbd).
"""

from __future__ import annotations

import inspect

import pytest

from agentrl_jax import rewards, testing
from agentrl_jax.rewards import math as math_reward
from agentrl_jax.rl import recipe
from agentrl_jax.sft.step import SFTConfig

RL4 = "recipe/demystify/grpo_tcr_qwen3_4b.sh"
RL7 = "recipe/demystify/grpo_tcr_qwen2_7b.sh"
SFT4 = "recipe/demystify/qwen3_4b_sft.sh"
SFT7 = "recipe/demystify/qwen2_7b_sft.sh"
EVAL = "recipe/demystify/eval/eval_qwen3_4b_aime_gpqa.sh"
TOOL = "recipe/demystify/sandbox_fusion_tool_config.yaml"
REWARD = "recipe/demystify/reward.py"
ACTOR = "verl/trainer/config/actor/actor.yaml"
ROLLOUT = "verl/trainer/config/rollout/rollout.yaml"
PPO = "verl/trainer/config/ppo_trainer.yaml"
SFT_YAML = "verl/trainer/config/sft_trainer.yaml"


def _rl_reference(script: str, size: str, model_quote: str) -> dict[str, tuple]:
  """(value, source, the reference's text) per field of an RL config; the 4B and 7B scripts share line numbers."""
  return {
      "model.size": (size, f"{script}:8", model_quote),
      "model.remat": (True, f"{script}:100", "actor_rollout_ref.model.enable_gradient_checkpointing=True"),
      "rl.advantage.estimator": ("grpo", f"{script}:22", "adv_estimator=grpo"),
      "rl.advantage.norm_by_std": (True, f"{PPO}:138", "norm_adv_by_std_in_grpo: True"),
      "rl.loss.kl_coeff": (0.0, f"{script}:25-28", "use_kl_in_reward=False, kl_coef=0.0, use_kl_loss=False, "
                                                   "kl_loss_coef=0.0"),
      "rl.loss.kl_type": ("low_var_kl", f"{ACTOR}:89", "kl_loss_type: low_var_kl (unused at coefficient 0)"),
      "rl.loss.clip_low": (0.2, f"{script}:31", "clip_ratio_low=0.2"),
      "rl.loss.clip_high": (0.28, f"{script}:32", "clip_ratio_high=0.28"),
      "rl.loss.dual_clip_c": (10.0, f"{script}:106", "actor_rollout_ref.actor.clip_ratio_c=10.0"),
      "rl.loss.loss_agg_mode": ("token-mean", f"{script}:35", 'loss_agg_mode="token-mean"'),
      "rl.loss.entropy_coeff": (0.0, f"{ACTOR}:72", "entropy_coeff: 0"),
      "rl.loss.policy_loss": ("ppo_clip", f"{ACTOR}:48", 'loss_mode: "vanilla" (PPO clip, dual clip)'),
      "rl.dynamic_sampling": (False, f"{script}:37-40", "enable_filter_groups=True, but never passed to "
                                                        "verl.trainer.main_ppo (lines 81-145): not applied"),
      "rl.epochs_per_batch": (1, f"{ACTOR}:92", "ppo_epochs: 1"),
      "rl.prompts_per_step": (64, f"{script}:54", "train_batch_size=64"),
      "rl.mini_batch_prompts": (16, f"{script}:55", "ppo_mini_batch_size=16"),
      "rl.n": (16, f"{script}:56", "n_resp_per_prompt=16"),
      "rl.total_epochs": (3, f"{script}:145", "trainer.total_epochs=3"),
      "rl.total_steps": (0, f"{PPO}:186", "total_training_steps: null (0 here: from the epochs)"),
      "optimizer.learning_rate": (1e-6, f"{script}:52", "actor_lr=1e-6"),
      "optimizer.b1": (0.9, "verl/workers/fsdp_workers.py:479", 'betas=optim_config.get("betas", (0.9, 0.999))'),
      "optimizer.b2": (0.999, "verl/workers/fsdp_workers.py:479", 'betas=optim_config.get("betas", (0.9, 0.999))'),
      "optimizer.eps": (1e-8, "verl/workers/fsdp_workers.py:476-481", "optim.AdamW(...) without eps: torch's 1e-8"),
      "optimizer.weight_decay": (0.01, f"{ACTOR}:127", "weight_decay: 0.01"),
      "optimizer.grad_clip": (1.0, f"{script}:105", "actor_rollout_ref.actor.grad_clip=1.0"),
      "optimizer.schedule": ("constant", "verl/trainer/config/_generated_ppo_trainer.yaml:53",
                             "warmup_style: constant"),
      "optimizer.warmup_steps": (0, f"{ACTOR}:121", "lr_warmup_steps_ratio: 0.0"),
      "rollout.max_turns": (16, f"{script}:49", "max_turns=16 (max_user_turns, max_assistant_turns: 120-121)"),
      "rollout.max_prompt_len": (2560, f"{script}:50", "max_prompt_length=2560"),
      "rollout.max_response_len": (20480, f"{script}:51", "max_response_length=20480"),
      "rollout.max_calls_per_turn": (1, f"{ROLLOUT}:144", "max_parallel_calls: 1"),
      "rollout.advertise_tools": (True, f"{script}:122", "multi_turn.tool_config_path=$tool_config_path"),
      "rollout.temperature": (1.0, f"{ROLLOUT}:11", "temperature: 1.0"),
      "rollout.top_p": (1.0, f"{ROLLOUT}:17", "top_p: 1"),
      "rollout.top_k": (0, f"{ROLLOUT}:14", "top_k: -1 (off; 0 is off here)"),
      "tools.timeout_s": (30.0, f"{TOOL}:8", "default_timeout: 30"),
      "tools.memory_mb": (2048, f"{TOOL}:10", "memory_limit_mb: 2048"),
      "reward.math_mode": ("strict", f"{REWARD}:171", "math_dapo.compute_score(..., strict_box_verify=True)"),
      "reward.overlong_buffer_tokens": (4096, f"{script}:45", "overlong_buffer_len=$((1024 * 4))"),
      "reward.overlong_penalty_factor": (1.0, f"{script}:46", "overlong_penalty_factor=1.0"),
      "reward.tool_call_bonus": (0.1, f"{REWARD}:174", "tool_call_reward = (num_turns - 2) / 2 * 0.1"),
      "reward.tool_call_cap": (-0.6, f"{REWARD}:175", 'result["score"] = float(min(-0.6, ...))'),
      "eval.at_start": (True, f"{script}:139", "trainer.val_before_train=True"),
      "eval.every_steps": (10, f"{script}:144", "trainer.test_freq=10"),
      "eval.n": (32, f"{script}:57", "n_resp_per_prompt_val=32"),
      "eval.temperature": (1.0, f"{script}:127", "val_kwargs.temperature=1.0"),
      "eval.top_p": (0.6, f"{script}:126", "val_kwargs.top_p=0.6"),
      "eval.top_k": (0, f"{ROLLOUT}:111", "val_kwargs top_k: -1 (off)"),
      "eval.samples_to_log": (20, f"{script}:140", "trainer.log_val_generations=20"),
      "checkpoint.every_steps": (30, f"{script}:142", "trainer.save_freq=30"),
      "data.shuffle": (True, "verl/trainer/config/data/legacy_data.yaml:49", "shuffle: True"),
  }


def _sft_reference(script: str, size: str, model_quote: str) -> dict[str, tuple]:
  return {
      "model.size": (size, f"{script}:10", model_quote),
      "model.param_dtype": ("float32", f"{SFT_YAML}:31", "model_dtype: fp32"),
      "model.remat": (True, f"{SFT_YAML}:37", "enable_gradient_checkpointing: True"),
      "sft.max_seq_len": (32768, f"{script}:17", "data.max_length=32768"),
      "sft.truncation": ("right", f"{script}:18", "data.truncation=right"),
      "sft.batch_size": (32, f"{script}:19", "data.train_batch_size=32"),
      "sft.num_epochs": (5, f"{script}:30", "trainer.total_epochs=5"),
      "sft.warmup_ratio": (0.1, f"{SFT_YAML}:48", "warmup_steps_ratio: 0.1"),
      "optimizer.learning_rate": (1e-5, f"{SFT_YAML}:45", "lr: 1e-5"),
      "optimizer.b1": (0.9, f"{SFT_YAML}:46", "betas: [0.9, 0.95]"),
      "optimizer.b2": (0.95, f"{SFT_YAML}:46", "betas: [0.9, 0.95]"),
      "optimizer.eps": (1e-8, "verl/trainer/fsdp_sft_trainer.py:324-329", "optim.AdamW(...) without eps: 1e-8"),
      "optimizer.weight_decay": (0.01, f"{SFT_YAML}:47", "weight_decay: 0.01"),
      "optimizer.grad_clip": (1.0, f"{SFT_YAML}:49", "clip_grad: 1.0"),
      "optimizer.min_lr_ratio": (0.0, "verl/utils/torch_functional.py:509-513",
                                 "get_cosine_schedule_with_warmup(..., min_lr_ratio=0.0) (lr_scheduler: cosine, "
                                 f"{SFT_YAML}:50)"),
      "checkpoint.every_steps": (62, f"{script}:31", "trainer.save_freq=62"),
      "data.shuffle": (True, "verl/trainer/fsdp_sft_trainer.py:175-176", "DistributedSampler(..., shuffle=True)"),
  }


REFERENCE = {
    "demystify_qwen3_4b": _rl_reference(RL4, "qwen3_4b", "model_path=/path/to/your/model/Gen-Verse/Qwen3-4B-RA-SFT"),
    "demystify_qwen2p5_7b": _rl_reference(RL7, "qwen2p5_7b",
                                          "model_path=/path/to/your/model/Gen-Verse/Qwen2.5-7B-RA-SFT"),
    "sft_qwen3_4b": _sft_reference(SFT4, "qwen3_4b", "MODEL_PATH=/path/to/your/model/Qwen/Qwen3-4B-Instruct-2507"),
    "sft_qwen2p5_7b": _sft_reference(SFT7, "qwen2p5_7b", "MODEL_PATH=/path/to/your/model/Qwen/Qwen2.5-7B-Instruct"),
    # The eval config is the RL config with the eval scripts' settings (what only training reads is left as is).
    "eval_demystify": {
        **_rl_reference(RL4, "qwen3_4b", "model_path=/path/to/your/models/Gen-Verse/DemyAgent-4B"),
        "rollout.max_turns": (16, f"{EVAL}:50", "max_turns=16"),
        "rollout.max_prompt_len": (4096, f"{EVAL}:51", "max_prompt_length=4096"),
        "rollout.max_response_len": (20480, f"{EVAL}:52", "max_response_length=20480"),
        "eval.n": (32, f"{EVAL}:58", "n_resp_per_prompt_val=32"),
        "eval.top_p": (0.6, f"{EVAL}:126", "val_kwargs.top_p=0.6"),
        "eval.temperature": (1.0, f"{EVAL}:127", "val_kwargs.temperature=1.0"),
        "eval.samples_to_log": (20, f"{EVAL}:141", "trainer.log_val_generations=20"),
    },
}
del REFERENCE["eval_demystify"]["model.remat"]

_RL_DEVIATIONS = {
    "rollout.max_tool_output_chars": (2048, f"{ROLLOUT}:147-150", "max_tool_response_length: 256, truncated in "
                                      "the middle", "256 characters hide most tracebacks; kept middle-truncated"),
    "rollout.end_on_failed_call": (False, "verl/experimental/agent_loop/tool_agent_loop.py:124,133",
                                   "no parsable call or a failing tool ends the episode",
                                   "the model reads the error and can recover (bad input never ends a run)"),
    "tools.backend": ("local", f"{TOOL}:2", "recipe.demystify.reward.CustomSandboxFusionTool (a SandboxFusion "
                      "service)", "runs without a service; 'sandbox_fusion' selects the reference's executor"),
    "checkpoint.max_to_keep": (3, f"{PPO}:253", "max_actor_ckpt_to_keep: null (keep all)",
                               "a Qwen3-4B checkpoint with Adam moments is ~50 GB"),
    "reward.tool_call_count": ("executed", f"{REWARD}:172-175",
                               "num_turns, never passed by the dapo reward manager (a constant -0.1)",
                               "the bonus follows the calls the executor actually ran"),
}
DEVIATIONS = {
    "demystify_qwen3_4b": _RL_DEVIATIONS,
    "demystify_qwen2p5_7b": _RL_DEVIATIONS,
    "eval_demystify": _RL_DEVIATIONS,
    "sft_qwen3_4b": {"checkpoint.max_to_keep": (3, f"{SFT_YAML}:66", "max_ckpt_to_keep: null (keep all)",
                                                "a 4B checkpoint with Adam moments is ~50 GB")},
    "sft_qwen2p5_7b": {"checkpoint.max_to_keep": (3, f"{SFT_YAML}:66", "max_ckpt_to_keep: null (keep all)",
                                                  "a 7B checkpoint with Adam moments is ~90 GB")},
}
# Behaviour (not config fields) that differs on purpose; each is pinned by a test below or in tests/rewards.
BEHAVIOUR_DEVIATIONS = {
    "tool-call shaping counts executed calls": (f"{REWARD}:172-175 with verl/workers/reward_manager/dapo.py:95-102",
                                                "num_turns never passed: a constant -0.1 (every wrong answer -1.1)"),
    "math rewards ignore <tool_response> text": ("verl/utils/reward_score/math_dapo.py:211,260",
                                                 "the last 100 characters of the whole response"),
    "infrastructure failures are not answers": ("verl/utils/reward_score/livecodebench/code_math.py:239-242",
                                                "a sandbox or harness exception counts as a failed test"),
}

# Knobs without a counterpart in the reference, by field prefix (why in the comment).
IMPLEMENTATION = (
    "job", "seed", "log_every_steps", "samples_every_steps", "samples_per_log", "wandb_project", "export_hf",
    "eval_root",                                     # job plumbing, logging, seeds (not portable across stacks)
    "mesh.", "sampler_mesh.",                        # device layouts (verl: FSDP + Ulysses sp=4 on 8 GPUs)
    "model.checkpoint", "model.checkpoint_step", "model.hf_path", "model.tokenizer_path",  # local paths
    "model.dtype", "model.param_dtype", "model.attention_impl", "model.scan_layers",  # bf16 compute on fp32
                                                     # master weights, scanned layers, the
                                                     # attention kernel by backend (verl's FSDP mixed
                                                     # precision); the SFT's fp32 is in the table
    "model.context_strategy", "model.kv_cache_dtype",  # context parallelism's attention; the rollout cache's
                                                     # storage (verl: vLLM's kv_cache_dtype)
    "data.data_dir", "data.path", "data.train_path", "data.train_schema", "data.skip_malformed",
    "data.toy_",                                     # data plumbing and the embedded CPU task
    "prompt_style.",                                 # the reference's prompt texts live in agentrl_jax/data/prompts.py
    "eval.ks", "eval.sources",                       # which k of avg/pass/maj@k to report; local eval files
    "reward.sources",                                # extra data_source -> reward kind pairs
    "rl.micro_batch_size", "rl.logits_chunk_size", "rl.response_bucket_min", "rl.reuse_sampler_logp",
    "rl.dynamic_sampling_max_extra_rounds", "rl.pack_len",  # memory / compile shape knobs (verl: use_dynamic_bsz)
    "rl.max_staleness", "rl.async_",                 # asynchronous RL (the reference's loop is synchronous: 0)
    "rl.loss.tis_cap", "rl.loss.is_level", "rl.loss.behav_imp_weight_cap", "rl.loss.rejection",
                                                     # off-policy correction (off, as the reference runs)
    "lora.",                                         # LoRA: off (rank 0) as the reference fine-tunes every
                                                     # weight; the slice layouts that turn it on are
                                                     # deviations the README names
    "rl.max_infra_failure_frac", "rl.max_consecutive_nonfinite_steps",  # run guards the reference lacks (it
                                                     # scores a dead sandbox 0 and skips non-finite steps silently)
    "rollout.batch_size", "rollout.segment_len", "rollout.groups_per_prefill", "rollout.prompt_bucket_min",
    "rollout.chunk_len", "rollout.cache_bucket_min", "rollout.overlap_tools", "rollout.pad_prefill_groups",
    "rollout.extend_rows",
                                                     # the compiled sampler's shapes
    "tools.max_concurrency", "tools.sandbox_fusion_url", "tools.allow_unsandboxed", "tools.local_mode",
                                                     # executor plumbing
    "checkpoint.async_save",
    "sft.micro_batch_rows", "sft.logits_chunk_size",  # memory knobs (verl: micro_batch_size_per_gpu=4, sp=4)
)
# ... and per config: the eval job never runs a backward pass, so it does not rematerialise.
IMPLEMENTATION_BY_CONFIG = {"eval_demystify": ("model.remat",)}
CONFIGS = tuple(REFERENCE)


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def _config(name: str) -> dict:
  return _flat(testing.load_config(name).to_dict())


def _equal(a, b) -> bool:
  if isinstance(b, float) and not isinstance(a, bool):
    return a == pytest.approx(b, rel=1e-12)
  return type(a) is type(b) and a == b if isinstance(b, bool) else a == b


@pytest.mark.parametrize("name", CONFIGS)
def test_every_field_is_classified(name):
  flat = _config(name)
  known = set(REFERENCE[name]) | set(DEVIATIONS[name])
  implementation = IMPLEMENTATION + IMPLEMENTATION_BY_CONFIG.get(name, ())
  unclassified = [k for k in flat if k not in known and not k.startswith(implementation)]
  assert not unclassified, f"{name}: put these fields in REFERENCE, DEVIATIONS or IMPLEMENTATION: {unclassified}"
  stale = sorted(k for k in known if k not in flat)
  assert not stale, f"{name}: the table names fields the config does not have: {stale}"
  assert not [k for k in REFERENCE[name] if k in DEVIATIONS[name]]


@pytest.mark.parametrize("name", CONFIGS)
def test_constants_are_the_reference_values(name):
  flat = _config(name)
  wrong = {k: (flat[k], v[0], v[1]) for k, v in REFERENCE[name].items() if not _equal(flat[k], v[0])}
  assert not wrong, f"{name}: (config, reference, source) differ: {wrong}"


@pytest.mark.parametrize("name", CONFIGS)
def test_deliberate_deviations_are_pinned(name):
  flat = _config(name)
  for k, (ours, source, reference, reason) in DEVIATIONS[name].items():
    assert _equal(flat[k], ours), f"{name}.{k} = {flat[k]!r}: the deviation listed is {ours!r} ({reason})"
    assert source and reference and reason


def test_sources_name_a_file_and_line():
  for table in [*REFERENCE.values(), *DEVIATIONS.values()]:
    for key, entry in table.items():
      source = entry[1]
      path, _, lines = source.partition(":")
      assert path.startswith(("recipe/demystify/", "verl/")) and path.endswith((".sh", ".yaml", ".py")), key
      assert lines and all(part.replace("-", "").isdigit() for part in lines.split(",")), (key, source)


def test_behaviour_deviations_are_in_force():
  assert set(BEHAVIOUR_DEVIATIONS) == {"tool-call shaping counts executed calls",
                                       "math rewards ignore <tool_response> text",
                                       "infrastructure failures are not answers"}
  assert recipe.rl_config().rl.max_infra_failure_frac == 0.05  # tests/rl/test_rl_infra_failures.py pins the rest
  assert rewards.ShapingConfig().tool_call_count == "executed"
  assert math_reward.STRICT_WINDOW_CHARS == 100
  printed = "<tool_response>\n\\boxed{7}\n</tool_response>\nDone."
  assert not math_reward.score(printed, "7", mode="strict").acc
  assert SFTConfig().max_seq_len == 32768 and SFTConfig().truncation == "right"


def test_smoke_helpers_keep_their_signatures_and_cpu_limits():
  assert list(inspect.signature(recipe.shrink_for_smoke).parameters) == ["config"]
  params = inspect.signature(recipe.sampling_job_config).parameters
  assert list(params) == ["job", "smoke"] and params["smoke"].kind is inspect.Parameter.KEYWORD_ONLY
  for config in (recipe.shrink_for_smoke(recipe.rl_config()), recipe.sampling_job_config("eval", smoke=True),
                 testing.load_config("demystify_qwen3_4b", "smoke"), testing.load_config("rl_toy")):
    assert (config.tools.timeout_s, config.tools.memory_mb) == (5.0, 512) and config.model.size == "tiny_qwen3"
  assert testing.load_config("demystify_qwen2p5_7b", "smoke").model.size == "tiny_qwen2"
  sft7 = testing.load_config("sft_qwen2p5_7b", "smoke")
  assert sft7.model.size == "tiny_qwen2" and sft7.sft.max_seq_len == 512 and sft7.data.toy_conversations > 0
  with pytest.raises(ValueError, match="unknown arg"):
    testing.load_config("sft_qwen2p5_7b", "big")
