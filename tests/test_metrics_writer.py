"""MetricsWriter: TensorBoard events + metrics.jsonl + samples.jsonl; resume drops the killed run's later records."""

from __future__ import annotations

import glob
import io
import json
import math
import os
import sys
import types

import jax.numpy as jnp
import numpy as np

from agentrl_jax import metrics_writer


def _jsonl(path):
  return [json.loads(line) for line in open(path)]


def _tb_scalars(logdir):
  """{tag: [(step, value)]} of every event file in `logdir` (TFRecord framing: length, crc, data, crc)."""
  import struct

  from tensorboardX.proto import event_pb2

  out = {}
  for path in sorted(glob.glob(f"{logdir}/events.out.tfevents.*")):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
      (n,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
      pos += 12 + n + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, v.simple_value))
      if event.session_log.status == event.session_log.START:  # TensorBoard's purge marker
        out.setdefault("__purge__", []).append(event.step)
  return out


def test_metrics_writer_writes_jsonl_tensorboard_and_samples(tmp_path):
  with metrics_writer.MetricsWriter(tmp_path, config={"lr": 1e-5}) as w:
    w.write(1, {"loss": jnp.float32(2.5), "tokens": np.int64(7), "ok": True, "nan": float("nan"), "hist": [1, 2]})
    w.write(2, {"loss": 1.5})
    w.write_samples(2, [{"prompt": "1+1?", "response": "2", "reward": jnp.float32(1.0)}])
  lines = _jsonl(tmp_path / "metrics.jsonl")
  assert lines[0]["step"] == 1 and lines[0]["loss"] == 2.5 and lines[0]["tokens"] == 7 and lines[0]["hist"] == [1, 2]
  assert math.isnan(lines[0]["nan"]) and lines[1] == {"step": 2, "loss": 1.5}
  assert _jsonl(tmp_path / "samples.jsonl") == [{"step": 2, "prompt": "1+1?", "response": "2", "reward": 1.0}]
  assert json.load(open(tmp_path / "config.json")) == {"lr": 1e-5}
  scalars = _tb_scalars(str(tmp_path / "tensorboard"))
  assert scalars["loss"] == [(1, 2.5), (2, 1.5)] and scalars["tokens"] == [(1, 7.0)] and "hist" not in scalars


def test_metrics_writer_resume_drops_records_after_the_checkpoint(tmp_path):
  with metrics_writer.MetricsWriter(tmp_path) as w:
    for step in range(1, 6):
      w.write(step, {"loss": float(step)})
      w.write_samples(step, [{"text": str(step)}])
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 6, "loss": ')  # a line cut short by SIGKILL
  with metrics_writer.MetricsWriter(tmp_path, start_step=3) as w:  # resumed from the checkpoint at step 3
    w.write(4, {"loss": 40.0})
  assert [(m["step"], m["loss"]) for m in _jsonl(tmp_path / "metrics.jsonl")] == [(1, 1.0), (2, 2.0), (3, 3.0),
                                                                                  (4, 40.0)]
  assert [s["step"] for s in _jsonl(tmp_path / "samples.jsonl")] == [1, 2, 3]
  # TensorBoard: the raw files hold both runs' events; the resumed writer's START marker at step 4 makes
  # TensorBoard discard the first run's events from step 4 on.
  scalars = _tb_scalars(str(tmp_path / "tensorboard"))
  assert scalars["__purge__"] == [4] and scalars["loss"][-1] == (4, 40.0)


class _FakeRun:
  def __init__(self):
    self.logged, self.finished = [], 0

  def log(self, data, step=None):
    self.logged.append((step, dict(data)))

  def finish(self):
    self.finished += 1


def _fake_wandb():
  """A stand-in `wandb` module recording what the writer sends it (so the branch runs with or without wandb)."""
  module = types.ModuleType("wandb")
  module.inits, module.runs = [], []

  def init(**kwargs):
    module.inits.append(kwargs)
    module.runs.append(_FakeRun())
    return module.runs[-1]

  module.init = init
  return module


