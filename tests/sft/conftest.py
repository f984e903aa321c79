"""Fixtures of the SFT tests: configs loaded from configs/*.py as `--config=path:arg` would load them."""

from __future__ import annotations

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(name: str, arg: str | None = None, **overrides):
  """`configs/<name>.py:get_config(arg)` with dotted-key overrides (e.g. `**{"sft.num_epochs": 2}`)."""
  spec = importlib.util.spec_from_file_location(f"config_{name}", os.path.join(REPO, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(arg)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value  # a locked ConfigDict still accepts updates of existing fields
  return config


@pytest.fixture
def sft_config():
  return load_config
