"""The overflow report: first overflow first, counts, ranges, hints."""

from dataclasses import replace

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


def test_an_inf_golden_makes_too_is_marked_as_golden_and_the_first_overflow_is_the_targets_own(tmp_path):
    """An attention mask's -inf raises the float status in both runs: it is the model's, not an overflow of
    the port. The target's own overflow stays the first; a mask that holds more inf than golden's is not
    golden's."""
    import numpy as np

    from precision_tool.analysis.overflow import AS_IN_GOLDEN
    from precision_tool.compare.memory import MemoryDump
    from precision_tool.dump.reader import open_dump
    from precision_tool.render.analysis_views import overflow_report as view

    mask = np.array([0.0, -np.inf, -np.inf, 0.0], np.float32)
    wider = np.array([-np.inf, -np.inf, -np.inf, 0.0], np.float32)
    golden, target = MemoryDump("golden.h5", role="golden"), MemoryDump("target.h5", role="target")
    for dump, second_mask, exp in ((golden, mask, 3e4), (target, wider, np.inf)):
        dump.add("attn/mask", "aten.scalar_tensor", {"output_0": np.array(-np.inf, np.float32)}, overflow=True)
        dump.add("attn/where", "aten.where", {"output_0": mask}, overflow=True, inherited_nonfinite=True)
        dump.add("attn/exp", "aten.exp", {"output_0": np.array([exp, 1.0], np.float32)}, overflow=exp == np.inf)
        dump.add("attn2/where", "aten.where", {"output_0": second_mask}, overflow=True)
        saturated = np.where(mask == -np.inf, np.float32(-65504), mask) if dump is target else mask
        dump.add("attn3/add", "aten.add", {"output_0": saturated}, dtypes={"output_0": "float16"}, overflow=True)

    with open_dump(golden.save(tmp_path / "golden.h5")) as golden, \
            open_dump(target.save(tmp_path / "target.h5")) as target:
        alone = overflow_report(target)
        report = overflow_report(target, golden=golden)
    assert [e.in_golden for e in alone.entries] == [False] * 5 and alone.first.name == "attn/mask"
    assert [(e.name, e.in_golden) for e in report.entries] == [
        ("attn/mask", True), ("attn/where", True), ("attn/exp", False), ("attn2/where", False),
        ("attn3/add", True)]  # (a saturation mode's -65504 for golden's -inf)
    assert (report.entries[-1].saturated, report.entries[-1].inf) == (2, 0)
    assert report.as_in_golden == 3 and report.first.name == "attn/exp"
    assert report.entries[0].hint == AS_IN_GOLDEN
    assert report.entries[-1].hint == ("golden's op makes as many inf/NaN (written as the format's largest value "
                                       "here): the model's own values (an attention mask's -inf), not an overflow "
                                       "of this run")
    assert report.entries[0].output_ranges[0].min != report.entries[0].output_ranges[0].min  # none finite: NaN
    text = _text(view(report))
    assert text[0] == (f"5 op executions raised the float status in step 0 in {target.path}; the first: "
                       "attn/exp (aten.exp), step 0 forward; 3 of them as golden's ops do (the model's own "
                       "inf/NaN); no update was skipped; loss scale stayed 1")
    assert text[2].startswith("[1] as golden  step 0 forward #0  attn/mask (aten.scalar_tensor)")
    assert text[4] == "    inputs -  outputs [no finite value]"
    assert text[10].startswith("[3] FIRST  step 0 forward #2  attn/exp (aten.exp)")
    # a limit shows the target's own overflows first, then golden's where room is left, in execution order
    assert [e.name for e in report.cut(2)] == ["attn/exp", "attn2/where"]
    assert [e.name for e in report.cut(3)] == ["attn/mask", "attn/exp", "attn2/where"]
    with open_dump(tmp_path / "golden.h5") as golden, open_dump(tmp_path / "target.h5") as target:
        limited = overflow_report(target, limit=2, golden=golden)
    assert [e.name for e in limited.entries] == ["attn/exp", "attn2/where"] and limited.total == 5
    assert _text(view(report, 2))[1] == ("showing 2 of 5, in execution order, the model's own inf/NaN where "
                                         "room is left")
    assert _text(view(report))[1] == "showing 5 of 5, in execution order"


