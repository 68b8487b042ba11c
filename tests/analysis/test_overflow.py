"""The overflow report: first overflow first, counts, ranges, hints."""

from precision_tool.analysis import overflow_report
from precision_tool.analysis.overflow import overflow_hint
from precision_tool.dump.records import OpRecord


def test_report_lists_the_exp_first_with_saturation_counts(planted_dumps):
    golden, target = planted_dumps("hot_attention")
    with golden, target:
        report = overflow_report(target)
        assert overflow_report(golden).total == 0
    first = report.first
    assert (first.name, first.type, first.direction, first.compute_dtype) == ("Exp", "Exp", "forward", "float16")
    assert first.saturated > 0 and first.inf == 0 and first.nan == 0
    assert first.output_ranges[0].max == 65504.0
    assert first.input_ranges[0].max > 11.09  # exp(11.09) is the float16 limit
    assert report.steps == [0]
    assert [e.exec_index for e in report.entries] == sorted(e.exec_index for e in report.entries)


def test_limit_keeps_the_total():
    class Fake:
        path = "fake.h5"

        def steps(self):
            return []

        def ops(self):
            return [OpRecord(0, i, f"op{i}", "Exp", "forward", "float16", True) for i in range(5)]

    report = overflow_report(Fake(), limit=2)
    assert report.total == 5 and len(report.entries) == 2


def test_hints_depend_on_op_and_direction():
    def record(op_type, direction="forward", inherited=False):
        return OpRecord(0, 0, "x", op_type, direction, "float16", True, inherited_nonfinite=inherited)

    assert "subtract the max before exp" in overflow_hint(record("Exp"), None)
    assert "lower the loss scale" in overflow_hint(record("MatMul", "backward"), 1024.0)
    assert "(loss scale 1024)" in overflow_hint(record("MatMul", "backward"), 1024.0)
    assert '"to-add": ["MatMul"]' in overflow_hint(record("MatMul"), None)
    assert overflow_hint(record("Add", inherited=True), None).startswith("propagates an earlier overflow")
    fused = OpRecord(0, 0, "ln", "LayerNormFused", "backward", "float16", True, pass_name="LayerNormFusionPass")
    assert overflow_hint(fused, 1.0).startswith("a fused kernel (LayerNormFusionPass) overflows")


def test_hint_for_an_overflow_hidden_inside_the_kernel():
    from precision_tool.dump.records import TensorRecord, TensorStats

    in_range = TensorRecord("output_0", "float16", (2,), TensorStats(2, -1.0, 1.0, 0.0, 1.0, 1.4))
    record = OpRecord(0, 0, "g", "Gelu", "forward", "float16", True, (in_range,))
    assert overflow_hint(record, None).startswith("an intermediate of Gelu overflowed")
