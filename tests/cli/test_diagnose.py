"""`precision-tool diagnose`: the verdict of the shell's `ac`, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precision_tool.cli.main import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diagnose_dumps")
    runs = {"golden": ["--device", "golden"], "golden-again": ["--device", "golden"],
            "target": ["--device", "npu", "--loss-scale", "fixed:1e9"]}
    for name, options in runs.items():
        assert main(["collect", "mlp", "-o", str(root / f"{name}.h5"), "--steps", "2", *options]) == 0
    return {name: root / f"{name}.h5" for name in runs}


def test_json_has_the_verdict_object(run_cli, runs):
    result = run_cli("diagnose", runs["golden"], runs["target"], "--format", "json")
    assert result.status == 0, result.stderr
    document = json.loads(result.stdout)
    assert {"op", "class", "step", "direction", "type", "evidence", "action"} <= set(document["verdict"])
    assert document["verdict"]["class"] in ("overflow", "fusion", "precision_loss", "kernel_bug", "none")
    assert set(document) >= {"verdict", "overflow", "fusion", "attributions", "notes"}
    assert document["overflow"]["total"] > 0 and document["fusion"]["passes"]


def test_identical_runs_have_class_none(run_cli, runs):
    result = run_cli("diagnose", runs["golden"], runs["golden-again"], "--format", "json")
    assert result.status == 0, result.stderr
    verdict = json.loads(result.stdout)["verdict"]
    assert verdict["class"] == "none" and verdict["op"] is None


def test_table_shows_every_section_and_the_verdict(run_cli, runs):
    result = run_cli("diagnose", runs["golden"], runs["target"])
    assert result.status == 0, result.stderr
    for heading in ("Overflow", "Fusion", "Comparison", "Notes", "root cause", "Verdict: "):
        assert heading in result.stdout


def test_same_verdict_as_ac(run_cli, runs):
    batch = json.loads(run_cli("diagnose", runs["golden"], runs["target"], "--format", "json").stdout)
    shell = run_cli("shell", "--golden", runs["golden"], "--target", runs["target"], "-c", "ac")
    assert shell.status == 0, shell.stderr
    assert f"Verdict: {batch['verdict']['class']}" in shell.stdout


def test_missing_file_is_exit_2_in_one_line(run_cli, runs, tmp_path):
    result = run_cli("diagnose", runs["golden"], tmp_path / "missing.h5")
    assert result.status == 2 and result.stderr.count("\n") == 1 and "missing.h5" in result.stderr


def test_unknown_format_is_a_usage_error(run_cli, runs):
    result = run_cli("diagnose", runs["golden"], runs["target"], "--format", "xml")
    assert result.status == 2 and "'xml' is not one of 'table', 'json'" in result.stderr


def test_diagnose_is_acs_twin_with_c_l_and_all(run_cli):
    samples = [Path(__file__).resolve().parents[2] / "sample_dumps" / n for n in ("golden.h5", "npu.h5")]
    batch = run_cli("diagnose", *samples, "-c", "-l", "1")
    shell = run_cli("shell", *samples, "-c", "ac -c -l 1")
    assert batch.status == shell.status == 0, batch.stderr + shell.stderr
    for out in (batch.stdout, shell.stdout):
        text = " ".join(out.split())
        assert text.startswith("┏━ root cause")  # the verdict first
        assert "showing 1 of 2, in execution order" in text and "Flagged ops (first 10 of 13)" in text
    assert " ".join(batch.stdout.split()) == " ".join(shell.stdout.split())


def test_l_0_shows_every_overflow_entry(run_cli):
    """-l 0 says "0: all"; it showed none ("showing 0 of 2"), in the shell's ac too."""
    samples = [Path(__file__).resolve().parents[2] / "sample_dumps" / n for n in ("golden.h5", "npu.h5")]
    batch = run_cli("diagnose", *samples, "-l", "0")
    shell = run_cli("shell", *samples, "-c", "ac -l 0")
    for result in (batch, shell):
        assert result.status == 0, result.stderr
        assert "showing 2 of 2, in execution order" in " ".join(result.stdout.split())