def test_metrics_writer_logs_finite_scalars_to_wandb(tmp_path, monkeypatch):
  fake = _fake_wandb()
  monkeypatch.setitem(sys.modules, "wandb", fake)
  config = {"rl": {"n": 16}}
  with metrics_writer.MetricsWriter(tmp_path / "run_a", config=config, wandb_project="demystify") as w:
    w.write(3, {"loss": jnp.float32(0.5), "ok": True, "nan": float("nan"), "inf": float("inf"), "hist": [1, 2],
                "tokens": np.int64(12)})
    w.write(4, {"loss": 0.25})
    w.write_samples(4, [{"text": "not a metric"}])
  (init,) = fake.inits
  assert init == {"project": "demystify", "name": "run_a", "config": config, "resume": "allow",
                  "dir": str(tmp_path / "run_a")}
  (run,) = fake.runs
  # Scalars only (no lists, no samples); NaN and inf stay in metrics.jsonl but are not sent.
  assert run.logged == [(3, {"loss": 0.5, "ok": 1, "tokens": 12}), (4, {"loss": 0.25})]
  assert run.finished == 1
  assert math.isinf(_jsonl(tmp_path / "run_a" / "metrics.jsonl")[0]["inf"])

  with metrics_writer.MetricsWriter(tmp_path / "run_b", wandb_project="p", wandb_name="named") as w:
    pass
  assert fake.inits[1]["name"] == "named" and fake.inits[1]["config"] is None and fake.runs[1].finished == 1
  metrics_writer.MetricsWriter(tmp_path / "run_c").close()  # no project: wandb is not touched
  assert len(fake.inits) == 2


def test_metrics_writer_wandb_missing_is_a_warning_and_progress_bar(tmp_path, caplog, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, installed or not
  with metrics_writer.MetricsWriter(tmp_path, wandb_project="p") as w:
    w.write(1, {"loss": 1.0})
  assert "wandb is not installed" in caplog.text
  assert _jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 1.0}]
  out = io.StringIO()
  bar = metrics_writer.progress_bar(10, initial=4, file=out)
  bar.update(1)
  bar.set_postfix(loss="0.5")
  bar.close()
  assert bar.n == 5 and "5/10" in out.getvalue() and "loss=0.5" in out.getvalue()


_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_cpu_seconds_counts_descendants_reaped_by_a_live_child():
  """A sandbox worker (a live child) runs programs and reaps them: their CPU time counts through the worker's
  children_* times, and a sleeping child costs nothing."""
  import subprocess
  import time

  # A "worker" that runs a 0.4 CPU-second program as its own child, reaps it, then sleeps until told to stop.
  worker_code = ("import subprocess, sys, time\n"
                 f"subprocess.run([sys.executable, '-c', {_BURN.format(s=0.4)!r}], check=True)\n"
                 "print('ran', flush=True)\nsys.stdin.readline()\n")
  before = metrics_writer.cpu_seconds()
  t0 = time.perf_counter()
  worker = subprocess.Popen([sys.executable, "-c", worker_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
  try:
    assert worker.stdout.readline().strip() == "ran"
    during = metrics_writer.cpu_seconds() - before  # the worker is alive: its reaped program counts through it
    wall = time.perf_counter() - t0
  finally:
    worker.communicate("\n", timeout=60)
  assert 0.4 <= during < 0.4 + wall + 1.0, (during, wall)  # + the interpreters' start-up, bounded by the wall time


def test_cpu_busy_frac_is_cpu_over_wall_times_cores():
  cores = len(os.sched_getaffinity(0))
  assert math.isclose(metrics_writer.cpu_busy_frac(3.0 * cores, 4.0), 0.75)
  assert metrics_writer.cpu_busy_frac(1.0, 0.0) > 0  # no division by zero
