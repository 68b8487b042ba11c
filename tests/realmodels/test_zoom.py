"""`precision-tool zoom -- python script.py` on a real model: the full-dump verdict from much smaller dumps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.realmodels.cases import collect, fault_cases

pytestmark = [pytest.mark.slow, pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case_id", ["vit-onepass_ln-fp16"])
def test_zoom_on_a_torch_script_matches_the_full_dump_verdict(case_id, run_cli, tmp_path, monkeypatch):
    case = next(c for c in fault_cases() if c.id == case_id)
    golden, target = collect(case, tmp_path / "full")
    full = run_cli("diagnose", golden, target, "--format", "json")
    expected = json.loads(full.stdout)["verdict"]

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "zoom"
    result = run_cli("zoom", "-o", out, "--", sys.executable, ROOT / "tests/realmodels/zoom_script.py", case_id)
    assert result.status == 0, result.stderr
    assert "Verdict: " + expected["class"] in " ".join(result.stdout.split())
    zoomed = run_cli("diagnose", out / "zoom-golden.h5", out / "zoom-target.h5", "--format", "json")
    verdict = json.loads(zoomed.stdout)["verdict"]
    assert (verdict["op"], verdict["class"]) == (expected["op"], expected["class"])
    names = ["stats-golden.h5", "stats-target.h5", "zoom-golden.h5", "zoom-target.h5"]
    assert sum((out / n).stat().st_size for n in names) < golden.stat().st_size + target.stat().st_size
