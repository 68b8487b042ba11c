"""Statistics computed at the step's end, for all of the step's arrays at once."""

import numpy as np
import pytest

from precision_tool.collect import collect_to
from precision_tool.collect.run import CollectRequest, run_collect
from precision_tool.dump.reader import open_dump
from precision_tool.dump.stats import stats_tuple
from precision_tool.engine.device import golden, npu
from precision_tool.session import Session, SessionConfig


class Scale:
    """A hook that scales one op's forward output in place (it must run before the collector)."""

    def after_op(self, event):
        if event.direction == "forward" and event.name == "fc1/MatMulBiasAddRelu":
            event.outputs[0] *= np.float32(2)


def _record(path, device, mode, hooks=()):
    with collect_to(path, mode=mode) as collector:
        Session(SessionConfig(model="mlp", steps=2, device=device), hooks=[*hooks, collector]).run()
    return collector


@pytest.mark.parametrize("device", [npu(), golden()], ids=["npu", "golden"])
def test_statistics_are_those_of_the_stored_values(tmp_path, device):
    _record(tmp_path / "d.h5", device, "dump")
    with open_dump(tmp_path / "d.h5") as dump:
        for op in dump.ops():
            for t in op.tensors:
                expected = stats_tuple(dump.tensor(op.step, op.exec_index, t.slot), t.dtype)
                s = t.stats
                assert (s.count, s.min, s.max, s.nan, s.inf, s.saturated) == \
                    (expected[0], expected[1], expected[2], *expected[6:])
                assert (s.mean, s.std, s.norm) == pytest.approx(expected[3:6], rel=1e-9, abs=1e-30)


def test_stats_mode_records_what_dump_mode_records(tmp_path):
    _record(tmp_path / "d.h5", npu(), "dump")
    collector = _record(tmp_path / "s.h5", npu(), "stats")
    with open_dump(tmp_path / "d.h5") as full, open_dump(tmp_path / "s.h5") as stats:
        assert [(o.name, [t.stats for t in o.tensors]) for o in stats.ops()] == \
            [(o.name, [t.stats for t in o.tensors]) for o in full.ops()]
        assert collector.ops_recorded == len(stats.ops())
        assert collector.tensors_recorded == sum(len(o.tensors) for o in stats.ops())


def test_an_earlier_hook_that_changes_values_in_place_is_seen(tmp_path):
    _record(tmp_path / "plain.h5", npu(), "stats")
    _record(tmp_path / "scaled.h5", npu(), "stats", hooks=[Scale()])
    with open_dump(tmp_path / "plain.h5") as plain, open_dump(tmp_path / "scaled.h5") as scaled:
        before = plain.op(0, "fc1/MatMulBiasAddRelu").tensor("output_0").stats
        after = scaled.op(0, "fc1/MatMulBiasAddRelu").tensor("output_0").stats
        assert after.max == 2 * before.max and after.mean == pytest.approx(2 * before.mean)
        reader = [o for o in scaled.ops(step=0) if o.exec_index == scaled.op(0, "fc1/MatMulBiasAddRelu").exec_index + 1]
        assert reader[0].tensor("input_0").stats.max == after.max  # the next op read the scaled values


@pytest.mark.parametrize("overflow_mode, counted", [("saturation", "saturated"), ("inf_nan", "inf")])
def test_an_overflowing_run_counts_saturated_and_nonfinite_values(tmp_path, overflow_mode, counted):
    path = tmp_path / "o.h5"
    run_collect(CollectRequest(model="transformer", output=str(path), mode="dump", steps=3,
                               loss_scale="exponential:65536,2", overflow_mode=overflow_mode))
    with open_dump(path) as dump, np.errstate(all="ignore"):
        seen = 0
        for op in dump.ops():
            for t in op.tensors:
                expected = stats_tuple(dump.tensor(op.step, op.exec_index, t.slot), t.dtype)
                assert (t.stats.count, t.stats.nan, t.stats.inf, t.stats.saturated) == (expected[0], *expected[6:])
                seen += getattr(t.stats, counted) > 0
        assert seen


