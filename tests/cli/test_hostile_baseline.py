"""check --baseline with hostile baseline files: exit 2 and one line naming the file, never a hang or a traceback."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dump"))
from dumpfakes import write_synthetic  # noqa: E402


@pytest.fixture
def pair(tmp_path, run_cli):
    golden, target, baseline = tmp_path / "golden.h5", tmp_path / "target.h5", tmp_path / "baseline.json"
    write_synthetic(golden, steps=1, metadata={"role": "golden"})
    write_synthetic(target, steps=1)
    assert run_cli("baseline", golden, target, "-o", baseline).status == 0
    return golden, target, json.loads(baseline.read_text())


def _damaged(document: dict, change) -> str:
    document = json.loads(json.dumps(document))
    text = change(document)
    return text if isinstance(text, str) else json.dumps(document)


DAMAGES = {
    "nested too deeply": (lambda d: "[" * 100000 + "]" * 100000, "not a baseline file: JSON nested too deeply"),
    "a 5000-digit number": (lambda d: json.dumps(d).replace('"step": 0', '"step": ' + "9" * 5000, 1),
                            "not a baseline file: not JSON (Exceeds the limit (4300 digits) for integer string "
                            "conversion: value has 5000 digits)"),
    "a step of 1e400": (lambda d: json.dumps(d).replace('"step": 0', '"step": 1e400', 1),
                        "malformed baseline entry (cannot convert float infinity to integer)"),
    "golden as a list": (lambda d: d.__setitem__("golden", [1, 2]), "malformed baseline entry"),
    "golden as text": (lambda d: d.__setitem__("golden", "abc"), "malformed baseline entry"),
}


@pytest.mark.parametrize("damage", list(DAMAGES), ids=[d.replace(" ", "_") for d in DAMAGES])
def test_a_damaged_baseline_is_bad_input(pair, tmp_path, run_cli, damage):
    golden, target, document = pair
    change, says = DAMAGES[damage]
    path = tmp_path / "damaged.json"
    path.write_text(_damaged(document, change))
    result = run_cli("check", golden, target, "--baseline", path)
    assert result.status == 2, result.stderr
    assert result.stderr.strip() == f"precision-tool: error: {path}: {says}" or (
        says in result.stderr and len(result.stderr.strip().splitlines()) == 1), result.stderr


def test_a_baseline_that_is_a_fifo_does_not_block(pair, tmp_path, run_cli):
    golden, target, _ = pair
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    result = run_cli("check", golden, target, "--baseline", path)
    assert result.status == 2
    assert result.stderr.strip() == f"precision-tool: error: {path}: not a regular file"
