"""The benchmarks' Tunix peer: its tests need .venv-tunix (launch/setup.sh builds it under CI=true)."""

import os

import pytest

from agentrl_jax.bench import common

CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture
def tunix():
  """The Tunix venv's python. Missing: the test is skipped with the way to build it, or under CI=true fails
  (CI must not pass by skipping the comparison with the peer)."""
  exe = common.tunix_python()
  if exe is None:
    reason = (f"{common.TUNIX_VENV} is missing: the Tunix side of the benchmark needs it "
              f"(python3.11 -m venv .venv-tunix && .venv-tunix/bin/pip install -r {common.TUNIX_REQUIREMENTS}; "
              "launch/setup.sh does it under CI=true or AGENTRL_TUNIX=1)")
    if CI:
      pytest.fail(reason + " (CI=true)")
    pytest.skip(reason)
  return exe
