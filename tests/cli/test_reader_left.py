"""A reader of stdout that leaves early (``| head``): no traceback, no message, and the command's own exit status.

Before, click turned the broken pipe (and rich its own, through SystemExit) into exit status 1, which says a
regression was found: ``compare ... | head`` failed a CI job, ``inspect | head`` too, and `main` raised
SystemExit instead of returning a status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.writes_helpers import build, digests

ROOT = Path(__file__).resolve().parents[2]


def _run_into_a_closed_pipe(*args) -> subprocess.CompletedProcess:
    """``python -m precision_tool ARGS`` whose stdout is a pipe nobody reads any more: every write fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    environment = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run([sys.executable, "-m", "precision_tool", *map(str, args)], env=environment,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


@pytest.fixture
def pair(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


@pytest.fixture
def same(tmp_path):
    """A run identical to golden's (a dump given twice is warned of)."""
    return build(tmp_path / "same.h5")


CASES = {  # args (golden, target filled in) -> exit status, the one line on stderr (a prefix of it)
    "compare table": (("compare", "{g}", "{t}", "--all"), 0, ""),
    "compare csv": (("compare", "{g}", "{t}", "--all", "--format", "csv"), 0, ""),
    "compare json": (("compare", "{g}", "{t}", "--format", "json"), 0, ""),
    "inspect": (("inspect", "{t}"), 0, ""),
    "diagnose": (("diagnose", "{g}", "{t}"), 0, ""),
    "check passes": (("check", "{g}", "{c}"), 0, ""),
    "check fails": (("check", "{g}", "{t}"), 1, "precision-tool: error: check failed: "),
    "check fails, json": (("check", "{g}", "{t}", "--format", "json"), 1, "precision-tool: error: check failed: "),
    "precheck passes": (("precheck", "{g}", "{g}"), 0, ""),
    "shell -c": (("shell", "{g}", "{t}", "-c", "vcs; ls"), 0, ""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_reader_that_leaves_keeps_the_commands_own_status(pair, same, name):
    args, status, says = CASES[name]
    golden, target = pair
    before = digests(golden, target)
    result = _run_into_a_closed_pipe(*(a.format(g=golden, t=target, c=same) for a in args))
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == (1 if says else 0), result.stderr
    assert all(line.startswith(says) for line in lines), result.stderr
    assert digests(golden, target) == before


def test_main_returns_a_status_when_the_reader_leaves(pair, monkeypatch):
    """`main` returns the status instead of exiting, also when stdout's reader is gone."""
    from precision_tool.cli.main import main

    class Gone:
        encoding = "utf-8"

        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def isatty(self):
            return False

        def fileno(self):
            raise OSError("no descriptor")

    monkeypatch.setattr("sys.stdout", Gone())
    assert main(["compare", *map(str, pair), "--all"]) == 0
