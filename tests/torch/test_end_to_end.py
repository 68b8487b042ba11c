"""Golden and simulated runs of real PyTorch training, compared, diagnosed; the examples run."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.compare import compare_dumps  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from .torch_helpers import make_mlp, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Two golden runs and a force_fp16 run of the MLP, 2 steps each, full dumps."""
    folder = tmp_path_factory.mktemp("e2e")
    for name in ("golden", "golden2"):
        with ptt.dump(folder / f"{name}.h5"):
            train(make_mlp(), steps=2)
    with ptt.simulate_npu("force_fp16"), ptt.dump(folder / "target.h5"):
        train(make_mlp(), steps=2)
    return folder


def _cosines(report) -> list[float]:
    return [row.cosine for row in report.rows if row.cosine is not None and not math.isnan(row.cosine)]


def test_golden_against_golden_is_identical(dumps):
    report = compare_dumps(dumps / "golden.h5", dumps / "golden2.h5")
    cosines = _cosines(report)
    assert cosines and min(cosines) == pytest.approx(1.0, abs=1e-6)
    assert not report.unmatched_golden and not report.unmatched_target


def test_golden_against_simulated_fp16_differs_somewhere(dumps):
    report = compare_dumps(dumps / "golden.h5", dumps / "target.h5")
    assert not report.unmatched_golden and not report.unmatched_target
    assert min(_cosines(report)) < 1.0
    fc1 = [row for row in report.rows if row.op == "MLP/fc1/aten.addmm_0" and row.tensor == "output_0"]
    assert fc1 and fc1[0].target_dtype == "float16" and fc1[0].golden_dtype == "float32"


def test_the_cli_compares_and_diagnoses_torch_dumps(dumps, run_cli):
    result = run_cli("compare", dumps / "golden.h5", dumps / "target.h5", "--all", "--format", "json")
    assert result.status == 0, result.stderr
    assert "MLP/fc1/aten.addmm_0" in result.stdout
    result = run_cli("diagnose", dumps / "golden.h5", dumps / "target.h5", "--format", "json")
    assert result.status == 0, result.stderr


@pytest.mark.parametrize("script", ["torch_cnn.py", "torch_transformer.py"])
def test_the_examples_write_a_golden_and_a_target_dump(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--out", str(tmp_path),
                           "--steps", "1", "--mode", "stats"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    with open_dump(tmp_path / "golden.h5") as golden, open_dump(tmp_path / "target.h5") as target:
        assert (golden.role, target.role) == ("golden", "target")
        assert target.metadata["device"] == "npu" and golden.metadata["model"] == script
        assert [op.name for op in golden.ops()] == [op.name for op in target.ops()]
        assert len(golden.steps()) == len(target.steps()) == 1
