import csv
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from precision_tool.compare.memory import MemoryDump

RNG = np.random.default_rng(21)
X = RNG.standard_normal((8, 16)).astype(np.float32)


def build(path, noise=0.0, steps=(0, 1), names=("embed", "fc1", "fc2", "head"), role="target"):
    """A dump with one op per name and step; the target's error grows along the ops."""
    dump = MemoryDump(role=role)
    for step in steps:
        for i, name in enumerate(names):
            out = X * np.float32(i + 1)
            if noise:
                out = out + np.float32(noise * i) * RNG.standard_normal(X.shape).astype(np.float32)
            dump.add(f"{name}/Op", "Op", {"input_0": X, "output_0": out}, step=step,
                     dtypes={"output_0": "float16" if noise else "float32"})
    return dump.save(path)


@pytest.fixture
def dumps(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


def test_default_lists_flagged_ops_in_execution_order(run_cli, dumps):
    result = run_cli("compare", *dumps)
    assert result.status == 0, result.stderr
    flagged = [line.split()[3] for line in result.stdout.splitlines() if line.startswith("!")]
    assert flagged == ["fc1/Op", "fc2/Op", "head/Op", "fc1/Op", "fc2/Op", "head/Op"]
    assert "first flagged: step 0 #1 fc1/Op" in result.stdout
    assert "compared 16 tensors in 8 ops | flagged 6 ops at cosine <= 0.98" in result.stdout


def test_limit_and_threshold(run_cli, dumps):
    result = run_cli("compare", *dumps, "-c", "0.999", "-l", "2")
    assert "Flagged ops (first 2 of 6)" in result.stdout
    assert len([line for line in result.stdout.splitlines() if line.startswith("!")]) == 2


def test_all_lists_every_op(run_cli, dumps):
    result = run_cli("compare", *dumps, "--all")
    assert "All 8 compared ops" in result.stdout
    assert sum(" embed/Op " in line for line in result.stdout.splitlines()) == 4  # 2 steps x 2 tensors


def test_json_document(run_cli, dumps):
    result = run_cli("compare", *dumps, "--format", "json", "-l", "3")
    document = json.loads(result.stdout)
    assert document["summary"]["flagged_ops"] == 6 and document["summary"]["compared_tensors"] == 16
    assert document["summary"]["first_flagged"]["op"] == "fc1/Op"
    assert {r["op"] for r in document["rows"]} == {"fc1/Op", "fc2/Op", "head/Op"}
    assert [(r["step"], r["tensor"]) for r in document["rows"]][:2] == [(0, "input_0"), (0, "output_0")]
    row = document["rows"][1]
    assert row["target_dtype"] == "float16" and row["golden_dtype"] == "float32" and row["cosine"] < 0.98


def test_csv_to_a_file(run_cli, dumps, tmp_path):
    out = tmp_path / "rows.csv"
    result = run_cli("compare", *dumps, "--all", "--format", "csv", "-o", out)
    assert result.status == 0 and result.stdout == "" and f"wrote {out}" in result.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 16 and rows[0]["op"] == "embed/Op"


def test_csv_numbers_are_plain_numbers_equal_to_the_json(run_cli):
    samples = [Path(__file__).resolve().parents[2] / "sample_dumps" / name for name in ("golden.h5", "npu.h5")]
    table = list(csv.DictReader(io.StringIO(run_cli("compare", *samples, "--all", "--format", "csv").stdout)))
    document = json.loads(run_cli("compare", *samples, "--all", "--format", "json").stdout)["rows"]
    assert len(table) == len(document) > 100
    for row, expected in zip(table, document):
        for name in ("cosine", "max_abs_err", "mean_abs_err", "mean_rel_err", "accumulated_rel_err",
                     "kl_divergence", "rmse"):
            if expected[name] is not None:  # null in JSON: nan or inf in CSV
                assert float(row[name]) == expected[name], (row["op"], name, row[name])


def test_table_to_a_file_and_a_plot(run_cli, dumps, tmp_path):
    out, plot = tmp_path / "view.txt", tmp_path / "chart.svg"
    result = run_cli("compare", *dumps, "-o", out, "--plot", plot)
    assert result.status == 0
    assert "first flagged" in result.stdout  # the summary still reaches the terminal
    assert "Flagged ops" in out.read_text() and "\x1b[" not in out.read_text()
    ET.parse(plot)


def test_steps_and_ops_selection(run_cli, dumps):
    result = run_cli("compare", *dumps, "--all", "--steps", "1", "--ops", "fc*", "--format", "json")
    rows = json.loads(result.stdout)["rows"]
    assert {(r["step"], r["op"]) for r in rows} == {(1, "fc1/Op"), (1, "fc2/Op")}


def test_a_dump_against_itself(run_cli, dumps):
    result = run_cli("compare", dumps[1], dumps[1], "--all", "--format", "json", "--jobs", "2")
    document = json.loads(result.stdout)
    assert {r["cosine"] for r in document["rows"]} == {1.0}
    assert document["summary"]["flagged_ops"] == 0 and document["summary"]["first_flagged"] is None


def test_dumps_of_different_models(run_cli, tmp_path):
    golden = build(tmp_path / "a.h5", names=("conv1", "conv2"), role="golden")
    target = build(tmp_path / "b.h5", names=("lstm",))
    result = run_cli("compare", golden, target)
    assert result.status == 0
    assert "unmatched: 4 golden, 2 target" in result.stdout
    assert "no target op matched a golden op" in result.stdout


@pytest.mark.parametrize("args, message", [
    (("missing.h5",), "missing.h5: no such file"),
    (("--steps", "1-x"), "bad step selection"),
    (("--plot", "chart.pdf"), "use a .svg or .png file name"),
    (("-c", "2"), "-c"),
    (("--jobs", "0"), "--jobs"),
])
def test_usage_and_input_errors_exit_2(run_cli, dumps, tmp_path, args, message):
    if args[0] == "missing.h5":
        result = run_cli("compare", tmp_path / "missing.h5", dumps[1])
    else:
        result = run_cli("compare", *dumps, *args)
    assert result.status == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_corrupt_dump_is_one_line(run_cli, dumps, tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    result = run_cli("compare", dumps[0], bad)
    assert result.status == 2
    assert len(result.stderr.strip().splitlines()) == 1 and str(bad) in result.stderr


def test_golden_and_target_given_the_wrong_way_round_get_a_warning(run_cli, tmp_path):
    golden = build(tmp_path / "golden.h5", role="golden")
    target = build(tmp_path / "npu.h5", noise=1e-3)
    swapped = run_cli("compare", target, golden)
    assert swapped.status == 0 and swapped.stdout
    assert swapped.stderr == (f"precision-tool: warning: golden and target are swapped: {golden} is the golden run "
                              f"and {target} a target run; give the golden dump first\n")
    assert run_cli("compare", golden, target).stderr == ""
