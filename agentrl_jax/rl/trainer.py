"""The agentic RL trainer: `python -m agentrl_jax.main --config=configs/demystify_qwen3_4b.py --workdir=DIR`.

One function, `run(config, workdir)`, in the sections of big_vision's train.py. One step:

    prompts (grain) -> chat template -> multi-turn rollouts with the code tool (n per prompt, one prefill each)
    -> rewards + tool-call shaping + overlong penalty -> [dynamic sampling: drop groups of equal rewards, draw
    more prompts] -> group advantages -> old log-probs (recomputed, or the sampler's) -> one compiled update per
    mini-batch -> metrics, samples, periodic evaluation, checkpoint.

Responses whose reward could not be computed (sandbox down, harness or scorer error, malformed ground truth:
`rewards.RewardResult.failure`) carry no advantage and no loss, their groups are normalised without them, and
they are counted (`reward/infra_failures`, per data source); a step with more than `rl.max_infra_failure_frac` of
them stops the run (`batch.RunStopped`, naming the causes) before its update. An update whose loss or gradient
norm is not finite is skipped by the update step (parameters unchanged); such steps are counted and logged, save
no checkpoint, and `rl.max_consecutive_nonfinite_steps` of them in a row stop the run, the last checkpoint (of
finite parameters) kept.

The sampler reads the trainer's params directly (on `sampler_mesh`, its own layout over the same devices, when
set: a device-to-device reshard per rollout); the synchronous loop has no weight sync (the asynchronous one,
`rl.max_staleness` > 0, hands the stream each update's params: agentrl_jax/rl/stream.py). Several processes
(one per host): the rollout is one SPMD program whose rows live on their hosts' devices, each host runs its own
rows' tool calls and scores a share of the episodes, and the results are gathered so that every host makes the
same decisions (which groups are kept, the update batch); process 0 writes metrics and samples
(agentrl_jax/multihost.py).
A run killed at any point resumes from its latest checkpoint with the same config and workdir: the checkpoint
holds the train state, the grain iterator position, the PRNG key and the counters. With
`rollout.overlap_tools=False` (the default) and deterministic tool outputs, every step is a deterministic
function of those, so the resumed run reaches the same params bit for bit. (With overlap, when each row resumes
depends on tool timing, and so do the draws.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from agentrl_jax import checkpoint as ckpt_lib
from agentrl_jax import compile_stats, data, metrics_writer, multihost, rewards
from agentrl_jax import train_state as train_state_lib
from agentrl_jax.evaluation import runner as eval_runner
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.rl import advantages as adv_lib
from agentrl_jax.rl import async_config
from agentrl_jax.rl import batch as batch_lib
from agentrl_jax.rl import losses
from agentrl_jax.rl import offpolicy
from agentrl_jax.rl import stream as stream_lib
from agentrl_jax.rl import transfer as transfer_lib
from agentrl_jax.rl import update as update_lib
from agentrl_jax.rollout import engine as engine_lib
from agentrl_jax.rollout import jobs
from agentrl_jax.rollout.episode import collate
from agentrl_jax.tasks import tokenizer as embedded_tokenizer
from agentrl_jax.tools import executors as tool_executors

log = logging.getLogger(__name__)


def _mean(xs):
  return float(np.mean(xs)) if len(xs) else 0.0


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains; returns the metrics of the last step."""
  compiled0 = compile_stats.compile_totals()  # the job's compile work is reported in its metrics
  # ---------------------------------------------------------------------------------------------- config
  rl = config.rl
  loss_cfg = losses.LossConfig(**rl.loss)
  adv_cfg = adv_lib.AdvantageConfig(**rl.advantage)
  reward_cfg = jobs.reward_config(config.reward)
  shaping_cfg = rewards.ShapingConfig(
      max_response_tokens=config.rollout.max_response_len, overlong_buffer_tokens=config.reward.overlong_buffer_tokens,
      overlong_penalty_factor=config.reward.overlong_penalty_factor, tool_call_bonus=config.reward.tool_call_bonus,
      tool_call_cap=config.reward.tool_call_cap, tool_call_count=config.reward.get("tool_call_count", "executed"))
  rollout_cfg = engine_lib.rollout_config(config.rollout)
  ckpt_cfg = ckpt_lib.CheckpointConfig(**config.checkpoint)
  n = rl.n
  mini_rows = rl.mini_batch_prompts * n
  if rl.prompts_per_step % rl.mini_batch_prompts:
    raise ValueError(f"rl.prompts_per_step={rl.prompts_per_step} is not a multiple of rl.mini_batch_prompts="
                     f"{rl.mini_batch_prompts}")
  if mini_rows % rl.micro_batch_size:
    raise ValueError(f"rl.micro_batch_size={rl.micro_batch_size} must divide the mini-batch of "
                     f"{mini_rows} episodes (mini_batch_prompts x n)")
  if rl.get("pack_len"):
    if rl.pack_len < config.rollout.max_prompt_len + config.rollout.max_response_len:
      raise ValueError(f"rl.pack_len={rl.pack_len} is shorter than the longest episode (rollout.max_prompt_len + "
                       f"max_response_len = {config.rollout.max_prompt_len + config.rollout.max_response_len})")
    if loss_cfg.loss_agg_mode != "token-mean":
      raise ValueError(f"rl.pack_len needs rl.loss.loss_agg_mode='token-mean' (a packed row holds several "
                       f"sequences), got {loss_cfg.loss_agg_mode!r}")
  async_cfg = async_config.AsyncConfig.from_rl(rl)
  if async_cfg.placement == "disaggregated" and not async_cfg.delayed:
    log.warning("rl: disaggregated with rl.async_weight_sync_segments=0: the sampler takes each update's weights "
                "at its next decode segment, so it waits for every update and its transfer (nothing decodes beside "
                "them); about (update seconds / decode segment seconds) decodes on the old weights meanwhile, or "
                "rl.async_weight_sync='arrival' takes them once they have arrived")
  if loss_cfg.needs_proximal_logp and rl.reuse_sampler_logp:
    raise ValueError("rl.loss sets an off-policy correction, which weighs the trainer's recomputed log-probs (the "
                     "proximal policy) against the sampler's (the behaviour policy); rl.reuse_sampler_logp=True "
                     "makes them the same and the correction a no-op: set rl.reuse_sampler_logp=False")
  # The sampler's log-probs go to the update when a correction weighs them, or when the trainer recomputes the
  # old ones (then the update reports the behaviour-vs-trainer gap: IS weights, KL, perplexity ratio).
  keep_sampler_logp = loss_cfg.needs_proximal_logp or not rl.reuse_sampler_logp
  # Named keys from one root: init (random weights), sample (rollouts), update; each folded with the step.
  root = jax.random.key(config.seed)
  init_key, sample_key, eval_key, update_key = jax.random.split(root, 4)
  if async_cfg.placement == "disaggregated":  # the sampler on devices of its own (rl/transfer.py)
    mesh, sampler_mesh = transfer_lib.split_meshes(config.mesh, config.get("sampler_mesh"), async_cfg.sampler_devices)
  else:
    mesh = sharding_lib.mesh_from_config(config.mesh)
    sampler_mesh = sharding_lib.sampler_mesh_from_config(config.get("sampler_mesh"), mesh)

  # ---------------------------------------------------------------------------------------------- data
  style = jobs.prompt_style(config.get("prompt_style"))
  data_dir = config.data.data_dir or os.path.join(workdir, "tfds")
  # Several processes: process 0 builds the datasets in the workdir, then every process opens them, and every
  # process reads the same global batch of prompts (shard 0 of 1; see agentrl_jax/multihost.py).
  prompt_path = multihost.primary_first("rl_prompts", lambda: jobs.prompt_file(config, workdir))
  prepared = multihost.primary_first("rl_data", lambda: data.prepare(data.SourceConfig(
      path=prompt_path, schema=config.data.train_schema, data_dir=data_dir, skip_malformed=config.data.skip_malformed)))
  pipe_cfg = data.PipelineConfig(batch_size=rl.prompts_per_step, seed=config.seed, shuffle=config.data.shuffle,
                                 shard_index=0, shard_count=1)
  # A source no reward handles is refused now, naming its file and row, not after a step's rollout.
  known = lambda source: rewards.kind_for(source, reward_cfg)  # noqa: E731
  data.refuse_unknown_sources(prepared, known)
  data_iter = iter(data.prompt_batches(prepared.data_source, pipe_cfg, style=style))
  steps_per_epoch = max(prepared.num_examples // rl.prompts_per_step, 1)
  total_steps = rl.total_steps or rl.total_epochs * steps_per_epoch
  eval_records = multihost.primary_first("rl_eval_data", lambda: eval_runner.load_sources(
      config.eval.sources, data_dir, style, check=known)) if config.eval.sources else []
  log.info("rl: %d prompts (%d malformed skipped), %d per step x %d samples, %d steps; %d eval problems",
           prepared.num_examples, prepared.num_skipped, rl.prompts_per_step, n, total_steps, len(eval_records))

  # ---------------------------------------------------------------------------------------------- model & state
  opt_cfg = train_state_lib.OptimizerConfig(**config.optimizer)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), ckpt_cfg)
  counters = {"episodes": 0, "prompts": 0, "skipped_prompts": 0, "dropped_groups": 0, "generated_tokens": 0,
              "infra_failures": 0, "nonfinite_steps": 0, "stale_dropped": 0, "aborted_groups": 0}
  max_infra_frac, max_nonfinite = rl.max_infra_failure_frac, rl.max_consecutive_nonfinite_steps
  model_block = embedded_tokenizer.fill_model_block(config.model)
  tokenizer, model_cfg = ckpt_lib.tokenizer_and_config(model_block)
  lora = lora_lib.LoraConfig.from_block(config.get("lora"))  # rank 0: full fine-tuning
  graphdef, state, rng, step, restored_meta = train_state_lib.init_or_restore_train_state(
      ckpt, model_block, model_cfg, opt_cfg, mesh, root_key=root, init_key=init_key, data_iterator=data_iter,
      lora=lora)
  if step:
    counters.update(restored_meta.get("counters", {}))
    log.info("rl: resumed at step %d of %d", step, total_steps)
  reference = None  # the KL term's frozen reference (only when KL is on): the initial policy, or with LoRA the base
  if loss_cfg.needs_reference:
    reference = train_state_lib.reference_policy(model_block, mesh, init_key, lora)
  shardings = train_state_lib.train_state_shardings(state, mesh)
  update = update_lib.make_update_fn(graphdef, shardings, loss_cfg, opt_cfg, mesh, micro_batch_size=rl.micro_batch_size,
                                     temperature=config.rollout.temperature,
                                     logits_chunk_size=rl.logits_chunk_size or None)
  logprobs = update_lib.make_logprobs_fn(graphdef, shardings.params, mesh, micro_batch_size=rl.micro_batch_size,
                                         temperature=config.rollout.temperature,
                                         logits_chunk_size=rl.logits_chunk_size or None)
  executor = tool_executors.make_executor(engine_lib.tool_config(config.tools))
  # The sampler's policy: the train state's params read in place, or with LoRA merged weights (one merge a call).
  sampler_graphdef, merge_for_sampler = train_state_lib.sampler_policy(graphdef, state.params, mesh)
  sampler_params = jax.eval_shape(merge_for_sampler, state.params)  # shapes and logical axes: the sampler's shardings
  engine = engine_lib.RolloutEngine.create(
      sampler_graphdef, model_cfg, tokenizer, executor, rollout_cfg, temperature=config.rollout.temperature,
      top_p=config.rollout.top_p, top_k=config.rollout.top_k, advertise_tools=config.rollout.advertise_tools,
      mesh=sampler_mesh, params=sampler_params)
  eval_engine = None
  if eval_records:
    ev = config.eval
    eval_engine = engine_lib.RolloutEngine.create(
        sampler_graphdef, model_cfg, tokenizer, executor, rollout_cfg, temperature=ev.temperature, top_p=ev.top_p,
        top_k=ev.top_k, advertise_tools=config.rollout.advertise_tools, mesh=sampler_mesh, params=sampler_params)
  transfer = None  # disaggregated: the compiled weight transfer to the sampler's devices
  if async_cfg.placement == "disaggregated":
    merged_shardings = jax.tree.map(lambda x: x.sharding, merge_for_sampler(state.params))
    transfer = transfer_lib.WeightTransfer(merged_shardings, engine.sampler.param_shardings)
    t0 = time.perf_counter()
    jax.block_until_ready(transfer(merge_for_sampler(state.params)))
    log.info("rl: sampler on %d devices, trainer on %d; a weight transfer takes %.3f s (first, compile included)",
             sampler_mesh.devices.size, mesh.devices.size, time.perf_counter() - t0)

  def to_sampler(params):
    """The trainer's params -> the weights the sampler runs (LoRA merged; disaggregated: on its devices)."""
    merged = merge_for_sampler(params)
    return merged if transfer is None else transfer(merged)

  stream = None
  if async_cfg.enabled:  # the rollout stream of asynchronous RL (agentrl_jax/rl/stream.py)
    score_kw = dict(tokenizer=tokenizer, executor=executor, reward_cfg=reward_cfg, shaping_cfg=shaping_cfg,
                    max_workers=config.tools.max_concurrency or 8)
    # As `engine.run` reads them: merged, moved, then on the sampler's layout (a no-op when already there).
    place = lambda params: engine.sampler.place_params(to_sampler(params))  # noqa: E731
    stream = stream_lib.RolloutStream(
        engine, data_iter, async_cfg, n=n, prompts_per_step=rl.prompts_per_step, key=sample_key, place=place,
        score=lambda eps, record: batch_lib.score_episodes(eps, [record], **score_kw))
    stream_dir = os.path.join(workdir, "stream")
    if step:
      with open(os.path.join(stream_dir, f"{step}.pkl"), "rb") as f:
        stream.load_state_dict(pickle.load(f))
  bsh = update_lib.batch_sharding(mesh)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  # The tokenizer goes into the metadata so that an export (`python -m agentrl_jax.checkpoint`) can ship it.
  meta = {"model_config": dataclasses.asdict(model_cfg), "total_steps": total_steps,
          "tokenizer_path": model_block.get("tokenizer_path") or model_block.get("hf_path") or "",
          **train_state_lib.checkpoint_metadata(model_block, init_key, lora)}

  def save(step, force=False):
    if stream is not None and (force or ckpt.should_save(step)) and step not in ckpt.all_steps():
      # The stream's untrained batches go beside the checkpoint, written before it (a checkpoint is visible only
      # once committed, so a kill in between leaves the previous pair).
      stream_state, aborted = stream.state_dict(state.params, step)
      counters["aborted_groups"] += aborted
      multihost.write_pickle(os.path.join(stream_dir, f"{step}.pkl"), stream_state)
    saved = ckpt.maybe_save(step, {"train": train_state_lib.checkpointed(state), "rng": rng},
                            data_iterator=data_iter, force=force, metadata={**meta, "counters": counters})
    if saved and stream is not None:
      multihost.prune_files(stream_dir, keep={f"{s}.pkl" for s in ckpt.all_steps()})
    return saved

  def run_eval(step):
    if stream is None:
      weights = to_sampler(state.params)
    else:
      # The stream stops first (the step drained it), so the evaluation decodes beside no stream cache, on the
      # weights the sampler already holds (disaggregated: no second transfer).
      counters["aborted_groups"] += stream.stop(state.params, step)
      weights = stream.weights
    metrics, rows = eval_runner.evaluate(eval_engine, weights, eval_records, n=config.eval.n,
                                         key=jax.random.fold_in(eval_key, step), reward_cfg=reward_cfg,
                                         ks=config.eval.ks, progress="eval", leave=False)
    writer.write(step, {f"eval/{k}" if not k.startswith("eval/") else k: v for k, v in metrics.items()})
    writer.write_samples(step, [dict(r, kind="eval") for r in rows[:config.eval.samples_to_log]])
    return metrics

  def checkpoint_due(step):
    """Step `step` ends with a checkpoint (every `checkpoint.every_steps`, and the last)."""
    return ckpt.should_save(step) or step == total_steps

  def eval_due(step):
    return eval_engine is not None and config.eval.every_steps and (step % config.eval.every_steps == 0
                                                                    or step == total_steps)

  def finish_step(d):
    """Metrics, samples, evaluation and checkpoint of a step whose update was dispatched."""
    nonlocal last, nonfinite_run
    step, episodes, sc, valid, times = d["step"], d["episodes"], d["sc"], d["valid"], d["times"]
    t0 = time.perf_counter()
    updates = multihost.to_host(d["updates"])
    times["update"] += time.perf_counter() - t0
    if d["finish_now"]:  # the loop waits for this update before its next step: the step ends with the results
      d["t_done"], d["cpu_done"] = time.perf_counter(), metrics_writer.cpu_seconds()
    if stream is not None:  # a step that waited for its own update counts its device time (else the next one does)
      stream.poll_update(into=d["stream_stats"] if d["finish_now"] else None, wait=d["finish_now"])
    skipped = int(sum(float(u["skipped"]) for u in updates))
    nonfinite_run = nonfinite_run + 1 if skipped else 0
    if skipped:
      counters["nonfinite_steps"] += 1
      log.warning("rl: step %d: %d of %d updates had a non-finite loss or gradient norm and were skipped "
                  "(parameters unchanged); %d such step(s) in a row, the run stops at %d", step, skipped,
                  len(updates), nonfinite_run, max_nonfinite)
    calls = sum(e.num_tool_calls for e in episodes)
    failed = sum(e.num_failed_calls for e in episodes)
    lengths = np.array([e.response_len for e in episodes])
    step_s = d["t_done"] - d["t_step"]
    cpu_busy = metrics_writer.cpu_busy_frac(d["cpu_done"] - d["cpu_step"], step_s)
    st = d["stream_stats"]
    update_s = times["update"] if st is None else st.update_device_s
    # Asynchronous: the stream's time that was no rollout work (behind the update on the same devices, scoring
    # finished groups on the host, waiting for a transfer), besides its tool waits (a tool wait while the update
    # blocked the devices counts once, as a tool wait).
    not_rollout_s = 0.0 if st is None else st.update_blocked_s + st.scoring_s + st.weight_wait_s
    staleness = d["staleness"]
    last = {
        "reward/mean": _mean(sc.reward[valid]), "reward/score_mean": _mean(sc.score[valid]),
        "reward/acc": _mean(sc.acc[valid]), "reward/overlong_frac": _mean(sc.truncated),
        "reward/overlong_penalty_mean": _mean(sc.overlong_penalty), **d["tally"].metrics(),
        "train/nonfinite_updates": float(skipped),
        "response/length_mean": _mean(lengths), "response/length_max": float(lengths.max()),
        "response/tool_calls_mean": calls / len(episodes),
        "response/malformed_calls_mean": _mean([e.num_malformed_calls for e in episodes]),
        "response/turns_mean": _mean([e.num_turns for e in episodes]),
        "groups/informative_frac": d["informative_total"] / max(d["groups_seen"], 1),
        "groups/rounds": float(d["rounds"]), "groups/trained": float(len(d["records"])),
        **{f"train/{k}": v for k, v in offpolicy.reduce_update_metrics(updates).items()},
        **{f"time/{k}_s": v for k, v in times.items()}, "time/step_s": step_s,
        # Idle: the fraction of the step in which no update ran (trainer), or no rollout work could run (blocked
        # on tools with nothing to decode, behind an update on the same devices, or the host busy with the
        # trainer's bookkeeping). Synchronous: the update is the wait for its results.
        "time/trainer_idle_frac": 1.0 - min(update_s, step_s) / step_s,
        "time/rollout_idle_frac": 1.0 - max(times["rollout"] - times["tools"] - not_rollout_s, 0.0) / step_s,
        # How full the host's cores were over the step (this process and its sandbox workers): a schedule that
        # overlaps more of the same work gains at most 1 / this.
        "time/cpu_busy_frac": cpu_busy,
        "async/staleness_mean": float(staleness.mean()), "async/staleness_max": float(staleness.max()),
        "async/partial_frac": _mean([e.version_last > e.version_first for e in episodes]),
        # As the step was dispatched (a deferred step is logged after the next step's rollouts have counted),
        # with what finishing it changed.
        **{f"count/{k}": float(v) for k, v in dict(d["counters"], nonfinite_steps=counters["nonfinite_steps"],
                                                   aborted_groups=counters["aborted_groups"]).items()},
        **compile_stats.metrics_since(compiled0),
    }
    if calls:
      last["response/tool_success_rate"] = 1.0 - failed / calls
    if st is not None:
      last.update({"async/buffer_groups": float(st.buffered_groups), "async/in_flight_groups": float(st.in_flight),
                   "async/weight_syncs": float(st.weight_syncs), "async/recomputed_tokens": float(st.recomputed_tokens),
                   "time/weight_transfer_s": st.transfer_s, "time/weight_wait_s": st.weight_wait_s,
                   "time/update_device_s": st.update_device_s,
                   "async/admission_stalls": float(st.admission_stalls), "async/occupied_rows": st.occupied_rows})
    for alarm in offpolicy.offpolicy_alarms(last):
      log.warning("rl: step %d: %s", step, alarm)
    bar.set_postfix(reward=f"{last['reward/mean']:.3f}", acc=f"{last['reward/acc']:.3f}")
    if step % config.log_every_steps == 0 or step == total_steps:
      writer.write(step, last)
    if config.samples_every_steps and (step % config.samples_every_steps == 0 or step == 1):
      writer.write_samples(step, [{"kind": "train", "transcript": e.transcript, "reward": float(sc.reward[i]),
                                   "acc": bool(sc.acc[i]), "pred": sc.pred[i], "advantage": float(d["adv"][i]),
                                   "failure": sc.failure[i], "info": sc.info[i]}
                                  for i, e in enumerate(episodes[:config.samples_per_log])])
    if eval_due(step):
      run_eval(step)
    if nonfinite_run >= max_nonfinite:
      raise batch_lib.RunStopped(
          f"rl: step {step}: {nonfinite_run} steps in a row had updates with a non-finite loss or gradient norm "
          f"(rl.max_consecutive_nonfinite_steps={max_nonfinite}); stopping. Their updates were skipped, so the "
          "parameters stayed finite; the last checkpoint is kept (none is written for a non-finite step).")
    if not skipped:  # a step whose update was skipped saves nothing: the last checkpoint stays the last finite one
      save(step, force=step == total_steps)

  # ---------------------------------------------------------------------------------------------- loop
  writer = metrics_writer.MetricsWriter(workdir, start_step=step, config=config.to_dict(),
                                        wandb_project=config.get("wandb_project") or None)
  bar = metrics_writer.progress_bar(total_steps, initial=step, desc="rl")
  last: dict[str, float] = {}
  nonfinite_run = 0  # consecutive steps with a skipped (non-finite) update
  pending = None  # an asynchronous step whose update was dispatched and is finished after the next rollouts
  try:
    if eval_engine is not None and step == 0 and config.eval.at_start:
      run_eval(0)
    while step < total_steps:
      t_step, cpu_step = time.perf_counter(), metrics_writer.cpu_seconds()
      # ---- rollouts (+ dynamic sampling rounds)
      episodes, records, scored_parts, times = [], [], [], {"rollout": 0.0, "tools": 0.0, "scoring": 0.0}
      rounds, informative_total, groups_seen = 0, 0, 0
      tally = batch_lib.InfraTally()
      while True:
        if stream is None:  # synchronous: draw a batch, run it to completion under the current params, score it
          rendered = engine.render(next(data_iter))
          counters["skipped_prompts"] += len(rendered.skipped)
          round_records, eps, scored = rendered.records, [], None
          if rendered.ids:
            t0 = time.perf_counter()
            eps, stats = engine.run(to_sampler(state.params), rendered.ids, n=n,
                                    key=jax.random.fold_in(jax.random.fold_in(sample_key, step), rounds))
            times["rollout"] += time.perf_counter() - t0
            times["tools"] += stats.tool_wait_s
            counters["generated_tokens"] += stats.generated_tokens
            t0 = time.perf_counter()
            scored = batch_lib.score_episodes(eps, rendered.records, tokenizer=tokenizer, executor=executor,
                                              reward_cfg=reward_cfg, shaping_cfg=shaping_cfg,
                                              max_workers=config.tools.max_concurrency or 8)
            times["scoring"] += time.perf_counter() - t0
        else:  # asynchronous: the oldest untrained batch of the stream, scored as its groups finished
          # The step before a checkpoint or an evaluation drains the stream: stopping it then (a checkpoint keeps
          # no KV cache, an evaluation decodes beside none) aborts no episode in flight.
          b = stream.next_batch(state.params, version=step, drain=checkpoint_due(step + 1) or eval_due(step + 1))
          counters["skipped_prompts"] += b.skipped
          order = sorted(b.groups)
          round_records = [b.records[p] for p in order]
          eps = [dataclasses.replace(e, group=i) for i, p in enumerate(order) for e in b.groups[p][0]]
          scored = batch_lib.Scored.concat([b.groups[p][1] for p in order]) if order else None
        if eps:
          tally.add(scored)
          keep = batch_lib.informative_groups(scored.score, n, valid=~scored.infra)
          groups_seen += len(keep)
          informative_total += int(keep.sum())
          if not rl.dynamic_sampling:
            keep[:] = True
          counters["dropped_groups"] += int((~keep).sum())
          for g in np.flatnonzero(keep):
            idx = slice(g * n, (g + 1) * n)
            base = len(records)
            records.append(round_records[g])
            for e in eps[idx]:
              episodes.append(dataclasses.replace(e, group=base))
            scored_parts.append(scored.select(range(g * n, (g + 1) * n)))
        rounds += 1
        if (not rl.dynamic_sampling or len(records) >= rl.prompts_per_step
            or rounds > rl.dynamic_sampling_max_extra_rounds):
          break
      if pending is not None:
        finish_step(pending)
        pending = None
      if stream is not None:
        st = stream.take_stats()
        times.update(rollout=st.rollout_s, tools=st.tool_wait_s, scoring=st.scoring_s, recompute=st.recompute_s)
        counters["generated_tokens"] += st.generated_tokens
        counters["stale_dropped"] += st.stale_dropped
      counters["infra_failures"] += tally.count
      if tally.count:
        log.warning("rl: step %d: %d of %d responses could not be scored (%s); left out of the advantages",
                    step + 1, tally.count, tally.responses, tally.example[:200])
      try:
        tally.check(max_infra_frac, step + 1)
      except batch_lib.RunStopped as e:
        log.error("%s", e)
        if step:
          save(step, force=True)
        raise
      if not records:
        log.warning("rl: step %d: no informative group after %d rounds; skipping the update", step + 1, rounds)
        step += 1
        bar.update(1)
        continue
      if len(records) > rl.prompts_per_step:  # dynamic sampling overshot: keep a full batch, as DAPO does
        records, episodes = records[:rl.prompts_per_step], episodes[:rl.prompts_per_step * n]
        scored_parts = scored_parts[:rl.prompts_per_step]
      sc = batch_lib.Scored.concat(scored_parts)
      # Staleness of the trained tokens: versions between the policy that drew each token and this update's.
      # (Synchronous: every token was drawn by this step's params, whatever version the rollout stamped.)
      drawn = [[step]] if stream is None else [e.versions[e.versions >= 0] for e in episodes if e.versions is not None]
      staleness = step - np.concatenate(drawn or [[step]])
      counters["episodes"] += len(episodes)
      counters["prompts"] += len(records)

      # ---- advantages and the update batch
      # Infrastructure failures carry no signal: out of their group's statistics, the advantages and the loss.
      # Computed over a full step's episodes (the groups dynamic sampling dropped as invalid padding), so the
      # advantage ops compile for one shape instead of one per number of kept groups.
      valid = ~sc.infra
      rows = max(rl.prompts_per_step, len(records)) * n
      padded = np.zeros(rows, np.float32)
      padded[:len(sc.reward)] = sc.reward
      padded_valid = np.zeros(rows, bool)
      padded_valid[:len(valid)] = valid
      adv = np.asarray(adv_lib.compute_advantages(
          jnp.asarray(padded), jnp.asarray(np.repeat(np.arange(rows // n), n)), adv_cfg,
          valid=jnp.asarray(padded_valid)))[:len(sc.reward)]
      collated = collate(episodes, pad_id=pad_id, prompt_bucket_min=rollout_cfg.prompt_bucket_min,
                         response_bucket_min=rl.response_bucket_min, batch_multiple=mini_rows)
      full = batch_lib.update_batch(collated, adv, keep=valid)
      full["lengths"] = collated["prompt_lens"] + collated["response_lens"]

      # ---- old (and reference) log-probs, then one update per mini-batch
      t0 = time.perf_counter()
      minis = []
      for mb in batch_lib.split_minibatches(full, mini_rows):
        lengths = mb.pop("lengths")
        if rl.get("pack_len"):  # several episodes per row; one update shape whatever the lengths
          mb = batch_lib.pack_minibatch(mb, lengths, pack_len=rl.pack_len, micro_batch_size=rl.micro_batch_size)
        arrays = multihost.to_global(mb, bsh)  # each process builds its own devices' rows
        scoring = {k: arrays[k] for k in update_lib.LOGPROB_KEYS if k in arrays}
        if rl.reuse_sampler_logp:
          arrays["old_logp"] = arrays["sampler_logp"]
        else:
          arrays["old_logp"] = logprobs(state.params, scoring)
        if reference is not None:
          arrays["ref_logp"] = logprobs(reference(state.params), scoring)
        if not keep_sampler_logp:
          arrays.pop("sampler_logp")
        minis.append(arrays)
      times["logprobs"] = time.perf_counter() - t0
      t0 = time.perf_counter()
      updates = []
      for epoch in range(rl.epochs_per_batch):
        for i, arrays in enumerate(minis):
          key = jax.random.fold_in(jax.random.fold_in(update_key, step), epoch * len(minis) + i)
          state, m = update(state, arrays, key)
          updates.append(m)
      times["update"] = time.perf_counter() - t0  # dispatch; finish_step adds the wait for the results
      if stream is not None:
        stream.watch_update(updates[-1])
      step += 1
      bar.update(1)
      done = dict(step=step, updates=updates, episodes=episodes, records=records, sc=sc, valid=valid, adv=adv,
                  times=times, t_step=t_step, t_done=time.perf_counter(), cpu_step=cpu_step,
                  cpu_done=metrics_writer.cpu_seconds(), tally=tally, rounds=rounds,
                  informative_total=informative_total, groups_seen=groups_seen, staleness=staleness,
                  stream_stats=st if stream is not None else None, counters=dict(counters))
      # Asynchronous runs finish a step (fetch its update's metrics, log) after the next step's rollouts, so the
      # host goes back to the stream at once and the update runs while it decodes; a step that evaluates,
      # checkpoints or ends the run finishes now (a checkpoint needs the update's results anyway).
      done["finish_now"] = stream is None or checkpoint_due(step) or eval_due(step)
      if done["finish_now"]:
        finish_step(done)
      else:
        pending = done
  finally:
    bar.close()
    ckpt.close()
    writer.close()
    executor.close()
  return last
