"""Agentic RL on the embedded tasks with a tiny model: CPU runs, tests and the demo.

Run:  python -m agentrl_jax.main --config=configs/rl_toy.py --workdir=/tmp/rl_toy
Args: (none)   the arithmetic task (levels 0-2) with the real sandbox, from a tiny random or given model
      :digits  the digit-fraction sanity task (no format to learn; the reward rises within a few steps)
Start from an SFT run with --config.model.checkpoint=<sft workdir>/checkpoints.
The recipe's settings (agentrl_jax/rl/recipe.py) shrunk to CPU size; only what differs is set here.
"""

from agentrl_jax.rl import recipe


def get_config(arg=None):
  if arg not in (None, "", "digits"):
    raise ValueError(f"rl_toy: unknown arg {arg!r}; expected nothing or 'digits'")
  config = recipe.shrink_for_smoke(recipe.rl_config())
  config.data.toy_problems = 512
  config.rollout.update(batch_size=32, max_turns=4, max_response_len=96)
  # A packed row holds the longest episode: prompt (64) + response (96) tokens.
  config.rl.update(n=4, prompts_per_step=8, mini_batch_prompts=4, micro_batch_size=8, total_steps=20,
                   pack_len=config.rollout.max_prompt_len + config.rollout.max_response_len)
  config.optimizer.learning_rate = 3e-3
  config.checkpoint.every_steps = 10
  if arg == "digits":
    config.data.update(toy_task="digits", toy_problems=64)
    config.rollout.update(max_turns=1, max_response_len=16)
    config.reward.update(overlong_buffer_tokens=0, tool_call_bonus=0.0, sources=[["toy_digits", "digit_fraction"]])
    config.rl.update(n=8, prompts_per_step=4, mini_batch_prompts=2, micro_batch_size=16, total_steps=12)
    config.optimizer.learning_rate = 1e-2
  config.lock()
  return config
