"""Fixtures for the code tool tests."""

from __future__ import annotations

import pytest

from tests.tools.sandbox_testing import local_pool


@pytest.fixture(scope="session")
def pool():
  """The local executor at concurrency 2 (the CI machine has 2 cores)."""
  executor = local_pool(2)
  yield executor
  executor.close()
