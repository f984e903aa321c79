"""Metrics and samples of a run: TensorBoard events, JSONL files, optional W&B, and a tqdm progress bar.

    writer = MetricsWriter(workdir, start_step=restored_step, config=config.to_dict())
    writer.write(step, {"loss": 0.5, "lr": 1e-5})         # TensorBoard scalars + one line of metrics.jsonl
    writer.write_samples(step, [{"prompt": ..., "response": ..., "reward": 1.0}])   # samples.jsonl
    writer.close()

Files under `workdir`: `tensorboard/` (events), `metrics.jsonl` (`{"step": s, **metrics}` per line) and
`samples.jsonl` (`{"step": s, **sample}` per line). On resume, pass `start_step` (the restored step): lines and
TensorBoard events of later steps, written by the run that was killed after its last checkpoint, are dropped,
so the logs read as if the run had never stopped. Only JAX process 0 writes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import jax
import numpy as np
import psutil
import tqdm

log = logging.getLogger(__name__)


def _scalar(value: Any) -> float | int | None:
  """A Python number for a scalar metric (jax/numpy scalars included); None for anything else."""
  if isinstance(value, (bool, np.bool_)):
    return int(value)
  if isinstance(value, (int, float, np.integer, np.floating)):
    return value.item() if hasattr(value, "item") else value
  if isinstance(value, (jax.Array, np.ndarray)) and value.size == 1:
    return np.asarray(value).item()
  return None


def _json_default(value: Any) -> Any:
  scalar = _scalar(value)
  if scalar is not None:
    return scalar
  if isinstance(value, (jax.Array, np.ndarray)):
    return np.asarray(value).tolist()
  return str(value)


def _truncate_jsonl(path: str, start_step: int) -> None:
  """Drops lines with `step > start_step` (written after the checkpoint a run resumes from)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  kept = []
  for line in lines:
    try:
      if json.loads(line).get("step", 0) <= start_step:
        kept.append(line)
    except json.JSONDecodeError:  # a line cut short by the kill
      continue
  if len(kept) != len(lines):
    with open(path, "w") as f:
      f.writelines(kept)


class MetricsWriter:
  """Writes scalar metrics to TensorBoard + `metrics.jsonl` (+ W&B) and samples to `samples.jsonl`.

  Args:
    workdir: the run's directory.
    start_step: the step a resumed run restarts from (0 for a fresh run); later records are dropped.
    config: run config (a dict) recorded as `config.json` and passed to W&B.
    wandb_project: log to Weights & Biases too (only when `wandb` is installed; otherwise a warning).
    wandb_name: the W&B run name (default the workdir's basename).
  """

  def __init__(self, workdir: str | os.PathLike, *, start_step: int = 0, config: dict[str, Any] | None = None,
               wandb_project: str | None = None, wandb_name: str | None = None):
    self.workdir = os.fspath(workdir)
    self.active = jax.process_index() == 0
    self._tb = self._wandb = None
    if not self.active:
      return
    os.makedirs(self.workdir, exist_ok=True)
    self.metrics_path = os.path.join(self.workdir, "metrics.jsonl")
    self.samples_path = os.path.join(self.workdir, "samples.jsonl")
    for path in (self.metrics_path, self.samples_path):
      _truncate_jsonl(path, start_step)
    if config is not None:
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, default=str)
    import tensorboardX  # heavy import, only where it is used

    # purge_step: TensorBoard hides the killed run's events after the restored step.
    self._tb = tensorboardX.SummaryWriter(os.path.join(self.workdir, "tensorboard"),
                                          purge_step=start_step + 1 if start_step else None, flush_secs=30)
    if wandb_project:
      try:
        import wandb
      except ImportError:
        log.warning("wandb_project=%r but wandb is not installed; logging to TensorBoard and JSONL only",
                    wandb_project)
      else:
        self._wandb = wandb.init(project=wandb_project, name=wandb_name or os.path.basename(self.workdir),
                                 config=config, resume="allow", dir=self.workdir)

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    """Logs scalar metrics of `step`; non-scalar values go to the JSONL line only; NaN/inf are kept."""
    if not self.active:
      return
    scalars = {k: s for k, v in metrics.items() if (s := _scalar(v)) is not None}
    for name, value in scalars.items():
      self._tb.add_scalar(name, value, step)
    with open(self.metrics_path, "a") as f:
      f.write(json.dumps({"step": int(step), **metrics}, default=_json_default) + "\n")
    if self._wandb is not None:
      self._wandb.log({k: v for k, v in scalars.items() if math.isfinite(v)}, step=step)

  def write_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
    """Appends one JSONL line per sample (e.g. prompt, response, reward), tagged with `step`."""
    if not self.active or not samples:
      return
    with open(self.samples_path, "a") as f:
      for sample in samples:
        f.write(json.dumps({"step": int(step), **sample}, default=_json_default, ensure_ascii=False) + "\n")

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def progress_bar(total: int, *, initial: int = 0, desc: str = "train", **kwargs) -> tqdm.tqdm:
  """A tqdm bar over steps (disabled on processes other than 0); `bar.set_postfix(loss=...)` shows metrics."""
  return tqdm.tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                   disable=jax.process_index() != 0 or kwargs.pop("disable", False), **kwargs)


def cpu_seconds() -> float:
  """CPU seconds (user + system) used by this process and every process under it (the sandboxes' workers and
  the programs they ran and reaped), as the kernel counts them. A descendant that exits unreaped while its
  parent exits too drops out of the sum, so take differences over spans with no worker restart."""
  me = psutil.Process()
  total = 0.0
  for proc in [me, *me.children(recursive=True)]:
    try:
      t = proc.cpu_times()
    except psutil.Error:  # exited between the listing and the read
      continue
    total += t.user + t.system + t.children_user + t.children_system
  return total


def cpu_busy_frac(cpu_s: float, wall_s: float) -> float:
  """The fraction of this host's usable cores (`sched_getaffinity`) that `cpu_s` CPU seconds kept busy over
  `wall_s` seconds. A schedule that overlaps more of the same work cannot beat `1 / busy` times the wall time of
  the one measured: near 1, the cores are already full (XLA:CPU's thread pools count while they spin)."""
  return cpu_s / max(wall_s * len(os.sched_getaffinity(0)), 1e-9)
