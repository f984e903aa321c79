"""Asynchronous RL's settings (rl/async_config.py): what a config's rl block gives, and the settings refused."""

import pytest

from agentrl_jax.rl import async_config


def test_async_config_refuses_settings_that_cannot_run_as_asked():
  ok = async_config.AsyncConfig.from_rl({"max_staleness": 2, "async_placement": "disaggregated",
                                         "async_sampler_devices": 4, "async_weight_sync_segments": 3})
  assert (ok.max_staleness, ok.placement, ok.sampler_devices, ok.weight_sync_segments) == (2, "disaggregated", 4, 3)
  assert ok.weight_sync == "segments" and ok.delayed
  arrival = async_config.AsyncConfig.from_rl({"max_staleness": 1, "async_weight_sync": "arrival"})
  assert arrival.weight_sync == "arrival" and arrival.weight_sync_segments == 0 and arrival.delayed
  assert not async_config.AsyncConfig(max_staleness=1).delayed
  assert not async_config.AsyncConfig(weight_sync_segments=2).delayed  # synchronous: no stream, no second copy
  for kw, msg in [(dict(max_staleness=-1), "max_staleness: must be an int >= 0"),
                  (dict(max_staleness=True), "max_staleness: must be an int >= 0"),
                  (dict(max_staleness=1, placement="split"), "placement: must be one of"),
                  (dict(max_staleness=1, partial="restart"), "partial: must be one of"),
                  (dict(max_staleness=1, weight_sync="eventually"), "weight_sync: must be one of"),
                  (dict(max_staleness=1, placement="disaggregated"), "needs >= 1 sampler device"),
                  # a synchronous loop on half the devices each, with a transfer every step, is not what was asked
                  (dict(placement="disaggregated", sampler_devices=4), "set max_staleness >= 1")]:
    with pytest.raises(ValueError, match=msg):
      async_config.AsyncConfig(**kw)
