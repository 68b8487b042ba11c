"""The norm check of marked dumps (`precision_tool.dump.integrity`): what the writer marks, what compare refuses
(exit 2, one line naming the file and the tensor's bytes), and what it keeps accepting: dumps without the mark
(written before it), values rounded to their dtype when stored, NaN/inf rows, dumps the collector writes."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest

from dumpfakes import op, write_synthetic
from precision_tool.compare.comparator import CompareOptions, compare_dumps
from precision_tool.compare.memory import MemoryDump
from precision_tool.dump import layout
from precision_tool.dump.integrity import check_dump, norm_agrees
from precision_tool.dump.reader import open_dump
from precision_tool.dump.records import StepRecord, TensorStats
from precision_tool.dump.writer import DumpWriter
from precision_tool.errors import InputError

RNG = np.random.default_rng(3)
X = RNG.standard_normal((4, 8)).astype(np.float32)
MEAN = RNG.standard_normal(8).astype(np.float32)  # a BatchNorm's running mean
UPDATED = (0.9 * MEAN + 0.1 * X.mean(axis=0)).astype(np.float32)  # ... after the kernel updated it in place
SPECIAL = np.array([1.0, np.nan, np.inf, -2.0, 0.5, 3.0, -1.0, 2.0], np.float32)
F32 = {"input_0": "float32", "input_1": "float32", "output_0": "float32"}


def _both(run_cli, monkeypatch, *args):
    """status and stderr of a command streaming and in memory, asserted equal."""
    results = []
    for stream in ("1", "0"):
        monkeypatch.setenv("PRECISION_TOOL_STREAM", stream)
        result = run_cli(*args)
        results.append((result.status, result.stderr))
    assert results[0] == results[1]
    return results[0]


def _batch_norm(path, stored_mean: np.ndarray, marked: bool = True, special: np.ndarray = SPECIAL) -> str:
    """One step: a batch_norm whose running mean (input_1) has the statistics of MEAN and the values
    ``stored_mean``, and a relu of ``special``, whose row 4 and 5 hold NaN/inf and finite values of one size."""
    with DumpWriter(path, {"role": "target", "mode": "dump"}, stats_match_data=marked) as writer:
        writer.begin_step(0)
        arrays = {"input_0": X, "input_1": MEAN, "output_0": X * 2}
        writer.write_op(op(0, 0, "bn", arrays, F32, type="aten.native_batch_norm"),
                        {**arrays, "input_1": stored_mean})
        relu = {"input_0": special, "output_0": np.maximum(np.nan_to_num(special, posinf=9.0), 0).astype(np.float32)}
        writer.write_op(op(0, 1, "relu", relu, F32, type="aten.relu"), relu)
        writer.end_step(StepRecord(0, 1.0, 1.0, False))
    return str(path)


def test_the_writer_marks_its_dumps_unless_told_not_to(tmp_path):
    write_synthetic(tmp_path / "marked.h5", steps=1, metadata={layout.STATS_MATCH_DATA: False})  # not the caller's
    write_synthetic(tmp_path / "old.h5", steps=1, stats_match_data=False, metadata={layout.STATS_MATCH_DATA: True})
    with h5py.File(tmp_path / "marked.h5") as marked, h5py.File(tmp_path / "old.h5") as old:
        assert marked.attrs[layout.STATS_MATCH_DATA] is np.True_ and layout.STATS_MATCH_DATA not in old.attrs
    with open_dump(tmp_path / "marked.h5") as marked, open_dump(tmp_path / "old.h5") as old:
        assert (marked.stats_match_data, old.stats_match_data) == (True, False)
        assert check_dump(marked) == 6 and check_dump(old) == 6  # x, w, y, z, labels, z: every tensor with data


def test_a_mark_that_is_not_true_or_false_is_bad_input(tmp_path, run_cli):
    path = tmp_path / "d.h5"
    write_synthetic(path, steps=1)
    with h5py.File(path, "r+") as f:
        f.attrs[layout.STATS_MATCH_DATA] = "yes"
    result = run_cli("inspect", path)
    assert (result.status, result.stderr) == (2, f"precision-tool: error: {path}: / attribute stats_match_data: "
                                                 "'yes' is not true or false\n")


def test_values_stored_after_their_statistics_are_refused_only_in_a_marked_dump(tmp_path, run_cli, monkeypatch):
    """The torch capture before 9d19ded: a running mean stored after the kernel updated it, its statistics taken
    before. Without the mark (every such dump) it is compared as before; with it, it is a damaged dump."""
    golden = _batch_norm(tmp_path / "golden.h5", MEAN)
    old = _batch_norm(tmp_path / "old.h5", UPDATED, marked=False)
    new = _batch_norm(tmp_path / "new.h5", UPDATED)
    status, stderr = _both(run_cli, monkeypatch, "compare", golden, old, "--all")
    assert (status, stderr) == (0, "")
    status, stderr = _both(run_cli, monkeypatch, "compare", golden, new, "--all")
    found, says = float(np.linalg.norm(UPDATED.astype(np.float64))), float(np.linalg.norm(MEAN.astype(np.float64)))
    assert (status, stderr) == (2, f"precision-tool: error: {new}: /steps/000000/packs/000000 at byte 128 (row 1 of "
                                   f"/steps/000000/index): the values of step 0 op bn (forward) input_1 have L2 norm "
                                   f"{found:.6g} where the index row says {says:.6g}: a damaged pack or index row\n")
    status, stderr = _both(run_cli, monkeypatch, "compare", new, golden, "--all")  # golden's side as well
    assert status == 2 and stderr.startswith(f"precision-tool: error: {new}: /steps/000000/packs/000000 at byte 128")


@pytest.mark.parametrize("marked", [True, False])
def test_rows_counting_nan_and_inf_are_checked_by_their_counts(tmp_path, run_cli, monkeypatch, marked):
    """Row 3 holds a NaN and an inf, row 4 the same number of finite values. Undamaged, both sides pass; a finite
    row pointed at the NaN's bytes (scored one by one, read again), or the NaN row at finite bytes (scored in the
    batch when golden's values are finite), is refused (a marked dump) or scored."""
    golden = _batch_norm(tmp_path / "golden.h5", MEAN)
    finite = _batch_norm(tmp_path / "finite.h5", MEAN, special=np.nan_to_num(SPECIAL, posinf=9.0))
    assert _both(run_cli, monkeypatch, "compare", golden, _batch_norm(tmp_path / "same.h5", MEAN), "--all")[0] == 0
    finite_norm = float(np.linalg.norm(np.maximum(np.nan_to_num(SPECIAL, posinf=9.0), 0)))
    special_norm = float(np.linalg.norm(SPECIAL[np.isfinite(SPECIAL)]))
    for row, other, golden, says in (
            (4, 3, golden, f"have 1 NaN, 1 inf and an L2 norm of the rest of {special_norm:.6g} where the index row "
                           f"says 0 NaN, 0 inf and {finite_norm:.6g}"),
            (3, 4, golden, f"have 0 NaN, 0 inf and an L2 norm of the rest of {finite_norm:.6g} where the index row "
                           f"says 1 NaN, 1 inf and {special_norm:.6g}"),
            (3, 4, finite, f"have L2 norm {finite_norm:.6g} where the index row says 1 NaN and 1 inf")):
        path = _batch_norm(tmp_path / f"row{row}-{golden == finite}.h5", MEAN, marked=marked)
        with h5py.File(path, "r+") as f:
            rows = f["steps/000000/index"][()]
            rows["offset"][row] = rows["offset"][other]
            f["steps/000000/index"][...] = rows
        status, stderr = _both(run_cli, monkeypatch, "compare", golden, path, "--all")
        offset = int(rows["offset"][other])
        expected = (f"precision-tool: error: {path}: /steps/000000/packs/000000 at byte {offset} (row {row} of "
                    f"/steps/000000/index): the values of step 0 op relu (forward) {'input_0' if row == 3 else 'output_0'} "
                    f"{says}: a damaged pack or index row\n")
        assert (status, stderr) == ((2, expected) if marked else (0, ""))


