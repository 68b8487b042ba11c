"""msprobe dumps as input (issue 16 item 2): hand-written msprobe-format dumps, read through `open_dump`."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from msprobe_fakes import GELU, X, gelu_run, spec, write_rank
from precision_tool.compare.comparator import compare_dumps
from precision_tool.dump.msprobe import MsprobeDump
from precision_tool.dump.reader import open_dump
from precision_tool.errors import InputError


def _records(path):
    with open_dump(path) as dump:
        return [(r.step, r.exec_index, r.name, r.type, r.direction, tuple(t.slot for t in r.tensors))
                for r in dump.ops()]


def test_api_names_become_forward_and_backward_records(tmp_path):
    root = gelu_run(tmp_path / "golden", steps=2)
    assert _records(root) == [
        (0, 0, "Functional.gelu.0.forward", "Functional.gelu", "forward", ("input_0", "output_0")),
        (0, 1, "Tensor.mul.0.forward", "Tensor.mul", "forward", ("input_0", "output_0")),
        (0, 2, "Functional.gelu.0.backward", "Functional.gelu", "backward", ("input_0", "output_0")),
        (1, 0, "Functional.gelu.0.forward", "Functional.gelu", "forward", ("input_0", "output_0")),
        (1, 1, "Tensor.mul.0.forward", "Tensor.mul", "forward", ("input_0", "output_0")),
        (1, 2, "Functional.gelu.0.backward", "Functional.gelu", "backward", ("input_0", "output_0")),
    ]
    with open_dump(root) as dump:
        assert isinstance(dump, MsprobeDump)
        assert (dump.mode, dump.role, dump.step_numbers(), dump.metadata["framework"]) == ("dump", "", [0, 1],
                                                                                           "msprobe")
        record = dump.op(1, "Functional.gelu.0.forward")
        assert record.attrs == {"msprobe_args": [{"tensor": 0, "dtype": "float32"}],
                                "msprobe_kwargs": {"approximate": {"type": "str", "value": "none"}}}
        np.testing.assert_array_equal(dump.tensor(1, 0, "output_0"), GELU)
        assert dump.tensor(1, 0, "output_0").dtype == np.float32
        chunks = list(dump.tensor_chunks(0, 0, "input_0", 3))
        assert [c.tolist() for c in chunks] == [[-1.0, 0.5, 2.0], [-0.25]]


@pytest.mark.parametrize("where", ["root", "step", "rank", "json"])
def test_every_path_shape_opens(tmp_path, where):
    root = gelu_run(tmp_path / "run", steps=1)
    path = {"root": root, "step": root / "step0", "rank": root / "step0" / "rank0",
            "json": root / "step0" / "rank0" / "dump.json"}[where]
    assert [r[:3] for r in _records(path)] == [(0, 0, "Functional.gelu.0.forward"), (0, 1, "Tensor.mul.0.forward"),
                                               (0, 2, "Functional.gelu.0.backward")]


def test_step_number_comes_from_the_step_directory(tmp_path):
    root = gelu_run(tmp_path / "run", steps=3)
    assert {r[0] for r in _records(root / "step2" / "rank0")} == {2}
    assert {r[0] for r in _records(root / "step2" / "rank0" / "dump.json")} == {2}


def test_compare_pairs_records_by_name_with_exact_metrics(tmp_path):
    golden, target = gelu_run(tmp_path / "g"), gelu_run(tmp_path / "t", scale=1.25)
    report = compare_dumps(golden, target)
    rows = {(r.op, r.direction, r.tensor): r for r in report.rows}
    assert len(rows) == 6 and not report.unmatched_golden and not report.unmatched_target
    assert rows[("Functional.gelu.0.forward", "forward", "input_0")].metrics.max_abs_err == 0.0
    out = rows[("Functional.gelu.0.forward", "forward", "output_0")].metrics
    assert out.cosine == pytest.approx(1.0, abs=1e-12)
    assert out.rel_euclidean == pytest.approx(0.25, rel=1e-6)
    grad = rows[("Functional.gelu.0.backward", "backward", "output_0")].metrics
    assert (grad.max_abs_err, grad.max_rel_err) == (0.25, 0.25)


def test_statistics_only_dumps_compare_by_statistics(tmp_path):
    golden, target = gelu_run(tmp_path / "g", task="statistics"), gelu_run(tmp_path / "t", 1.25, task="statistics")
    with open_dump(golden) as dump:
        assert dump.mode == "stats"
        stats = dump.op(0, "Functional.gelu.0.forward").tensor("output_0").stats
        values = GELU.astype(np.float64)
        norm, mean = float(np.linalg.norm(values)), float(values.mean())
        assert (stats.count, stats.min, stats.max, stats.mean, stats.norm) == (4, float(values.min()),
                                                                                float(values.max()), mean, norm)
        assert stats.std == math.sqrt(norm * norm / 4 - mean * mean)
        assert not dump.op(0, "Functional.gelu.0.forward").tensor("output_0").has_data
    report = compare_dumps(golden, target)
    assert report.stats_only
    row = next(r for r in report.rows if r.op == "Functional.gelu.0.forward" and r.tensor == "output_0")
    scaled = float(np.linalg.norm((GELU * np.float32(1.25)).astype(np.float64)))
    assert row.metrics is None and row.stats.rel_norm_diff == abs(scaled - norm) / norm
    assert report.summary(0.98).first_flagged.name == "Functional.gelu.0.forward"


def test_module_records_parameters_and_parameter_gradients(tmp_path):
    w, b, y = np.eye(2, dtype=np.float32), np.zeros(2, np.float32), X.copy()
    data = {
        "Functional.linear.0.forward": {"input_args": [spec(X), spec(w), spec(b)], "input_kwargs": {},
                                        "output": [spec(y)]},
        "Module.fc1.Linear.forward.0": {"input_args": [spec(X)], "input_kwargs": {}, "output": [spec(y)],
                                        "parameters": {"weight": spec(w), "bias": spec(b)}},
        "Module.fc1.Linear.parameters_grad.0": {"bias": [spec(b)], "weight": [spec(w)]},
        "Module.fc1.Linear.backward.0": {"input": [spec(y)], "output": [None]},
        "Functional.linear.0.backward": {"input": [spec(y)], "output": [None, spec(w), spec(b)]},
        "Tensor.add_.0.forward": {"input_args": [spec(w), spec(w)],
                                  "input_kwargs": {"alpha": {"type": "float", "value": -0.1}}, "output": [spec(w)]},
    }
    construct = {"Functional.linear.0.forward": "Module.fc1.Linear.forward.0", "optimizer": None,
                 "Tensor.add_.0.forward": "optimizer"}
    folder = write_rank(tmp_path / "run" / "step0" / "rank0", data, task="statistics", construct=construct)
    with open_dump(folder) as dump:
        records = {r.name: r for r in dump.ops()}
    module = records["Module.fc1.Linear.forward.0"]
    assert (module.type, module.is_module, module.direction) == ("module.Linear", True, "forward")
    assert [t.slot for t in module.tensors] == ["input_0", "input_1", "input_2", "output_0"]  # x, weight, bias
    grads = records["Module.fc1.Linear.parameters_grad.0"]
    assert (grads.type, grads.direction, [t.slot for t in grads.tensors]) == (
        "parameters_grad", "backward", ["output_0", "output_1"])
    backward = records["Functional.linear.0.backward"]
    assert [t.slot for t in backward.tensors] == ["input_0", "output_1", "output_2"]  # no gradient for slot 0
    assert [t.slot for t in records["Module.fc1.Linear.backward.0"].tensors] == ["input_0"]
    assert records["Tensor.add_.0.forward"].direction == "optimizer"
    assert records["Tensor.add_.0.forward"].attrs["msprobe_kwargs"] == {"alpha": {"type": "float", "value": -0.1}}


def test_bare_nan_and_infinity_in_dump_json(tmp_path):
    inf = spec(None, shape=[2, 2], Max="@inf", Min="@-inf", Mean="@nan", Norm="@inf")
    nan = spec(None, shape=[2, 2], Max="@nan", Min="@nan", Mean="@nan", Norm="@nan")
    text = json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": {
        "Functional.linear.0.forward": {"input_args": [spec(X)], "input_kwargs": {}, "output": [inf]},
        "Functional.relu.0.forward": {"input_args": [inf], "input_kwargs": {}, "output": [nan]},
    }})
    for placeholder, bare in (('"@inf"', "Infinity"), ('"@-inf"', "-Infinity"), ('"@nan"', "NaN")):
        text = text.replace(placeholder, bare)
    assert '"Max": Infinity, "Min": -Infinity, "Mean": NaN' in text and '"Norm": NaN' in text
    folder = write_rank(tmp_path / "ovf" / "step0" / "rank0", {}, text=text)
    with open_dump(folder) as dump:
        linear, relu = dump.ops()
        summary = dump.summary()
    assert (linear.overflow, linear.inherited_nonfinite) == (True, False)
    assert (linear.outputs[0].stats.inf, linear.outputs[0].stats.nan) == (1, 0)
    assert math.isnan(linear.outputs[0].stats.max)
    assert (relu.outputs[0].stats.inf, relu.outputs[0].stats.nan) == (0, 1)
    assert (relu.overflow, relu.inherited_nonfinite) == (True, True)
    assert (summary.overflow_ops, summary.overflow_steps, summary.first_overflows[0].name) == (
        2, [0], "Functional.linear.0.forward")


def test_tensor_dumps_count_nan_and_inf_from_the_values(tmp_path):
    values = np.array([1.0, np.nan, np.inf, np.nan], np.float32)
    text = json.dumps({"task": "tensor", "data": {"Torch.exp.0.forward": {
        "input_args": [spec(np.ones(4, np.float32), "in.npy")], "input_kwargs": {},
        "output": [spec(None, "out.npy", shape=[4], Max=math.nan, Min=math.nan, Mean=math.nan, Norm=math.nan)]}}})
    folder = write_rank(tmp_path / "t" / "step0" / "rank0", {}, {"in.npy": np.ones(4, np.float32), "out.npy": values},
                        text=text)
    with open_dump(folder) as dump:
        stats = dump.ops()[0].outputs[0].stats
    assert (stats.nan, stats.inf, stats.min, stats.max) == (2, 1, 1.0, 1.0)


def test_a_directory_that_is_no_dump_is_refused(tmp_path):
    with pytest.raises(InputError, match="is a directory, neither"):
        open_dump(tmp_path)


def test_several_ranks_are_refused_with_their_names(tmp_path):
    gelu_run(tmp_path / "run", task="statistics")
    (tmp_path / "run" / "step0" / "rank0").rename(tmp_path / "run" / "step0" / "rank1")
    gelu_run(tmp_path / "run", task="statistics")
    with pytest.raises(InputError) as info:
        open_dump(tmp_path / "run")
    assert "holds 2 ranks (rank0, rank1); give one rank's directory" in str(info.value)
    assert len(_records(tmp_path / "run" / "step0" / "rank1")) == 3


# -- bad input: one line naming the file, exit 2 ---------------------------------------------------------


def _error(run_cli, *args) -> str:
    result = run_cli(*args)
    assert result.status == 2, result
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_malformed_json(run_cli, tmp_path):
    golden = gelu_run(tmp_path / "g")
    folder = write_rank(tmp_path / "bad" / "step0" / "rank0", {}, text='{"data": {"x": [1, 2,}}')
    line = _error(run_cli, "compare", golden, tmp_path / "bad")
    assert line == f"precision-tool: error: {folder / 'dump.json'}: malformed JSON: Expecting value at line 1 column 22"


def test_missing_dump_json(run_cli, tmp_path):
    golden = gelu_run(tmp_path / "g")
    (tmp_path / "empty" / "step0" / "rank0").mkdir(parents=True)
    line = _error(run_cli, "diagnose", golden, tmp_path / "empty")
    assert line.endswith("an msprobe dump without data: no dump.json in its step directories")


def test_missing_tensor_file(run_cli, tmp_path):
    golden, target = gelu_run(tmp_path / "g"), gelu_run(tmp_path / "t")
    missing = target / "step0" / "rank0" / "dump_tensor_data" / "Tensor.mul.0.forward.output.0.npy"
    missing.unlink()
    line = _error(run_cli, "check", golden, target)
    assert line == (f"precision-tool: error: {missing}: no such file (entry 'Tensor.mul.0.forward' of "
                    f"{target / 'step0' / 'rank0' / 'dump.json'} refers to it)")


def test_tensor_of_the_wrong_shape(run_cli, tmp_path):
    golden, target = gelu_run(tmp_path / "g"), gelu_run(tmp_path / "t")
    wrong = target / "step0" / "rank0" / "dump_tensor_data" / "Tensor.mul.0.forward.output.0.npy"
    np.save(wrong, np.zeros((4,), np.float32))
    before = wrong.read_bytes()
    line = _error(run_cli, "compare", golden, target)
    assert line == f"precision-tool: error: {wrong}: holds a tensor of shape (4,); dump.json says (2, 2)"
    assert wrong.read_bytes() == before


def test_shape_that_is_not_a_list(run_cli, tmp_path):
    folder = write_rank(tmp_path / "t" / "step0" / "rank0", {"Torch.relu.0.forward": {
        "input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": "2x2"}], "output": []}},
        task="statistics")
    line = _error(run_cli, "inspect", folder)
    assert line == (f"precision-tool: error: {folder / 'dump.json'}: entry 'Torch.relu.0.forward' input_0: "
                    "shape '2x2' is not a list of whole numbers")


def test_pt_files_without_torch(run_cli, tmp_path, monkeypatch):
    folder = write_rank(tmp_path / "t" / "step0" / "rank0", {"Torch.relu.0.forward": {
        "input_args": [spec(X, "Torch.relu.0.forward.input.0.pt")], "output": []}})
    (folder / "dump_tensor_data").mkdir()
    (folder / "dump_tensor_data" / "Torch.relu.0.forward.input.0.pt").write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)
    line = _error(run_cli, "inspect", folder)
    assert line == (f"precision-tool: error: {folder / 'dump.json'}: refers to PyTorch .pt tensor files: reading "
                    "them needs PyTorch (pip install 'precision-tool[torch]')")


def test_md5_dumps_are_refused(run_cli, tmp_path):
    folder = write_rank(tmp_path / "t" / "step0" / "rank0", {},
                        text=json.dumps({"task": "statistics", "summary_mode": "md5", "data": {}}))
    assert _error(run_cli, "inspect", folder).endswith("an msprobe md5 dump holds checksums, neither tensors nor "
                                                       "statistics: precision-tool cannot compare it")


# -- every command reads them ----------------------------------------------------------------------------


def test_compare_check_diagnose_inspect_and_shell(run_cli, tmp_path):
    golden, target = gelu_run(tmp_path / "g", steps=2), gelu_run(tmp_path / "t", scale=0.5, steps=2)
    compare = run_cli("compare", golden, target, "--format", "json")
    assert compare.status == 0, compare.stderr
    document = json.loads(compare.stdout)
    assert document["summary"]["compared_tensors"] == 12
    check = run_cli("check", golden, target, "--min-cosine", "0.98")
    assert check.status in (0, 1), check.stderr
    diagnose = run_cli("diagnose", golden, target)
    assert diagnose.status == 0, diagnose.stderr
    inspect = run_cli("inspect", golden / "step1" / "rank0", "--format", "json")
    assert inspect.status == 0 and json.loads(inspect.stdout)["ops"] == 3
    table = run_cli("inspect", golden)
    words = " ".join(table.stdout.split())  # a long temporary path wraps the header at 120 columns
    assert table.status == 0 and words.startswith(f"{golden} msprobe dump (pytorch, tensor, mix, rank0), complete, ")
    shell = run_cli("shell", "--golden", golden, "--target", target, "-c", "vcs")
    assert shell.status == 0, shell.stderr
    refused = run_cli("shell", golden, target, "-c", "vcs")
    assert refused.status == 2 and "names no role" in refused.stderr


def test_inputs_are_never_modified(run_cli, tmp_path):
    golden, target = gelu_run(tmp_path / "g"), gelu_run(tmp_path / "t", scale=1.25)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    for command in ("compare", "diagnose"):
        run_cli(command, golden, target)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == before
