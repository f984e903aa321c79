"""One multi-turn rollout with the real sandbox, run by tests/test_multiprocess.py as 1 or 2 JAX processes.

    python -m tests.rollout.multiprocess_rollout_script OUT.pkl [COORDINATOR NUM_PROCESSES PROCESS_ID]

A tiny random model on a mesh over every device of every process (FSDP); every other episode opens with a
forced tool call (the rest of each episode is sampled), so each process runs its own rows' calls in its own
bubblewrap sandbox and the results cross hosts. Process 0 pickles the episodes and the calls each process ran.
"""

from __future__ import annotations

import json
import pickle
import sys

import jax


def main(argv):
  out = argv[1]
  if len(argv) > 2:
    jax.distributed.initialize(coordinator_address=argv[2], num_processes=int(argv[3]), process_id=int(argv[4]))
  from flax import nnx

  from agentrl_jax import multihost, testing
  from agentrl_jax.models import sharding
  from agentrl_jax.models import tokenizer as tokenizer_lib
  from agentrl_jax.rollout import agent_loop
  from agentrl_jax.rollout.chat import stop_token_ids
  from agentrl_jax.rollout.config import RolloutConfig
  from agentrl_jax.sampling.config import SamplingConfig
  from agentrl_jax.sampling.sampler import make_sampler
  from agentrl_jax.tools import sandbox
  from agentrl_jax.tools.base import ToolConfig

  tok = testing.tiny_tokenizer()
  model = testing.tiny_model(seed=5)
  graphdef, params = nnx.split(model)
  mesh = sharding.make_mesh(data=1, fsdp=-1, tensor=1)
  end, tool_end = stop_token_ids(tok)
  b, seg = 8, 16
  cfg = RolloutConfig(batch_size=b, segment_len=seg, max_prompt_len=64, max_response_len=96, max_turns=3,
                      prompt_bucket_min=64, chunk_len=64, cache_bucket_min=256)
  sampler = make_sampler(graphdef, model.cfg, SamplingConfig(end_token_ids=end, tool_end_token_ids=tool_end,
                                                             segment_len=seg), batch=b, mesh=mesh, params=params,
                         n_forced=64)
  params = sampler.place_params(params)
  questions = ["What is 6*7?", "Compute 12+30.", "What is 2**5?", "Sum 1..5?"]
  prompts = [tok.encode(tokenizer_lib.render_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True),
                        add_special_tokens=False) for q in questions]
  codes = ["print(6*7)", "import os; print(os.getpid() > 0, 12+30)", "print(2**5)", "print(sum(range(6)))"]
  call = lambda code: tok.encode("Let me compute.\n<tool_call>\n" + json.dumps(  # noqa: E731
      {"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>", add_special_tokens=False)
  scripts = [[call(codes[i // 2])] if i % 2 == 0 else [] for i in range(len(prompts) * 2)]
  executor = sandbox.LocalExecutor(ToolConfig(timeout_s=10.0, memory_mb=512, max_concurrency=2))
  ran = []
  submit = executor.submit
  executor.submit = lambda code: (ran.append(code), submit(code))[1]  # which calls this process ran itself
  try:
    episodes, stats = agent_loop.run_rollout(sampler, params, prompts, n=2, tokenizer=tok, executor=executor,
                                             cfg=cfg, key=jax.random.key(9), scripts=scripts)
  finally:
    executor.close()
  per_process = multihost.allgather_objects(ran)
  if multihost.is_primary():
    with open(out, "wb") as f:
      pickle.dump({"episodes": [dict(tokens=e.response_ids.tolist(), mask=e.loss_mask.tolist(),
                                     logp=e.logp_raw.tolist(), transcript=e.transcript,
                                     calls=e.num_tool_calls, failed=e.num_failed_calls) for e in episodes],
                   "ran": per_process, "extend_calls": stats.extend_calls}, f)


if __name__ == "__main__":
  main(sys.argv)