def test_a_damaged_dataset_is_refused_too(tmp_path, run_cli, monkeypatch):
    """Tensors with a dataset of their own (pack_limit -1): the same check on the sums score_pair takes."""
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    write_synthetic(golden, steps=2, pack_limit=-1)
    write_synthetic(target, steps=2, pack_limit=-1)
    where = "/steps/000001/ops/000000__block|MatMul/input_1"
    with h5py.File(target, "r+") as f:
        f[where][...] = f[where][()][::-1] * 2  # the weight, twice over
        norm = float(np.linalg.norm(f[where][()].astype(np.float64)))
        says = float(f["steps/000001/index"]["norm"][1])
    status, stderr = _both(run_cli, monkeypatch, "compare", golden, target, "--all")
    assert (status, stderr) == (2, f"precision-tool: error: {target}: {where} (row 1 of /steps/000001/index): the "
                                   f"values of step 1 op block/MatMul (forward) input_1 have L2 norm {norm:.6g} "
                                   f"where the index row says {says:.6g}: a damaged dataset or index row\n")


def test_an_unmarked_dump_is_never_refused_by_the_check(tmp_path, run_cli, monkeypatch):
    """The hostile offsets of test_hostile_input, in a dump written without the mark: scored as before."""
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    write_synthetic(golden, steps=2, stats_match_data=False)
    write_synthetic(target, steps=2, stats_match_data=False)
    with h5py.File(target, "r+") as f:
        rows = f["steps/000001/index"][()]
        rows["offset"] = 0
        f["steps/000001/index"][...] = rows
    status, stderr = _both(run_cli, monkeypatch, "compare", golden, target, "--all")
    assert (status, stderr) == (0, "")


