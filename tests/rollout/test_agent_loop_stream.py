"""The agent loop as a stream (`AgentLoop`): policy versions stamped per token when the weights change mid-way
(partial rollouts), the recomputed cache of interruptible rollouts, abort and restart."""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import testing
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.rollout import agent_loop
from agentrl_jax.rollout.chat import stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.sampler import make_sampler
from agentrl_jax.tools import ExecResult

B, SEG, F = 4, 16, 64
CFG = RolloutConfig(batch_size=B, segment_len=SEG, max_prompt_len=64, max_response_len=200, prompt_bucket_min=64,
                    chunk_len=64, cache_bucket_min=256)
CALL = "Let me <tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": "print(6)"}}) + \
    "\n</tool_call>"


@pytest.fixture(scope="module")
def env():
  tok = testing.tiny_tokenizer()
  graphdef, p0 = nnx.split(testing.tiny_model(seed=11))
  _, p1 = nnx.split(testing.tiny_model(seed=12))
  end, tool_end = stop_token_ids(tok)
  sampler = make_sampler(graphdef, testing.tiny_model().cfg, SamplingConfig(
      end_token_ids=end, tool_end_token_ids=tool_end, segment_len=SEG), batch=B, n_forced=F)
  text = tokenizer_lib.render_chat(tok, [{"role": "user", "content": "What is 2*3?"}], add_generation_prompt=True)
  return tok, graphdef, p0, p1, sampler, tok.encode(text, add_special_tokens=False)


def _run_partial(env, recompute: bool):
  """One episode: its first turn (a tool call) drawn by p0 (version 0), the rest by p1 (version 1)."""
  tok, _, p0, p1, sampler, prompt = env
  enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
  scripts = [[enc(CALL), enc("So the answer is 6.<|im_end|>")]]
  ex = stub_executor(lambda code: ExecResult("ok", stdout="6\n"))
  try:
    loop = agent_loop.AgentLoop(sampler, n=1, tokenizer=tok, executor=ex, cfg=CFG, key=jax.random.key(0),
                                scripts=scripts)
    loop.add([prompt], groups=[0])
    while not loop._waiting_slots():  # decode the first turn with version 0 until it pauses at the call
      loop.step(p0, version=0)
    if recompute:
      assert loop.recompute(p1) == len(prompt) + len(loop.rows[0].resp) - 1
    while loop.busy:
      loop.step(p1, version=1)
    (group, (ep,)), = loop.pop_finished_groups()
    assert group == 0 and not loop.done
    return ep
  finally:
    ex.close()


def _full_logp(env, params, ids):
  tok, graphdef, *_ = env
  logits, _ = testing.jit_forward(nnx.merge(graphdef, params))(jnp.asarray([ids], jnp.int32))
  return np.asarray(jax.nn.log_softmax(logits[0], axis=-1))


def test_partial_rollout_stamps_each_token_with_its_policy_version(env):
  ep = _run_partial(env, recompute=False)
  turn0, turn1 = ep.turns
  v = ep.versions
  assert (v[:turn0.num_generated] == 0).all()
  assert (v[turn0.num_generated:turn1.start] == -1).all() and turn1.start - turn0.num_generated > 0  # tool tokens
  assert (v[turn1.start:] == 1).all() and turn1.num_generated > 0
  assert (ep.version_first, ep.version_last) == (0, 1)
  np.testing.assert_array_equal(v >= 0, ep.loss_mask != 0)


