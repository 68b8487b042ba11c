"""The batch of packed pairs gives exactly the rows that scoring pair by pair gives."""

import math

import numpy as np
import pytest

from precision_tool import native
from precision_tool.compare import batch
from precision_tool.compare.comparator import CompareOptions, compare_dumps
from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.dump.storage import from_storage, to_storage
from precision_tool.dump.writer import DumpWriter

kernel = native.extension
needs_kernel = pytest.mark.skipif(kernel is None, reason="the C extension is not built here")


def write(path, tensors: list[tuple[str, np.ndarray]], loss_scale=1.0):
    """A one-step dump: op i has one output, tensors[i] = (dtype, values); backward ops from the middle on."""
    writer = DumpWriter(path, {"mode": "dump", "role": "target"})
    writer.begin_step(0)
    for i, (dtype, values) in enumerate(tensors):
        direction = "forward" if i < len(tensors) // 2 else "backward"
        record = TensorRecord("output_0", dtype, values.shape, tensor_stats(values, dtype))
        writer.write_op(OpRecord(0, i, f"op{i}", "Op", direction, dtype, False, (record,)), {"output_0": values})
    writer.end_step(StepRecord(0, 0.0, loss_scale, False, ops_recorded=len(tensors)))
    writer.close(complete=True)
    return path


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` (float64) as a ``dtype`` tensor holds them: float32 containers, float64 for float64."""
    if dtype == "float64":
        return values
    return from_storage(to_storage(values.astype(np.float32), dtype), dtype)


DTYPES = ["float32", "float16", "bfloat16", "float64", "float32", "int64"]
SIZES = [1, 7, 1000, 4097, 9000, 0]


def size(i: int) -> int:
    return SIZES[(i // 6) % 6] if i % 5 else 12


@pytest.fixture
def pair(tmp_path):
    """60 one-output ops: float32/16/bf16/64 targets against float32 (float64) golden, int64 every 6th."""
    rng = np.random.default_rng(3)
    golden, target = [], []
    for i in range(60):
        dtype, n = DTYPES[i % 6], size(i)
        if dtype == "int64":
            golden.append(("int64", np.arange(n)))
            target.append(("int64", np.arange(n) + (np.arange(n) % 3 == 0)))
            continue
        y = rng.standard_normal(n) * 3
        x = y + rng.standard_normal(n) * 1e-2
        if i == 13:
            x[3] = np.nan  # the kernel refuses the pair: scored the other way, with the NaN counted
        elif i == 19:
            x = y.copy()  # identical where the dtypes are
        golden_dtype = "float64" if dtype == "float64" else "float32"
        golden.append((golden_dtype, rounded(y, golden_dtype)))
        target.append((dtype, rounded(x, dtype)))
    return write(tmp_path / "golden.h5", golden), write(tmp_path / "target.h5", target)


@needs_kernel
def test_the_batch_gives_the_rows_of_pair_by_pair_scoring(pair, monkeypatch):
    batched = compare_dumps(*pair)
    monkeypatch.setattr(native, "extension", None)  # the batch steps aside; the metrics keep the C kernel
    one_by_one = compare_dumps(*pair)
    assert repr(batched) == repr(one_by_one)  # every metric to the bit, NaN and types included
    rows = [row for op in batched.ops for row in op.rows]
    assert rows[13].metrics.nonfinite_pairs == 1 and rows[13].extra_nonfinite == 1
    assert rows[19].metrics.cosine > 0.99999  # float16 against float32 of the same values
    assert all(type(row.metrics.cosine) is float for row in rows)


@needs_kernel
def test_the_batch_takes_the_packed_float_pairs_only(pair):
    from precision_tool.compare.matching import match_ops
    from precision_tool.dump.reader import open_dump

    with open_dump(pair[0]) as golden, open_dump(pair[1]) as target:
        pairs = match_ops(golden.ops(), target.ops()).pairs
        rows = [None] * len(pairs)
        scored = []
        batch.score_packed(pairs, golden, target, 1 << 20, [1.0] * len(pairs), rows, scored.append)
    taken = [i for i, row in enumerate(rows) if row is not None]
    # left out: int64 tensors (every 6th), the pair holding a NaN (13) and the empty tensors (a dataset each, no
    # pack); 9000 float64 values still fit a pack
    assert set(range(60)) - set(taken) == {i for i in range(60) if i % 6 == 5} | {13} | \
        {i for i in range(60) if size(i) == 0}
    assert len(scored) == len(taken)


@needs_kernel
def test_chunk_size_and_loss_scale_keep_pairs_out_of_the_batch(pair):
    from precision_tool.compare.matching import match_ops
    from precision_tool.dump.reader import open_dump

    with open_dump(pair[0]) as golden, open_dump(pair[1]) as target:
        pairs = match_ops(golden.ops(), target.ops()).pairs
        rows = [None] * len(pairs)
        scales = [2.0 if i == 0 else 1.0 for i in range(len(pairs))]
        batch.score_packed(pairs, golden, target, 1000, scales, rows)
    left = {i for i, row in enumerate(rows) if row is None}
    assert left == {0, 13} | {i for i in range(60) if i % 6 == 5 or size(i) > 1000 or size(i) == 0}  # scaled,
    # NaN, int, large, empty
    assert any(size(i) == 1000 for i in range(60) if i not in left)


@needs_kernel
def test_float16_widens_exactly_for_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(np.float16)
    finite = np.isfinite(values)
    halves = values[finite]
    wide = halves.astype(np.float32)
    golden = np.linspace(-3, 3, wide.size).astype(np.float32)
    expected = np.zeros(kernel.N_SUMS)
    assert kernel.pair_sums(wide, golden, expected, 0.0, 1e-7, 0.0, 1e-7, 1e-16) == 0
    buffers = (halves.view(np.uint8).copy(),), (golden.view(np.uint8).copy(),)
    table = np.array([[0, 0, 2, 0, 0, 0, wide.size]], np.int64)
    sums, status = np.empty((1, kernel.N_SUMS)), np.empty(1, np.int8)
    kernel.pairs_sums(*buffers, table, np.array([[0.0, 1e-7, 0.0, 1e-7, 1e-16]]), sums, status)
    assert status.tolist() == [0]
    assert sums[0].tolist() == expected.tolist()


@needs_kernel
def test_bfloat16_bits_widen_exactly():
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal(5000).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    golden = rng.standard_normal(5000)
    expected = np.zeros(kernel.N_SUMS)
    kernel.pair_sums(wide, golden, expected, -4.0, 1e-6, -4.0, 1e-6, 2.2e-16)
    bits = (wide.view(np.uint32) >> 16).astype(np.uint16)
    table = np.array([[0, 0, 3, 0, 0, 1, 5000]], np.int64)
    sums, status = np.empty((1, kernel.N_SUMS)), np.empty(1, np.int8)
    kernel.pairs_sums((bits.view(np.uint8),), (golden.view(np.uint8),), table,
                      np.array([[-4.0, 1e-6, -4.0, 1e-6, 2.2e-16]]), sums, status)
    assert status.tolist() == [0] and sums[0].tolist() == expected.tolist()


@needs_kernel
def test_rows_outside_their_buffer_or_misaligned_are_handed_back():
    buffer = np.arange(16, dtype=np.float32).view(np.uint8)
    table = np.array([[0, 0, 0, 0, 0, 0, 16],    # fits
                      [0, 4, 0, 0, 0, 0, 16],    # one value past the end
                      [0, 2, 0, 0, 0, 0, 4],     # misaligned float32
                      [1, 0, 0, 0, 0, 0, 1],     # no such buffer
                      [0, 0, 7, 0, 0, 0, 1],     # no such kind
                      [0, 0, 0, 0, 0, 0, -1]],   # negative count
                     np.int64)
    n = len(table)
    sums, status = np.full((n, kernel.N_SUMS), 5.0), np.empty(n, np.int8)
    kernel.pairs_sums((buffer,), (buffer,), table, np.zeros((n, 5)), sums, status)
    assert status.tolist() == [0, 2, 2, 2, 2, 2]
    assert sums[0][0] == 16 and not sums[1:].any()
    with pytest.raises(ValueError, match="disagree on n"):
        kernel.pairs_sums((buffer,), (buffer,), table[:2], np.zeros((n, 5)), sums, status)


def test_without_the_extension_nothing_is_batched(pair, monkeypatch):
    monkeypatch.setattr(native, "extension", None)
    report = compare_dumps(*pair, CompareOptions(jobs=1))
    assert len([row for op in report.ops for row in op.rows]) == 60
    assert math.isclose(report.ops[0].rows[0].metrics.cosine, 1.0, abs_tol=1e-3)