def test_a_window_names_the_steps_own_row(tmp_path, monkeypatch):
    """Streaming reads a step a few ops at a time; the tensor is named by its row in the step's index."""
    from precision_tool.compare.digest import DigestSink
    from precision_tool.compare.stream import stream_compare

    golden = _batch_norm(tmp_path / "golden.h5", MEAN)
    target = _batch_norm(tmp_path / "target.h5", MEAN)
    with h5py.File(target, "r+") as f:
        rows = f["steps/000000/index"][()]
        rows["offset"][4] = rows["offset"][3]
        f["steps/000000/index"][...] = rows
    monkeypatch.setattr("precision_tool.compare.stream.WINDOW_OPS", 1)  # relu alone in its window: its row 1
    messages = []
    with open_dump(golden) as g, open_dump(target) as t:
        for run in (lambda: stream_compare(g, t, CompareOptions(), DigestSink(0.99, 0)), lambda: compare_dumps(g, t)):
            with pytest.raises(InputError) as caught:
                run()
            messages.append(str(caught.value))
    assert messages[0] == messages[1] and "(row 4 of /steps/000000/index)" in messages[0]


def test_values_rounded_when_stored_pass(tmp_path, run_cli):
    """A writer given values not exact in their dtype takes their statistics before storing them rounded
    (float16), truncated (bfloat16) or flushed to zero (below float16's subnormals): within the tolerances."""
    dump = MemoryDump(role="golden")
    values = (RNG.standard_normal(4096) * 3).astype(np.float32)
    tiny = np.full(64, 1e-9, np.float32)  # float16: 0
    dump.add("half", "Cast", {"input_0": values, "output_0": values}, dtypes={"output_0": "float16"})
    dump.add("brain", "Cast", {"input_0": values, "output_0": values}, dtypes={"output_0": "bfloat16"})
    dump.add("tiny", "Cast", {"input_0": tiny, "output_0": np.concatenate([tiny, [1e-3]]).astype(np.float32)},
             dtypes={"input_0": "float16", "output_0": "float16"})
    dump.add("wide", "Cast", {"input_0": values.astype(np.float64) / 3, "output_0": np.arange(5, dtype=np.int64) ** 20,
                              "output_1": values > 0}, dtypes={"input_0": "float32"})
    path = dump.save(tmp_path / "rounded.h5")
    with open_dump(path) as opened:
        assert opened.stats_match_data and check_dump(opened) == 9
        half = opened.op(0, "half")
        stored = float(np.linalg.norm(opened.tensor(0, half.exec_index, "output_0").astype(np.float64)))
        assert stored != half.tensors[1].stats.norm  # the rounding moved the norm, and the check let it
    assert run_cli("compare", path, path, "--all").status == 0