def test_recomputed_cache_gives_the_new_policy_log_probs(env):
  """After `recompute`, the second turn is drawn from a cache the new weights wrote: its log-probs equal one
  fresh forward of p1 over the transcript; continuing on p0's cache gives other values (the old context)."""
  _, _, p0, p1, _, prompt = env
  for recompute in (True, False):
    ep = _run_partial(env, recompute=recompute)
    ids = prompt + ep.response_ids.tolist()
    turn1 = ep.turns[1]
    pos = np.arange(turn1.start, turn1.start + turn1.num_generated)
    want = _full_logp(env, p1, ids)[len(prompt) + pos - 1, ep.response_ids[pos]]
    if recompute:
      np.testing.assert_allclose(ep.logp_raw[pos], want, atol=1e-4)
    else:
      assert np.abs(ep.logp_raw[pos] - want).max() > 1e-2
    # The first turn's log-probs are always p0's (its behaviour policy).
    pos0 = np.arange(ep.turns[0].num_generated)
    np.testing.assert_allclose(ep.logp_raw[pos0], _full_logp(env, p0, ids)[len(prompt) + pos0 - 1,
                                                                          ep.response_ids[pos0]], atol=1e-4)


def test_abort_drops_groups_in_flight_and_they_restart_alike(env):
  tok, _, p0, _, sampler, prompt = env
  ex = stub_executor(lambda code: ExecResult("ok", stdout="6\n"))
  try:
    loop = agent_loop.AgentLoop(sampler, n=2, tokenizer=tok, executor=ex, cfg=CFG, key=jax.random.key(3))
    loop.add([prompt] * 3, groups=[0, 1, 2])
    loop.step(p0, version=0)  # groups 0 and 1 start (4 slots); group 2 waits in the queue
    assert loop.in_flight_groups() == [0, 1] and list(loop.queue) == [2]
    assert loop.abort(jax.random.key(5)) == [0, 1, 2]
    assert not loop.busy and loop.state is None and not loop.done
    loop.add([prompt] * 3, groups=[0, 1, 2])  # the same ids may be added again
    while loop.busy:
      loop.step(p0, version=0)
    finished = loop.pop_finished_groups()
    assert [g for g, _ in finished] == [0, 1, 2] and all(len(eps) == 2 for _, eps in finished)
    # A restarted loop draws from its new key: the same as a fresh loop made with that key.
    fresh = agent_loop.AgentLoop(sampler, n=2, tokenizer=tok, executor=ex, cfg=CFG, key=jax.random.key(5))
    fresh.add([prompt] * 3, groups=[0, 1, 2])
    while fresh.busy:
      fresh.step(p0, version=0)
    again = fresh.pop_finished_groups()
    for (_, a), (_, b) in zip(finished, again):
      for x, y in zip(a, b):
        np.testing.assert_array_equal(x.response_ids, y.response_ids)
  finally:
    ex.close()


@pytest.mark.parametrize("refill", [True, False])
def test_refill_starts_queued_groups_beside_rows_still_decoding(env, refill):
  """A stream's loop (`refill=True`) starts a queued group in slots freed by a finished group while another group
  is still decoding; without it (a batch's loop) the queue waits for every row to stop."""
  tok, _, p0, _, sampler, prompt = env
  enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
  short, long = enc("It is 6.<|im_end|>"), enc("So " + "the answer is six, " * 5 + "6.<|im_end|>")
  assert F >= len(long) > 2 * SEG > SEG > len(short)
  ex = stub_executor(lambda code: ExecResult("ok", stdout="6\n"))
  try:
    loop = agent_loop.AgentLoop(sampler, n=2, tokenizer=tok, executor=ex, cfg=CFG, key=jax.random.key(7),
                                scripts=lambda ep: [long] if ep // 2 == 1 else [short], refill=refill)
    loop.add([prompt] * 3, groups=[0, 1, 2])
    order, finished = [], {}
    while loop.busy:
      loop.step(p0, version=0)
      for g, eps in loop.pop_finished_groups():
        order.append(g)
        finished[g] = eps
    # Refilled, group 2 runs in group 0's slots while the long group 1 decodes, and ends first.
    assert order == ([0, 2, 1] if refill else [0, 1, 2])
    for g, want in ((0, short), (1, long), (2, short)):
      assert all(e.response_ids.tolist()[:len(want)] == want for e in finished[g])
  finally:
    ex.close()
