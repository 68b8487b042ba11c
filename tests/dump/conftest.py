"""Fixtures: a small synthetic dump."""

from __future__ import annotations

import pytest
from dumpfakes import write_synthetic


@pytest.fixture
def synthetic(tmp_path):
    path = tmp_path / "synthetic.h5"
    arrays = write_synthetic(path)
    return path, arrays
