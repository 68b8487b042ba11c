"""A dump cut short while a command reads it (truncated, or rewritten in place by ``cp``): one line, exit 2.

Its tensors are read where they lie, through mappings of the file; a read past the new end of a mapped file is a
SIGBUS, which used to end the process with no message ("Bus error", status 135). Each case runs the CLI in a
subprocess of this checkout whose reader cuts the file once it has mapped its first pack (or opened it), then
goes on: `precision_tool.dump.mapping` must name the file, whatever the command made of the zeros.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.writes_helpers import build

ROOT = Path(__file__).resolve().parents[2]
SAYS = "cut short while it was read"

# argv: VICTIM WHEN LENGTH precision-tool ARGS...; WHEN "pack": once the victim's first pack is mapped, "open":
# once it is opened (HDF5 has read its superblock). LENGTH: bytes, "mid-pack" (the middle of that pack), "-1" (one byte less).
_CUTTER = """
import os, sys
from precision_tool.dump import reader
from precision_tool.cli.main import main

victim, when, length = sys.argv[1:4]
cut = []

def cut_once(dump, pack=None):
    if cut or not os.path.samefile(dump.path, victim):
        return
    cut.append(True)
    if length == "mid-pack":
        data = dump._file[pack]
        size = data.id.get_offset() + data.size // 2
    elif length == "-1":
        size = os.path.getsize(victim) - 1
    else:
        size = int(length)
    os.truncate(victim, size)

pack, opening = reader.Dump._pack, reader.Dump.__init__

def cutting_pack(self, step, number):
    result = pack(self, step, number)
    if when == "pack":
        cut_once(self, self._pack_path(step, number))
    return result

def cutting_open(self, path):
    opening(self, path)
    if when == "open":
        cut_once(self)

reader.Dump._pack, reader.Dump.__init__ = cutting_pack, cutting_open
sys.exit(main(sys.argv[4:]))
"""


@pytest.fixture
def pair(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


def _run_cut(victim, when, length, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-c", _CUTTER, str(victim), when, str(length), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def _assert_named(result, victim, lines=1):
    assert result.returncode == 2, f"exit {result.returncode}: {result.stderr}"  # -7 / 135: SIGBUS
    shown = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(shown) == lines and "Traceback" not in result.stderr, result.stderr
    assert f"{victim}: {SAYS}" in shown[0], shown[0]


@pytest.mark.parametrize("command, cut, when, length", [
    ("compare", "golden", "pack", "mid-pack"),
    ("compare", "target", "pack", "mid-pack"),
    ("compare", "target", "pack", "0"),
    ("check", "golden", "pack", "mid-pack"),
    ("check", "target", "open", "-1"),
    ("diagnose", "golden", "pack", "mid-pack"),
    ("diagnose", "target", "open", "half"),
], ids=lambda value: str(value))
def test_a_dump_cut_short_while_compared_is_one_line(pair, command, cut, when, length):
    victim = pair[0] if cut == "golden" else pair[1]
    if length == "half":
        length = os.path.getsize(victim) // 2
    _assert_named(_run_cut(victim, when, length, command, *pair), victim)


@pytest.mark.parametrize("length", ["100", "half", "-1"])
def test_a_dump_cut_short_while_inspected_is_one_line(pair, length):
    victim = pair[1]
    if length == "half":
        length = os.path.getsize(victim) // 2
    _assert_named(_run_cut(victim, "open", length, "inspect", victim), victim)


def test_no_output_is_written_from_a_dump_cut_short(pair, tmp_path):
    out = tmp_path / "out.csv"
    result = _run_cut(pair[0], "pack", "mid-pack", "compare", *pair, "--format", "csv", "-o", out)
    _assert_named(result, pair[0])
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["golden.h5", "target.h5"]


@pytest.mark.parametrize("cut, when, length", [("golden", "pack", "mid-pack"), ("target", "open", "half")])
def test_the_shells_vcs_over_a_dump_cut_short_is_one_line_a_command(pair, cut, when, length):
    victim = pair[0] if cut == "golden" else pair[1]
    if length == "half":
        length = os.path.getsize(victim) // 2
    result = _run_cut(victim, when, length, "shell", "--golden", pair[0], "--target", pair[1], "-c", "vcs; vcs -l 3")
    _assert_named(result, victim, lines=3)  # each command says so, then "2 shell commands failed"
    assert result.stderr.count(SAYS) == 2 and "2 shell commands failed" in result.stderr
