"""Shared fixtures: an in-process CLI runner and a private XDG environment."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n N`: N workers share the cores, torch and BLAS one thread each
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")


@dataclass
class CliResult:
    status: int
    stdout: str
    stderr: str


@pytest.fixture(autouse=True)
def private_xdg(tmp_path_factory, monkeypatch):
    """Keep a user's history, config and error logs out of the tests."""
    root = tmp_path_factory.mktemp("xdg")
    for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(root / var.lower()))
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture
def run_cli(monkeypatch):
    """Run ``precision-tool ARGS`` in-process; returns status, stdout and stderr."""
    from precision_tool.cli.main import main

    def run(*args, stdin: str = "") -> CliResult:
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setattr("sys.stderr", err)
        status = main([str(a) for a in args])
        return CliResult(int(status), out.getvalue(), err.getvalue())

    return run
