"""A step's index tables built from the step before: a training loop repeats its ops, with a few changes."""

import numpy as np

from precision_tool.dump import layout
from precision_tool.dump.index_tables import op_table
from precision_tool.dump.reader import open_dump
from precision_tool.dump.records import StepRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.dump.writer import DumpWriter



def _stats(shape, step):
    s = tensor_stats(np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + step, "float32")
    return (s.count, s.min, s.max, s.mean, s.std, s.norm, s.nan, s.inf, s.saturated)


def _write(path, steps):
    """``steps``: per step, a list of (name, attrs, shape) of its ops, each with one float32 output."""
    with DumpWriter(path, {"mode": "stats"}) as writer:
        for step, ops in enumerate(steps):
            writer.begin_step(step)
            for index, (name, attrs, shape) in enumerate(ops):
                writer.add_op(index, "forward", name, "aten.mul", "float32", False, False, None, attrs,
                              [(layout.OUTPUT, 0, "float32", shape, _stats(shape, step))])
            writer.end_step(StepRecord(step, 1.0, 1.0, False))


def test_ops_that_change_between_steps_read_back_as_written(tmp_path):
    base = [(f"layer{i}/aten.mul_0", {"args": [i]}, (2, 3)) for i in range(40)]
    scalar = list(base)
    scalar[7] = ("layer7/aten.mul_0", {"args": [9]}, (2, 3))  # same width: rows replaced in a copy
    longer = list(scalar)
    longer[3] = ("layer3/aten.mul_0", {"args": [0.0625], "extra": "a much longer attribute text"}, (2, 3))
    longer[5] = ("a/much/longer/name/of/layer5/aten.mul_0", {"args": [5]}, (4, 3, 1))
    steps = [base, base, scalar, longer, base]
    _write(tmp_path / "d.h5", steps)
    with open_dump(tmp_path / "d.h5") as dump:
        for step, ops in enumerate(steps):
            records = dump.ops(step=step)
            assert [r.name for r in records] == [name for name, _, _ in ops]
            assert [r.attrs for r in records] == [attrs for _, attrs, _ in ops]
            assert [r.tensors[0].shape for r in records] == [shape for _, _, shape in ops]
            assert [r.tensors[0].stats.max for r in records] == [np.prod(shape) - 1.0 + step for _, _, shape in ops]
            assert [r.tensors[0].stats.count for r in records] == [np.prod(shape) for _, _, shape in ops]


def _row(index, name=b"a/aten.mul_0", attrs=b""):
    return (index, 0, False, False, False, index, 1, name, b"aten.mul", "float32", b"", attrs)


def test_op_table_reuses_the_previous_table_where_it_can():
    rows = [_row(i) for i in range(16)]
    first = op_table(rows, None)
    assert op_table(list(rows), (rows, first)) is first  # the same rows: the same table (linked, not written)
    changed = list(rows)
    changed[2] = _row(2, attrs=b"{}")  # wider than the column: built again, as wide as it
    table = op_table(changed, (rows, first))
    assert table.dtype["attrs"].itemsize == 2 and table[2]["attrs"] == b"{}"
    again = list(changed)
    again[2] = _row(2, attrs=b"[]")  # fits: a copy with the row replaced, the previous table untouched
    copied = op_table(again, (changed, table))
    assert copied is not table and copied[2]["attrs"] == b"[]" and table[2]["attrs"] == b"{}"
    assert copied.tobytes() == np.array(again, dtype=table.dtype).tobytes()
    many = [_row(i, name=b"b/aten.mul_0") for i in range(16)]  # most rows changed: built again
    assert op_table(many, (rows, first)).tobytes() == np.array(many, dtype=first.dtype).tobytes()
