"""Fixtures: a small synthetic dump."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dumpfakes, however pytest was started
from dumpfakes import write_synthetic  # noqa: E402


@pytest.fixture
def synthetic(tmp_path):
    path = tmp_path / "synthetic.h5"
    arrays = write_synthetic(path)
    return path, arrays
