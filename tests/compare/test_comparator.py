import math
import tracemalloc

import numpy as np
import pytest

from precision_tool.compare.comparator import CompareOptions, aligned_chunks, compare_dumps, compare_sources
from precision_tool.compare.memory import MemoryDump
from precision_tool.compare.report import SHAPE_MISMATCH, select_flagged
from precision_tool.engine.formats import FLOAT16
from precision_tool.errors import ConfigError, InputError

RNG = np.random.default_rng(3)


def chain(dump, values, n_ops=4, noise=0.0, dtype="float32", step=0):
    """A chain of ops, each output the next input; ``noise`` grows along the chain."""
    x = values
    for i in range(n_ops):
        y = (x * np.float32(1.5)).astype(np.float32)
        if noise:
            y = y + np.float32(noise * i) * RNG.standard_normal(y.shape).astype(np.float32)
        if dtype == "float16":
            y, _ = FLOAT16.round(y)
        dump.add(f"layer{i}/Scale", "Scale", {"input_0": x, "output_0": y}, step=step,
                 dtypes={"output_0": dtype})
        x = y
    return dump


@pytest.fixture
def base():
    return RNG.standard_normal((16, 32)).astype(np.float32)


def test_a_dump_compared_with_itself_is_cosine_one_everywhere(tmp_path, base):
    path = chain(MemoryDump(role="golden"), base, noise=0.1).save(tmp_path / "run.h5")
    report = compare_dumps(path, path)
    assert report.rows and all(row.cosine == 1.0 for row in report.rows)
    assert all(row.max_abs_err == 0.0 for row in report.rows)
    assert report.summary().flagged_ops == 0
    assert not report.unmatched_golden and not report.unmatched_target


def test_fp16_target_against_fp32_golden_through_dump_files(tmp_path, base):
    golden = chain(MemoryDump(role="golden"), base).save(tmp_path / "g.h5")
    target = chain(MemoryDump(role="target"), base, dtype="float16").save(tmp_path / "t.h5")
    report = compare_dumps(golden, target)
    outputs = [row for row in report.rows if row.kind == "output"]
    assert {(r.target_dtype, r.golden_dtype) for r in outputs} == {("float16", "float32")}
    assert all(0.9999 < r.cosine < 1.0 for r in outputs[1:])
    assert all(0 < r.max_rel_err < 2 * FLOAT16.unit_roundoff * 4 for r in (o.metrics for o in outputs))
    assert report.golden.mode == "dump" and report.target.role == "target"


def test_rows_are_grouped_per_op_in_execution_order(base):
    golden, target = chain(MemoryDump(), base), chain(MemoryDump(), base, noise=0.5)
    report = compare_sources(golden, target)
    assert [op.exec_index for op in report.ops] == [0, 1, 2, 3]
    assert [row.tensor for row in report.ops[0].rows] == ["input_0", "output_0"]
    flagged = select_flagged(report, 0.98, 10)
    assert flagged and flagged == [op for op in report.ops if op.flagged(0.98)]
    assert report.summary(0.98).first_flagged is flagged[0]
    assert select_flagged(report, 0.98, 1) == flagged[:1]
    assert select_flagged(report, 0.98, 0) == flagged


def test_shape_mismatch_is_reported_never_padded(base):
    golden, target = MemoryDump(), MemoryDump()
    golden.add("reshape", "Reshape", {"output_0": base})
    target.add("reshape", "Reshape", {"output_0": base[:, :31]})
    report = compare_sources(golden, target)
    (row,) = report.rows
    assert row.problem == SHAPE_MISMATCH and row.metrics is None
    assert (row.shape, row.golden_shape) == ((16, 31), (16, 32))
    assert report.shape_mismatches == [row]
    assert report.ops[0].flagged(0.98)


def test_stats_only_side_compares_statistics_and_says_so(base):
    golden = MemoryDump()
    target = MemoryDump(mode="stats")
    golden.add("op", "T", {"output_0": base})
    target.add("op", "T", {"output_0": base * np.float32(1.1)}, stats_only=True)
    report = compare_sources(golden, target)
    (row,) = report.rows
    assert row.cosine is None and row.stats is not None
    assert row.stats.rel_norm_diff == pytest.approx(0.1, rel=1e-5)
    assert report.stats_only and any("cosine is unavailable" in note for note in report.notes)
    assert report.ops[0].flagged(0.98)  # 0.1 > 1 - 0.98
    assert not report.ops[0].flagged(0.8)