@pytest.mark.parametrize("overflow_mode", ["saturation", "inf_nan"])
def test_the_c_bookkeeping_writes_the_index_the_python_one_writes(tmp_path, monkeypatch, overflow_mode):
    from precision_tool import native
    from precision_tool.dump.stats import StatsBatch

    if native.extension is None:
        pytest.skip("the C extension is not in use (not built, or PRECISION_TOOL_KERNEL=numpy)")

    def record(path):
        run_collect(CollectRequest(model="transformer", output=str(path), mode="stats", steps=3,
                                   loss_scale="fixed:1e9", overflow_mode=overflow_mode))
        with open_dump(path) as dump:
            return [(o.name, o.direction, o.inherited_nonfinite, [(t.slot, t.dtype, t.shape, t.stats)
                                                                  for t in o.tensors]) for o in dump.ops()]

    c_pass = record(tmp_path / "c.h5")
    monkeypatch.setattr(StatsBatch, "native_pass", property(lambda self: False))
    python_pass = record(tmp_path / "python.h5")
    # the same statistics to the last digit (repr: NaN statistics compare equal): one C loop reads every array
    assert repr(c_pass) == repr(python_pass)
    tensors = [t for *_, ts in c_pass for t in ts]
    assert any(s.nan or s.inf or s.saturated for *_, s in tensors)  # the rows the C pass leaves to Python
    assert any(inherited for _, _, inherited, _ in c_pass) == (overflow_mode == "inf_nan")


def test_the_c_bookkeeping_handles_every_kind_of_array_as_python_does(monkeypatch):
    from precision_tool import native
    from precision_tool.collect import collector as C
    from precision_tool.dump.stats import StatsBatch
    from precision_tool.engine.hooks import OpEvent

    if native.extension is None:
        pytest.skip("the C extension is not in use (not built, or PRECISION_TOOL_KERNEL=numpy)")
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 8)).astype(np.float32)
    wide = rng.standard_normal((4, 5))
    nan = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    big = np.full(64, 65504.0, np.float32)  # at float16's largest value: saturated counts
    inputs = [base, None, base.reshape(48), base.T, base[:, 2:5], np.asfortranarray(wide), wide.astype(">f8"),
              np.arange(5), np.empty((0, 3), np.float32), [1.0, 2.0], nan, big, base.reshape(2, 24).T]
    outputs = [base.transpose(1, 0).reshape(8, 6)[::-1], big, base.T.copy()]
    dtypes = ["float32", "", "float32", "float32", "float32", "float64", "float64", "int64", "float32", "float32",
              "float16", "float16"]  # one short: the last input gets its array's dtype name

    def run(c_pass: bool):
        monkeypatch.setattr(StatsBatch, "native_pass", property(lambda self: c_pass))
        stats, seen, tensors = StatsBatch(), {}, []
        collector = C.Collector.__new__(C.Collector)  # the parts _queue uses
        collector._stats, collector._seen, collector._tensors = stats, seen, tensors
        collector._later, collector._leftover, collector._queued, collector._queued_data = [], [], [], None
        event = OpEvent(0, "op", "Op", 0, "forward", list(inputs), list(dtypes), "float32",
                        outputs=list(outputs), output_dtypes=["float32", "float16", "float32"])
        collector._queue(event, False)
        rows = stats.matrix()
        return [(kind, i, dtype, shape, repr(rows[k].tolist()), stats.row(k, dtype)[8])
                for kind, i, dtype, shape, k in tensors]

    assert run(True) == run(False)
    c_rows = run(True)
    assert len(c_rows) == 15  # every array but the None
    assert c_rows[10][5] == c_rows[13][5] == 64  # `big`, as an input and as an output: saturated in float16
