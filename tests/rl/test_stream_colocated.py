"""The rollout stream on one mesh (colocated): with delayed weights the sampler decodes on its own copy of the old
weights while the update, which overwrites the trainer's arrays in place, computes the new ones; updates dispatched
with no segment between them are superseded, not stacked, unless the next batch needs the older one; weights taken on
arrival; the staleness guard."""

from flax import nnx
import jax
import pytest

from agentrl_jax import testing
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.rl import async_config
from agentrl_jax.rl import stream as stream_lib
from agentrl_jax.rollout.chat import stop_token_ids
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.engine import RenderedPrompts
from agentrl_jax.rollout.stub_executor import stub_executor
from agentrl_jax.sampling.config import SamplingConfig
from agentrl_jax.sampling.sampler import make_sampler
from agentrl_jax.tools import ExecResult

B, SEG = 4, 8
CFG = RolloutConfig(batch_size=B, segment_len=SEG, max_prompt_len=64, max_response_len=64, prompt_bucket_min=64,
                    chunk_len=64, cache_bucket_min=160)


class _Engine:
  def __init__(self, sampler, tok, executor, prompt):
    self.sampler, self.tokenizer, self.executor, self.cfg, self.prompt = sampler, tok, executor, CFG, prompt

  def render(self, records):
    return RenderedPrompts(ids=[self.prompt] * len(records), records=list(records), skipped=[])


def _batches():
  for step in range(100):
    yield [PromptRecord(prompt=[], data_source="t", ground_truth="", extra_info={}, index=step)]


def _run(weight_sync_segments: int):
  tok = testing.tiny_tokenizer()
  graphdef, p0 = nnx.split(testing.tiny_model(seed=11))
  _, p1 = nnx.split(testing.tiny_model(seed=12))
  end, tool_end = stop_token_ids(tok)
  n_forced = 40
  sampler = make_sampler(graphdef, testing.tiny_model().cfg, SamplingConfig(
      end_token_ids=end, tool_end_token_ids=tool_end, segment_len=SEG), batch=B, n_forced=n_forced)
  prompt = tok.encode(tokenizer_lib.render_chat(tok, [{"role": "user", "content": "Count."}],
                                                add_generation_prompt=True), add_special_tokens=False)
  short = tok.encode("one<|im_end|>", add_special_tokens=False)
  long = tok.encode("one two three four five six seven eight nine ten<|im_end|>", add_special_tokens=False)
  assert len(short) < SEG and 4 * SEG < len(long) <= n_forced  # batch 0 ends in a segment, later ones span five
  ex = stub_executor(lambda code: ExecResult("ok"))
  try:
    stream = stream_lib.RolloutStream(
        _Engine(sampler, tok, ex, prompt), _batches(),
        async_config.AsyncConfig(max_staleness=1, weight_sync_segments=weight_sync_segments), n=2,
        prompts_per_step=1, key=jax.random.key(0), score=lambda eps, rec: None,
        scripts=lambda ep: [short if ep < 2 else long])
    trainer = jax.tree.map(lambda x: x.copy(), p0)
    drawn = []
    for version in range(3):
      b = stream.next_batch(trainer, version=version)
      drawn.append(_versions(b))
      # The update donates the trainer's state: its arrays are overwritten in place, here deleted.
      new = jax.tree.map(lambda x: x.copy(), p1 if version % 2 == 0 else p0)
      jax.tree.map(lambda x: x.delete(), trainer)
      trainer = new
    return drawn
  finally:
    ex.close()


def test_delayed_weights_decode_on_the_streams_copy_while_the_update_overwrites_the_trainers():
  at_once, delayed = _run(0), _run(2)
  # Batch 0 ends within a segment; batch 1 started beside it on version 0. Version 1 reaches the sampler at the
  # next segment after batch 0 was handed over (its update dispatched), or two segments later: batch 1 holds two
  # segments more of version-0 tokens, drawn from the stream's copy of the arrays the update deleted.
  for run in (at_once, delayed):
    assert run[0] == [[0] * 3] * 2 and all(ep == sorted(ep) and ep[-1] == 1 for ep in run[1])
  count = lambda run, v: [ep.count(v) for ep in run[1]]  # noqa: E731
  assert [a + 2 * SEG for a in count(at_once, 0)] == count(delayed, 0) and min(count(delayed, 1)) > 0


