"""The multi-turn agent loop: pause at `</tool_call>`, run the code tool, extend the KV cache, resume.

    cfg = RolloutConfig(batch_size=64)
    sampler = make_sampler(graphdef, model_cfg, sampling_config(tokenizer, cfg, temperature=1.0), batch=64)
    episodes, stats = run_rollout(sampler, params, prompt_ids, n=8, tokenizer=tokenizer, executor=executor,
                                  cfg=cfg, key=key)
    batch = collate(episodes)          # fixed bucketed shapes for the trainer
"""

from agentrl_jax.rollout.agent_loop import run_rollout
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.episode import STOP_REASONS, CallInfo, Episode, TurnInfo, collate
from agentrl_jax.rollout.parser import ToolCall, parse_tool_calls
from agentrl_jax.rollout.rows import RolloutStats
from agentrl_jax.rollout.shapes import sampling_config

__all__ = ["RolloutStats", "run_rollout", "sampling_config", "RolloutConfig", "STOP_REASONS", "CallInfo", "Episode",
           "TurnInfo", "collate", "ToolCall", "parse_tool_calls"]
