"""Pairs shown but not judged (workspaces, near-zero cancellations) and loss scales divided out."""

from __future__ import annotations

import numpy as np

from precision_tool.compare.check import check_report
from precision_tool.compare.comparator import compare_sources
from precision_tool.compare.memory import MemoryDump
from precision_tool.dump.records import StepRecord

RNG = np.random.default_rng(5)
TERMS = RNG.standard_normal((64, 8)).astype(np.float32)


TERMS_CANCELLING = TERMS - TERMS.mean(axis=0)  # each column sums to (almost) zero


def _sum_pair(target_noise: float):
    """A sum over rows whose terms cancel: golden holds 1e-9, the target rounding noise of ``target_noise``."""
    terms = TERMS_CANCELLING
    golden_sum = np.full(8, 1e-9, np.float32)
    target_sum = golden_sum + np.float32(target_noise) * RNG.standard_normal(8).astype(np.float32)
    golden, target = MemoryDump("g.h5"), MemoryDump("t.h5")
    golden.add("bias_grad", "aten.sum", {"input_0": terms, "output_0": golden_sum}, direction="backward")
    target.add("bias_grad", "aten.sum", {"input_0": terms, "output_0": target_sum}, direction="backward")
    golden.add("update", "aten.sub", {"input_0": golden_sum, "output_0": -golden_sum})
    target.add("update", "aten.sub", {"input_0": target_sum, "output_0": -target_sum})
    return golden, target


def test_an_output_whose_terms_cancel_is_judged_against_its_inputs_scale_and_not_failed():
    golden, target = _sum_pair(1e-5)
    report = compare_sources(golden, target)
    rows = {(r.op, r.tensor): r for r in report.rows}
    skip = rows[("bias_grad", "output_0")].skip
    g, t = golden.tensor(0, 0, "output_0").astype(np.float64), target.tensor(0, 0, "output_0").astype(np.float64)
    scale = np.linalg.norm(TERMS_CANCELLING.astype(np.float64))
    norm = np.linalg.norm(g)
    assert skip == (f"near zero: golden norm {norm:.3g} is {norm / scale:.2g} of its inputs' {scale:.3g} (the terms "
                    f"cancel); its error is {np.linalg.norm(t - g) / scale:.2g} of that scale")
    assert rows[("update", "input_0")].skip == skip + " (written by bias_grad)"
    assert rows[("update", "output_0")].skip == ""  # its own inputs are as small: judged, and it fails
    result = check_report(report)
    assert [(f.op, f.tensor) for f in result.failures] == [("update", "output_0")]


def test_a_near_zero_output_with_an_error_on_its_inputs_scale_is_still_judged():
    report = compare_sources(*_sum_pair(1.0))
    assert next(r for r in report.rows if r.tensor == "output_0").skip == ""


def test_a_byte_workspace_is_shown_and_not_judged():
    golden, target = MemoryDump("g.h5"), MemoryDump("t.h5")
    x = RNG.standard_normal(16).astype(np.float32)
    golden.add("rnn", "aten.mkldnn_rnn_layer", {"output_0": x, "output_1": np.arange(16, dtype=np.uint8)})
    target.add("rnn", "aten.mkldnn_rnn_layer", {"output_0": x, "output_1": np.arange(16, dtype=np.uint8)[::-1]})
    report = compare_sources(golden, target)
    workspace = next(r for r in report.rows if r.tensor == "output_1")
    assert workspace.skip == "not data: a uint8 output (a kernel's workspace or a mask), not compared"
    assert check_report(report).passed


def test_backward_tensors_of_a_loss_scaled_run_are_compared_with_the_scale_divided_out():
    golden, target = MemoryDump("g.h5"), MemoryDump("t.h5")
    grad = RNG.standard_normal(32).astype(np.float32)
    weight = RNG.standard_normal(32).astype(np.float32)
    golden.add("mm", "aten.mm", {"input_0": grad, "input_1": weight, "output_0": grad * 2}, direction="backward")
    target.add("mm", "aten.mm", {"input_0": grad * 1024, "input_1": weight, "output_0": grad * 2048},
               direction="backward")
    golden.steps = lambda: [StepRecord(0, 1.0, 1.0, False)]
    target.steps = lambda: [StepRecord(0, 1.0, 1024.0, False)]
    rows = {r.tensor: r for r in compare_sources(golden, target).rows}
    assert [(t, rows[t].loss_scale, rows[t].metrics.max_rel_err) for t in ("input_0", "input_1", "output_0")] == [
        ("input_0", 1024.0, 0.0), ("input_1", 1.0, 0.0), ("output_0", 1024.0, 0.0)]


def test_an_input_an_op_overwrites_unread_is_not_judged_and_makes_no_side_statistics_only(tmp_path):
    """``bernoulli_`` (dropout) overwrites its input without reading it: the torch capture records its shape
    and no value. The pair is shown, not judged, and the full dumps are not called statistics-only."""
    from dataclasses import replace

    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.compare.judged import NOT_READ
    from precision_tool.dump.reader import open_dump
    from precision_tool.dump.records import TensorRecord, TensorStats

    unread = TensorRecord("input_0", "float32", (4, 8), TensorStats(0, np.nan, np.nan, np.nan, np.nan, 0.0),
                          has_data=False)
    keep = (RNG.random((4, 8)) < 0.9).astype(np.float32)
    golden, target = MemoryDump("g.h5", role="golden"), MemoryDump("t.h5", role="target")
    for dump in (golden, target):
        record = dump.add("drop/aten.bernoulli__0", "aten.bernoulli_", {"output_0": keep})
        dump._records[-1] = replace(record, tensors=(unread, *record.tensors))
        dump.add("fc/aten.mm_0", "aten.mm", {"input_0": keep, "output_0": keep * 2})
    in_memory = compare_sources(golden, target)
    with open_dump(golden.save(tmp_path / "g.h5")) as g, open_dump(target.save(tmp_path / "t.h5")) as t:
        streamed = compare_dumps(g, t)
    for report in (in_memory, streamed):
        assert [(r.op, r.tensor, r.skip) for r in report.rows if r.skip] == [
            ("drop/aten.bernoulli__0", "input_0", NOT_READ)]
        assert not report.stats_only and not any("statistics only" in note for note in report.notes)
        assert not report.summary(0.99).flagged_ops