def test_overflow_mode_dump_is_compared_with_a_note(base):
    golden = chain(MemoryDump(), base)
    target = MemoryDump(mode="overflow")
    target.add("layer2/Scale", "Scale", {"input_0": base, "output_0": base})
    report = compare_sources(golden, target)
    assert len(report.ops) == 1 and len(report.unmatched_golden) == 3
    assert any("overflow-mode" in note for note in report.notes)


def test_target_nonfinite_values_flag_the_op(base):
    golden, target = MemoryDump(), MemoryDump()
    golden.add("op", "T", {"output_0": base})
    broken = base.copy()
    broken[0, :3] = [np.nan, np.inf, -np.inf]
    target.add("op", "T", {"output_0": broken})
    (row,) = compare_sources(golden, target).rows
    assert row.extra_nonfinite == 3
    assert row.target_counts.nan == 1 and row.target_counts.inf == 2
    assert row.metrics.count == base.size - 3 and row.cosine == 1.0


def test_different_models_leave_everything_unmatched_with_a_clear_note(base):
    golden = chain(MemoryDump(), base)
    target = MemoryDump()
    target.add("conv1", "Conv", {"output_0": base})
    report = compare_sources(golden, target)
    assert not report.ops
    assert report.summary().unmatched_golden == 4 and report.summary().unmatched_target == 1
    assert any("no target op matched" in note for note in report.notes)


def test_selection_by_steps_and_op_glob(base):
    golden, target = MemoryDump(), MemoryDump()
    for step in (0, 1, 2):
        chain(golden, base, step=step)
        chain(target, base, step=step)
    report = compare_sources(golden, target, CompareOptions(steps=frozenset({1, 2}), ops="layer[13]/*"))
    assert [(op.step, op.name) for op in report.ops] == [(1, "layer1/Scale"), (1, "layer3/Scale"),
                                                         (2, "layer1/Scale"), (2, "layer3/Scale")]
    assert not report.unmatched_golden


def test_jobs_give_the_same_report_and_progress_reaches_the_total(base):
    golden, target = chain(MemoryDump(), base, 6), chain(MemoryDump(), base, 6, noise=0.2)
    calls = []
    one = compare_sources(golden, target, CompareOptions(jobs=1, chunk_elements=100))
    two = compare_sources(golden, target, CompareOptions(jobs=2, chunk_elements=100),
                          progress=lambda done, total: calls.append((done, total)))
    assert one.rows == two.rows
    assert calls[-1] == (2 * 6 * base.size, 2 * 6 * base.size)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError):
        CompareOptions(jobs=0)
    with pytest.raises(ConfigError):
        CompareOptions(chunk_elements=0)


def test_aligned_chunks_realign_different_chunkings():
    a = iter([np.arange(0, 5), np.arange(5, 10)])
    b = iter([np.arange(0, 3), np.arange(3, 4), np.arange(4, 10)])
    pieces = list(aligned_chunks(a, b))
    assert all(x.size == y.size and (x == y).all() for x, y in pieces)
    assert sum(x.size for x, _ in pieces) == 10
    with pytest.raises(ValueError, match="different numbers"):
        list(aligned_chunks(iter([np.arange(3)]), iter([np.arange(4)])))


def test_missing_and_corrupt_dumps_raise_input_errors(tmp_path, base):
    good = chain(MemoryDump(), base).save(tmp_path / "good.h5")
    with pytest.raises(InputError, match="no such file"):
        compare_dumps(tmp_path / "missing.h5", good)
    corrupt = tmp_path / "corrupt.h5"
    corrupt.write_bytes(b"not hdf5 at all")
    with pytest.raises(InputError):
        compare_dumps(good, corrupt)


def test_peak_memory_is_set_by_the_chunk_not_the_dump(tmp_path):
    golden, target = MemoryDump(), MemoryDump()
    for i in range(8):  # 8 pairs of 1 Mi float32 values: 64 MB of tensors
        values = RNG.standard_normal(1 << 20).astype(np.float32)
        golden.add(f"op{i}", "T", {"output_0": values})
        target.add(f"op{i}", "T", {"output_0": values + np.float32(1e-3)})
    g, t = golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5")
    del golden, target
    tracemalloc.start()
    try:
        report = compare_dumps(g, t, CompareOptions(chunk_elements=1 << 16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(report.rows) == 8 and all(not math.isnan(r.cosine) for r in report.rows)
    assert peak < 8 << 20  # the largest pair alone is 8 MB; the dumps hold 64 MB