def test_the_collectors_dumps_are_marked_and_agree(tmp_path, run_cli):
    for mode in ("dump", "overflow"):
        path = tmp_path / f"{mode}.h5"
        assert run_cli("collect", "mlp", "--steps", "2", "--mode", mode, "-o", path).status == 0
        with open_dump(path) as dump:
            assert dump.stats_match_data and (check_dump(dump) > 0 or mode == "overflow")


def test_norm_agrees_exactly_within_the_tolerances():
    def stats(norm, count=4, nan=0, inf=0):
        return TensorStats(count, -1.0, 1.0, 0.0, 1.0, norm, nan, inf)

    assert norm_agrees(stats(1.0), "float32", 1.0 + 1.9e-4) and not norm_agrees(stats(1.0), "float32", 1.0 + 2.1e-4)
    assert norm_agrees(stats(1.0), "float16", 1.002) and not norm_agrees(stats(1.0), "float16", 1.0025)
    assert norm_agrees(stats(1.0), "bfloat16", 0.97) and not norm_agrees(stats(1.0), "bfloat16", 0.96)
    assert norm_agrees(stats(0.0, count=100), "float16", (6e-8 * 10) ** 2)  # values flushed to 0 when stored
    assert norm_agrees(stats(5.0), "int64", 25.0) and not norm_agrees(stats(5.0), "int64", 26.0)
    assert norm_agrees(stats(math.nan, count=0), "float32", 123.0)  # statistics not taken
    assert not norm_agrees(stats(1.0, nan=1), "float32", 1.0)  # finite values where the row counts a NaN
    assert not any(norm_agrees(stats(1.0), "float32", s) for s in (math.nan, math.inf, -1.0))


def test_values_read_one_by_one_from_a_marked_dump_are_checked_too(tmp_path, run_cli):
    """`Dump.tensor`, what the shell, zoom and the analysis read: a marked dump's misread tensor is refused as
    compare refuses it (the shell's `pt`: exit 2, one line); an unmarked dump's is read as stored."""
    path = _batch_norm(tmp_path / "new.h5", UPDATED)
    found, says = float(np.linalg.norm(UPDATED.astype(np.float64))), float(np.linalg.norm(MEAN.astype(np.float64)))
    line = (f"{path}: /steps/000000/packs/000000 at byte 128 (row 1 of /steps/000000/index): the values of step 0 "
            f"op bn (forward) input_1 have L2 norm {found:.6g} where the index row says {says:.6g}: a damaged pack "
            f"or index row")
    with open_dump(path) as dump:
        np.testing.assert_array_equal(dump.tensor(0, 0, "input_0"), X)  # the others read as ever
        with pytest.raises(InputError) as raised:
            dump.tensor(0, 0, "input_1")
        assert str(raised.value) == line
    result = run_cli("shell", "--target", path, "-c", "pt target:bn:input_1@0")
    assert (result.status, result.stderr.splitlines()) == (2, [f"error: {line}",
                                                               "precision-tool: error: 1 shell command failed"])
    with open_dump(_batch_norm(tmp_path / "old.h5", UPDATED, marked=False)) as dump:
        np.testing.assert_array_equal(dump.tensor(0, 0, "input_1"), UPDATED)
