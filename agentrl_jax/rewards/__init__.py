"""Rewards: pure scoring functions per kind and a registry chosen by `data_source`.

    from agentrl_jax import rewards
    r = rewards.compute_score("AIME2024", response, "33")        # RewardResult(score, acc, pred, info)
    reward = rewards.shaping.shape(r.score, n_tool_calls=2, response_tokens=n_tokens)

Modules: `math` (boxed answer; strict = the recipe's exact compare, or equivalence at Math-Verify's level),
`multiple_choice` (GPQA option letter), `code` (test cases in the sandbox), `shaping` (overlong penalty, tool-call
shaping), `registry` (data_source -> kind). Behind math equivalence, all bounded by construction: `latex`
(normalisation, entry points), `latex_expr` (parser), `latex_eval` (values), `latex_compare` (lists, sets, labels,
relations, intervals, matrices), `latex_numbers` (exact values, decimals as roundings).
"""

from agentrl_jax.rewards import code, latex, math, multiple_choice, shaping
from agentrl_jax.rewards.base import FAILURES, RewardResult
from agentrl_jax.rewards.registry import (DEFAULT_RULES, SCORERS, RewardConfig, answer_key, compute_score, kind_for,
                                          register)
from agentrl_jax.rewards.shaping import ShapingConfig

__all__ = [
    "FAILURES", "RewardResult", "RewardConfig", "ShapingConfig", "compute_score", "kind_for", "answer_key", "register",
    "DEFAULT_RULES", "SCORERS", "code", "latex", "math", "multiple_choice", "shaping",
]
