"""Asynchronous RL's settings (`config.rl.max_staleness` and the `rl.async_*` fields), checked where a run
starts and where the pre-flight plans one (`aot`), without the stream itself (`rl/stream.py`)."""

from __future__ import annotations

import dataclasses

PLACEMENTS = ("colocated", "disaggregated")
PARTIAL_MODES = ("continue", "recompute")
WEIGHT_SYNCS = ("segments", "arrival")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
  """Asynchronous RL settings (`config.rl`'s `max_staleness` and its `async_` fields).

  Attributes:
    max_staleness: most policy versions between a token's draw and its training; 0 is the synchronous loop.
    placement: "colocated" (rollout and trainer on one mesh; the update is dispatched between decode segments)
      or "disaggregated" (the sampler on its own devices, `sampler_devices` of them, weights moved after every
      update by one compiled transfer).
    partial: what in-flight episodes do when new weights arrive: "continue" on the cache the old weights wrote,
      or "recompute" it under the new weights first (AReaL's interruptible rollouts).
    weight_sync_segments: decode segments the sampler runs on its old weights after an update is dispatched
      before the new ones reach it (count-based, so runs stay deterministic); 0 = the next segment, which waits
      for the update (and, disaggregated, its transfer). More than 0 lets those segments run on the old weights:
      colocated on a copy the stream keeps (one more copy of the sampler's weights in device memory), still
      after the update, as a device runs its programs in dispatch order; disaggregated on the sampler's own
      devices, beside the update, where about (update seconds / decode segment seconds) keeps the sampler busy
      through it.
    sampler_devices: disaggregated: devices of the sampler (the last ones of the process's devices; the
      trainer keeps the rest).
    weight_sync: when new weights reach the sampler: "segments" (`weight_sync_segments` decode segments after
      the update's dispatch: counts, so a run is a function of its seed and config) or "arrival" (at the first
      decode segment after they have been computed, and moved: a disaggregated sampler never waits for an update
      unless nothing else can run, as verl's fully-async and AReaL's rollouts take weights; which tokens each
      version draws then follows the clock, so a rerun is not bit for bit the same).
  """

  max_staleness: int = 0
  placement: str = "colocated"
  partial: str = "continue"
  weight_sync_segments: int = 0
  sampler_devices: int = 0
  weight_sync: str = "segments"

  def __post_init__(self):
    for f in ("max_staleness", "weight_sync_segments", "sampler_devices"):
      v = getattr(self, f)
      if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"AsyncConfig.{f}: must be an int >= 0, got {v!r}")
    if self.placement not in PLACEMENTS:
      raise ValueError(f"AsyncConfig.placement: must be one of {PLACEMENTS}, got {self.placement!r}")
    if self.partial not in PARTIAL_MODES:
      raise ValueError(f"AsyncConfig.partial: must be one of {PARTIAL_MODES}, got {self.partial!r}")
    if self.weight_sync not in WEIGHT_SYNCS:
      raise ValueError(f"AsyncConfig.weight_sync: must be one of {WEIGHT_SYNCS}, got {self.weight_sync!r}")
    if self.placement == "disaggregated" and self.sampler_devices < 1:
      raise ValueError("AsyncConfig.sampler_devices: the disaggregated placement needs >= 1 sampler device")
    if self.placement == "disaggregated" and not self.enabled:
      raise ValueError("AsyncConfig.placement: the disaggregated placement is asynchronous RL's (the sampler "
                       "decodes while the trainer updates): set max_staleness >= 1 (0, the synchronous loop, "
                       "runs on one mesh)")

  @property
  def enabled(self) -> bool:
    return self.max_staleness > 0

  @property
  def delayed(self) -> bool:
    """The sampler may decode on older weights while an update computes (it keeps its own copy, colocated): a
    stream with weights on arrival or after segments; a synchronous loop has neither."""
    return self.enabled and (self.weight_sync == "arrival" or self.weight_sync_segments > 0)

  @classmethod
  def from_rl(cls, rl) -> AsyncConfig:
    """From a config's `rl` block: `max_staleness` and the `async_*` fields it sets."""
    kw = {f.name: rl.get(f.name if f.name == "max_staleness" else f"async_{f.name}")
          for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kw.items() if v is not None})