def _stream(cfg, scripts, n=1, place=None):
  tok = testing.tiny_tokenizer()
  graphdef, p0 = nnx.split(testing.tiny_model(seed=11))
  end, tool_end = stop_token_ids(tok)
  sampler = make_sampler(graphdef, testing.tiny_model().cfg, SamplingConfig(
      end_token_ids=end, tool_end_token_ids=tool_end, segment_len=SEG), batch=B, n_forced=40)
  prompt = tok.encode(tokenizer_lib.render_chat(tok, [{"role": "user", "content": "Count."}],
                                                add_generation_prompt=True), add_special_tokens=False)
  words = {"short": "one<|im_end|>", "long": "one two three four five six seven eight nine ten<|im_end|>"}
  ex = stub_executor(lambda code: ExecResult("ok"))
  stream = stream_lib.RolloutStream(
      _Engine(sampler, tok, ex, prompt), _batches(), cfg, n=n, prompts_per_step=1, key=jax.random.key(0),
      score=lambda eps, rec: None, place=place,
      scripts=lambda ep: [tok.encode(words[scripts(ep)], add_special_tokens=False)])
  return stream, p0, ex


def test_updates_that_no_segment_counted_down_are_superseded_not_stacked():
  # Four slots, one episode a batch: batches 1 and 2 finish beside the long batch 3 and are handed over at once,
  # so updates 1 and 2 are dispatched with no decode segment between them. Each would hold a copy of the weights
  # until it fell due, and then be replaced by the next at once: only the newest is kept, and applied.
  stream, params, ex = _stream(async_config.AsyncConfig(max_staleness=3, weight_sync_segments=2),
                               lambda ep: "long" if ep == 3 else "short")
  try:
    pending, syncs = [], []
    for version in range(4):
      b = stream.next_batch(params, version=version)
      pending.append([p[0] for p in stream._pending])
      syncs.append(stream.stats.weight_syncs)
      params = jax.tree.map(lambda x: x + 0, params)  # the update's new arrays
    assert pending == [[], [1], [2], []]  # one pending copy at a time (version 1's dropped for version 2's)
    # Version 3 reached the sampler once batch 3 had nothing left to decode; 1 and 2 never drew a token.
    assert syncs == [0, 0, 0, 1]
    assert sorted({int(v) for eps, _ in b.groups.values() for e in eps for v in e.versions if v >= 0}) == [0, 3]
  finally:
    ex.close()


def _versions(batch):
  return [e.versions[e.versions >= 0].tolist() for eps, _ in batch.groups.values() for e in eps]


def test_a_batch_admitted_under_the_previous_weights_starts_on_them_not_on_the_newest():
  # Staleness 1, two segments of delay, one episode a batch (ep = batch). Batch 1 finishes beside the long batch
  # 0, so the trainer takes it at once after update 0: updates 0 and 1 are dispatched back to back. Batch 2,
  # queued under version 1 when the trainer dispatches update 1, starts on version 1 (a queued group is something
  # the sampler can run: it is not blocked) and takes version 2 two segments later, instead of waiting before its
  # first token for both updates.
  stream, params, ex = _stream(async_config.AsyncConfig(max_staleness=1, weight_sync_segments=2),
                               lambda ep: "short" if ep == 1 else "long")
  try:
    stream.next_batch(params, version=0)
    params = jax.tree.map(lambda x: x + 0, params)
    b1 = stream.next_batch(params, version=1)
    # Complete already: nothing could run, so version 1 was taken at once and batch 2 admitted (queued) on it.
    assert set(_versions(b1)[0]) == {0} and stream._sampler_version == 1 and stream.in_flight_groups == 1
    params = jax.tree.map(lambda x: x + 0, params)
    b2 = stream.next_batch(params, version=2)
    (drawn,) = _versions(b2)
    assert drawn == sorted(drawn) and drawn[0] == 1 and drawn[-1] == 2
    assert drawn.count(1) == 1 + 2 * SEG  # the prefill's draw and two segments
  finally:
    ex.close()


