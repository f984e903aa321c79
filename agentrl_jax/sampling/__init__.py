"""Compiled sampling: a `SamplingState` over B row slots, grouped prefill, extend and a `lax.while_loop` decode.

    from agentrl_jax.sampling.generate import generate   # (a module of the same name: not re-exported here)
    sampler = make_sampler(graphdef, model_cfg, SamplingConfig(temperature=1.0), batch=16, mesh=mesh, params=params)
    out = generate(sampler, params, prompt_ids, key=jax.random.key(0), max_new_tokens=256, n=4)

The multi-turn agent loop on top of it is `agentrl_jax.rollout`.
"""

from agentrl_jax.sampling.config import SamplingConfig, StopReason, bucket, pow2_bucket
from agentrl_jax.sampling.sampler import TRACE_COUNTS, Draw, Sampler, SamplingState, Segment, make_sampler

__all__ = ["SamplingConfig", "StopReason", "bucket", "pow2_bucket", "TRACE_COUNTS",
           "Draw", "Sampler", "SamplingState", "Segment", "make_sampler"]
