"""Fixtures of the SFT tests: configs loaded from configs/*.py as `--config=path:arg` would load them."""

from __future__ import annotations

import pytest

from agentrl_jax.testing import load_config


@pytest.fixture
def sft_config():
  return load_config