def test_arrival_weights_wait_until_computed_unless_nothing_else_can_run(monkeypatch):
  arrived = [False]
  monkeypatch.setattr(stream_lib, "_ready", lambda tree: arrived[0])
  stream, params, ex = _stream(async_config.AsyncConfig(max_staleness=1, weight_sync="arrival"),
                               lambda ep: "short" if ep == 1 else "long")
  try:
    stream.next_batch(params, version=0)
    params = jax.tree.map(lambda x: x + 0, params)
    stream.next_batch(params, version=1)  # not arrived, but nothing could run without it: taken
    assert stream._sampler_version == 1
    params = jax.tree.map(lambda x: x + 0, params)
    b2 = stream.next_batch(params, version=2)
    # Version 2 never arrived while batch 2 ran: every token of it drawn by version 1. Once batch 2 had finished,
    # nothing could run without version 2 (batch 3 needs it): taken then, batch 3 queued under it.
    assert set(_versions(b2)[0]) == {1} and stream._sampler_version == 2 and stream.in_flight_groups == 1
    arrived[0] = True
    params = jax.tree.map(lambda x: x + 0, params)
    b3 = stream.next_batch(params, version=3)
    # Version 3 arrived before batch 3's first segment: taken at once, every token of batch 3 drawn by it.
    assert set(_versions(b3)[0]) == {3} and not stream._pending and stream.stats.weight_syncs == 3
  finally:
    ex.close()


def test_a_group_older_than_the_bound_at_consumption_is_dropped_and_counted():
  # Every step consumes a batch, so admission keeps every group within the bound; a trainer that skipped
  # versions (here 0 -> 3) would break it, and the stream's guard drops the stale group instead of training it.
  stream, params, ex = _stream(async_config.AsyncConfig(max_staleness=1), lambda ep: "short", n=2)
  try:
    b0 = stream.next_batch(params, version=0)
    assert len(b0.groups) == 1 and stream.stats.stale_dropped == 0
    b1 = stream.next_batch(params, version=3)  # batch 1 was drawn at version 0 beside batch 0: 3 versions old
    assert b1.index == 1 and b1.groups == {} and stream.stats.stale_dropped == 1
  finally:
    ex.close()


@pytest.mark.parametrize("update_done", [True, False])
def test_a_delayed_disaggregated_transfer_waits_for_the_update_not_the_decode(monkeypatch, update_done):
  """Disaggregated with weight_sync_segments > 0, the transfer is dispatched once the update has produced the
  params (dispatched at once, the sampler's next segments would queue behind it until the update ended); if the
  update is still running when the weights fall due, the transfer goes then; and in any case before next_batch
  returns, as the trainer's next update donates those params."""
  monkeypatch.setattr(stream_lib, "_ready", lambda tree: update_done)
  calls = []
  stream = None

  def place(params):  # stands in for the transfer: when was it dispatched, in decode segments of the stream
    calls.append(stream.loop.stats.decode_calls)
    return params

  stream, params, ex = _stream(async_config.AsyncConfig(max_staleness=1, placement="disaggregated", sampler_devices=1,
                                                      weight_sync_segments=2),
                               lambda ep: "short" if ep == 0 else "long", place=place)
  try:
    stream.next_batch(params, version=0)  # the first weights, placed at once
    start = stream.loop.stats.decode_calls
    stream.next_batch(jax.tree.map(lambda x: x + 0, params), version=1)
    assert len(calls) == 2 and stream.stats.weight_syncs == 1
    # Done: at the first scheduling round. Running: when the weights fell due, two segments later.
    assert calls[1] == (start if update_done else start + 2)
  finally:
    ex.close()


