"""Fixtures of the data tests."""

from __future__ import annotations

import pytest
import tfds_rows


@pytest.fixture
def source_file(tmp_path):
  """`source_file(schema, rows=None)` writes a parquet in that schema and returns its path."""

  def make(schema, rows=None, name=None):
    rows = tfds_rows.ROWS[schema]() if rows is None else rows
    return tfds_rows.write_parquet(tmp_path / f"{name or schema}.parquet", rows)

  return make