def _text(renderable) -> list[str]:
    import io

    from rich.console import Console

    console = Console(width=400, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_the_diagnosis_summary_says_when_golden_explains_every_overflow():
    from dataclasses import replace

    from precision_tool.analysis.results import OverflowEntry, OverflowReport
    from precision_tool.render.diagnosis_parts import overflow_summary

    entry = OverflowEntry(0, 3, "attn/mask", "aten.scalar_tensor", "forward", "float32", False, 0, 1, 0, (), (), "",
                          in_golden=True)
    report = OverflowReport([entry, replace(entry, exec_index=5)], 18, [0], [], [1.0], "t.h5", as_in_golden=18)
    assert report.first is None
    assert overflow_summary(report) == "18 op executions raised the float status, each as golden's op does"
    mixed = replace(report, entries=[entry, replace(entry, name="exp", in_golden=False)], as_in_golden=17)
    assert overflow_summary(mixed) == ("18 op executions raised the float status, the first exp (step 0 forward); "
                                       "17 as golden's ops do")


def _fake_dump(records):
    class Fake:
        path = "t.h5"

        def steps(self):
            return []

        def ops(self):
            return records

    return Fake()


def test_an_infinite_constant_the_model_asks_for_and_what_carries_it_are_its_own_not_the_first():
    """A mask's scalar_tensor(-inf), the where that spreads it and the add of it to the scores are the model's
    own -inf even where golden's ops do not make them (golden ran another attention path): never the first,
    hinted as the model's. An overflow of the run's own that also reads the mask stays an overflow; so does a
    constant the format turned into inf (asked for as 1e6 in float16)."""
    from precision_tool.dump.records import TensorRecord, TensorStats

    nan = float("nan")
    minus_inf = TensorStats(1, nan, nan, nan, nan, 0.0, inf=1)
    spread = TensorStats(16, 0.0, 0.0, 0.0, 0.0, 0.0, inf=8)
    scores = TensorStats(16, -1.0, 1.0, 0.0, 0.5, 2.0)
    masked = TensorStats(16, -1.0, 1.0, 0.1, 0.5, 2.0, inf=8)
    hot = TensorStats(16, -1.0, 1.0, 0.0, 0.5, 2.0, inf=3)

    def record(index, name, op_type, inputs, outputs, attrs=None, inherited=False, dtype="float32"):
        tensors = tuple(TensorRecord(f"input_{i}", dtype, (4, 4), s) for i, s in enumerate(inputs)) + \
            tuple(TensorRecord(f"output_{i}", dtype, (4, 4), s) for i, s in enumerate(outputs))
        return OpRecord(0, index, name, op_type, "forward", dtype, True, tensors, inherited_nonfinite=inherited,
                        attrs=attrs or {})

    constant = record(1, "attn/aten.scalar_tensor_0", "aten.scalar_tensor", [], [minus_inf],
                      {"args": [{"float": "-inf"}]})
    where = record(2, "attn/aten.where_0", "aten.where", [minus_inf], [spread], inherited=True)
    add = record(3, "attn/aten.add_0", "aten.add", [scores, spread], [masked], inherited=True)
    own = record(4, "mlp/aten.exp_0", "aten.exp", [scores], [hot], dtype="float16")
    reads_both = record(5, "attn/aten.add_1", "aten.add", [hot, spread], [masked], inherited=True)
    too_big = record(6, "x/aten.full_0", "aten.full", [], [minus_inf], {"args": [{"float": "1000000.0"}]},
                     dtype="float16")
    report = overflow_report(_fake_dump([constant, where, add, own, reads_both, too_big]))
    assert [e.asked for e in report.entries] == [True, True, True, False, False, False]
    assert (report.asked, report.models_own, report.first.name) == (3, 3, "mlp/aten.exp_0")
    assert report.entries[0].hint.startswith("asked for as an infinite constant (an attention mask's -inf)")
    assert report.entries[1].hint.startswith("carries only infinite constants the model asked for")
    assert report.entries[4].hint.startswith("propagates an earlier overflow")
    assert [e.name for e in report.cut(2)] == ["mlp/aten.exp_0", "attn/aten.add_1"]  # the run's own first
    alone = overflow_report(_fake_dump([constant, where, add]))
    assert alone.first is None
    from precision_tool.render.diagnosis_parts import overflow_summary

    assert overflow_summary(alone) == ("3 op executions raised the float status, each with the model's own "
                                       "inf/NaN: 3 infinite constants it asks for or carries (a mask's -inf)")


def test_an_update_that_divides_by_zeros_float16_made_starts_the_overflow_though_rounding_moved_its_inputs():
    """Adam's update in float16: its denominator holds zeros (an eps and small second moments below float16's
    range) where golden's smallest is 4.5e-7. Its inputs depart by 8.5 % through rounding alone, all finite:
    the overflow starts there. An input holding inf of its own points to an earlier op instead."""
    from precision_tool.analysis.errors import overflows_here
    from precision_tool.analysis.overflow import starts_here
    from precision_tool.analysis.results import Attribution
    from precision_tool.dump.records import TensorRecord, TensorStats

    def update(denominator: TensorStats, dtype: str) -> OpRecord:
        tensors = (TensorRecord("input_0", dtype, (8,), TensorStats(8, -0.07, 0.08, 0.0, 0.02, 0.05)),
                   TensorRecord("input_2", dtype, (8,), denominator),
                   TensorRecord("output_0", dtype, (8,), TensorStats(8, -0.07, 0.08, 0.0, 0.02, 0.05, inf=3)))
        return OpRecord(0, 392, "optimizer/AdamW/aten.addcdiv__0", "aten.addcdiv_", "optimizer", dtype, True, tensors)

    target = update(TensorStats(8, 0.0, 0.16, 0.007, 0.018, 1.25), "float16")
    golden = update(TensorStats(8, 4.47e-7, 0.16, 0.007, 0.018, 1.25), "float32")
    rounded = Attribution(0, target.name, target.type, "optimizer", "float16", 0.0027, 0.085, None, None,
                          overflowed=3)
    assert overflows_here(target, rounded)
    assert not overflows_here(target, replace(rounded, inputs_off=("input_2",)))  # an inf it reads: earlier
    assert overflows_here(target, replace(rounded, inherited=0.002, inputs_off=("input_2",)))
    assert starts_here(target, golden, 0.085) == (
        "its inputs are finite, 0.085 from golden's by rounding alone (no op before it overflowed): the problem "
        "starts here",
        "golden holds finite values there; the ops reading it diverge",
        "its input_2 holds zeros where golden's smallest value is 4.47e-07: it divides by zeros float16's range "
        "made (values below its smallest, 5.96e-08, round to 0)")
    assert overflow_hint(target, 1.0).startswith("the optimizer updates in float16: keep the parameters it "
                                                 "updates and its states in float32")
    assert "Adam's eps (1e-8)" in overflow_hint(target, 1.0)
    sgd = OpRecord(0, 9, "Update", "SGDUpdate", "optimizer", "float16", True)  # an engine op: no "/" in its name
    assert overflow_hint(sgd, 1.0) == (
        "the optimizer updates in float16: keep the parameters it updates and its states in float32 (the model in "
        "float32 under torch.autocast, or a float32 master copy for the optimizer)")


def test_a_cast_of_float32_s_lowest_value_to_a_16_bit_format_carries_the_model_s_mask():
    # a mask filled with finfo(float32).min, cast to bfloat16 for a softmax computed there: -inf, the model's
    # constant (blamed from statistics as "result is not finite in float32" before); a cast of ordinary values
    # beyond float16's range overflows, and its hint names the format
    from precision_tool.analysis.overflow import asked_constants
    from precision_tool.dump.records import TensorRecord, TensorStats

    lowest = -3.4028234663852886e38
    mask = TensorRecord("input_0", "float32", (4,), TensorStats(4, lowest, 0.05, lowest / 2, 1e38, 2e38))
    cast = TensorRecord("output_0", "bfloat16", (4,), TensorStats(4, 0.0, 0.05, 0.02, 0.02, 0.06, inf=2))
    record = OpRecord(0, 7, "attn/aten._to_copy_3", "aten._to_copy", "forward", "float32", True, (mask, cast))
    assert asked_constants([record], set()) == {(0, 7)}
    large = TensorRecord("input_0", "float32", (4,), TensorStats(4, -67902.0, 63302.0, 0.0, 5e4, 1e5))
    weight = TensorRecord("output_0", "float16", (4,), TensorStats(4, -64672.0, 63296.0, 0.0, 5e4, 1e5, inf=1))
    overflowing = OpRecord(0, 8, "mlp/aten._to_copy_0", "aten._to_copy", "forward", "float32", True,
                           (large, weight))
    assert asked_constants([overflowing], set()) == set()
    assert overflow_hint(overflowing, None).startswith("a cast to float16 overflows")