def test_updates_dispatched_back_to_back_are_each_timed_one_after_the_other(monkeypatch):
  """An update dispatched while the previous one still runs (its step's batch was already complete) is timed
  too, from the previous one's end (the devices run them in order), and the first is not lost; the rollout's
  time blocked behind an update leaves out its tool waits, which count as such."""
  import threading
  import time
  import types

  clock = [0.0]
  monkeypatch.setattr(stream_lib, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

  class Update:  # an update's outputs: ready when the test says
    def __init__(self):
      self.done = threading.Event()

    def block_until_ready(self):
      self.done.wait()
      return self

  def finish(u, at, watch):
    clock[0] = at
    u.done.set()
    while not watch[1]:  # its watcher has read the clock
      time.sleep(0.001)

  stream, _, ex = _stream(async_config.AsyncConfig(max_staleness=1), lambda ep: "short")
  try:
    a, b = Update(), Update()
    clock[0] = 1.0
    stream.watch_update(a)
    clock[0] = 2.0
    stream.watch_update(b)  # a still runs
    first, second = stream._watches
    stream.loop.tool_wait_spans += [(0.5, 1.0), (2.0, 3.0), (4.5, 5.5)]  # the loop's tool waits meanwhile
    finish(a, 5.0, first)
    # a's results: 4 s on the devices, 3.5 s of them after next_batch began, 1.5 s of which the loop waited on
    # tools (counted as tool waits, not again as the update's)
    stream.poll_update(entered=1.5)
    assert (stream.stats.update_device_s, stream.stats.update_blocked_s) == (4.0, 2.0)
    assert stream.loop.tool_wait_spans == [(4.5, 5.5)]  # what could still overlap b
    finish(b, 6.0, second)
    into = stream_lib.StreamStats()
    stream.poll_update(into=into, wait=True)  # b ran from a's end at 5 s, not from its dispatch at 2 s
    assert (into.update_device_s, into.update_blocked_s) == (1.0, 0.0) and not stream._watches
    assert stream.loop.tool_wait_spans == []
  finally:
    ex.close()


@pytest.mark.parametrize("weight_sync_segments", [0, 2])
def test_a_step_that_skipped_its_update_renames_the_weights_version_without_a_sync(weight_sync_segments):
  """A step with no informative group trains nothing, so the next step hands the stream the same params under the
  next version: the newest weights (the sampler's, or the copy waiting) take that version; nothing is copied,
  applied or recomputed for it."""
  stream, params, ex = _stream(async_config.AsyncConfig(max_staleness=1, partial="recompute",
                                                      weight_sync_segments=weight_sync_segments),
                               lambda ep: "long", n=2)
  try:
    stream.next_batch(params, version=0)
    trained = jax.tree.map(lambda x: x + 0, params)  # step 1's update
    stream.next_batch(trained, version=1)
    copies = len(stream._pending) + stream.stats.weight_syncs  # version 1's weights: waiting or applied
    assert copies == 1
    for version in (2, 3):  # steps 2 and 3 skipped their updates
      stream.next_batch(trained, version=version)
      labels = [stream._sampler_version] + [p[0] for p in stream._pending]
      assert max(labels) == version and len(stream._pending) <= 1
      assert len(stream._pending) + stream.stats.weight_syncs == copies  # no copy made or applied for the rename
    if weight_sync_segments == 0:  # applied at once: version 1's weights recomputed the rows in flight, once
      assert stream.stats.weight_syncs == 1 and stream._sampler_version == 3
      recomputed = stream.stats.recomputed_tokens
      stream.next_batch(trained, version=4)
      assert stream.stats.recomputed_tokens == recomputed and stream.stats.weight_syncs == 1
  finally:
    ex.close()
