"""The shell's renderers at a fixed width, without colour."""

import io
import math

import numpy as np
from rich.console import Console

from precision_tool.analysis.results import (Attribution, Diagnosis, FusionReport, FusionSuspect, OverflowEntry,
                                             OverflowReport, Range, Verdict)
from precision_tool.dump.records import OpRecord, TensorStats
from precision_tool.render import shell_views
from precision_tool.commands.results import (AutoCheck, Candidates, Mismatch, OpListing, TensorComparison, TensorView,
                                         TypeCount)


def text(renderable, width=100) -> str:
    out = io.StringIO()
    Console(file=out, width=width, no_color=True, highlight=False).print(renderable)
    return out.getvalue()


def entry(name, inherited=False, hint="keep it in float32"):
    return OverflowEntry(0, 3, name, "Exp", "forward", "float16", inherited, 12, 0, 0,
                         (Range(-1.0, 11.5),), (Range(0.0, 65504.0),), hint)


def test_names_with_brackets_are_not_markup():
    op = OpRecord(0, 0, "layer[0]/MatMul", "MatMul", "forward", "float32", False)
    listing = OpListing("target: t.h5", 0, {"name": "["}, ops=[op])
    assert "layer[0]/MatMul" in text(shell_views.op_listing(listing))


def test_type_counts_with_total():
    listing = OpListing("target: t.h5", 0, {}, counts=[TypeCount("MatMul", 3), TypeCount("Relu", 1)])
    out = text(shell_views.op_listing(listing))
    assert out.splitlines() == ["Op types of step 0 (target: t.h5)", "Type     Count", "─" * 14, "MatMul   3    ",
                                "Relu     1    ", "total    4    "]  # no blank first and last lines


def test_candidates():
    out = text(shell_views.candidates(Candidates("Mat", ("a/MatMul", "b/MatMul"), 30)))
    assert out.splitlines() == ["'Mat' matches 30 ops (first 2 of 30); give one of:", "  a/MatMul", "  b/MatMul"]


def test_tensor_view_rows_of_eight():
    stats = TensorStats(10, 0.0, 9.0, 4.5, 2.87, 16.88)
    view = TensorView("target:x:output_0@0", "float16", (2, 5), stats, np.arange(10.0), 10, 10)
    out = text(shell_views.tensor_view(view))
    assert "target:x:output_0@0  float16 (2, 5)  10 elements" in out
    rows = [line.strip("│ ").split() for line in out.splitlines()]
    assert ["0", "0", "1", "2", "3", "4", "5", "6", "7"] in rows and ["8", "8", "9"] in rows


def test_stats_only_tensor_view():
    view = TensorView("t:x:output_0@0", "float32", (3,), TensorStats(3, 1.0, 2.0, 1.5, 0.5, 2.0), None, 0, 3)
    assert "values: not kept (stats-only dump)" in text(shell_views.tensor_view(view))


def test_tensor_comparison_lists_mismatches():
    result = TensorComparison("l", "r", (2, 2), (2, 2), 1e-3, 1e-3, count=4, allclose=False, cosine=0.5,
                              error_ratio=0.25, mismatched=1, mismatches=[Mismatch((1, 0), 3.0, 1.0, 2.0)])
    out = text(shell_views.tensor_comparison(result))
    assert "AllClose     False" in out and "Cosine       0.500000" in out
    assert "ErrorRatio   0.25 (1 of 4; rl=0.001, al=0.001)" in out
    assert "(1, 0)   3      1       2" in out


def test_size_mismatch_shows_the_note_only():
    result = TensorComparison("l", "r", (3,), (4,), 1e-3, 1e-3, notes=["sizes differ: 3 vs 4 elements; not compared"])
    out = text(shell_views.tensor_comparison(result))
    assert "sizes differ: 3 vs 4 elements; not compared" in out and "AllClose" not in out


def test_overflow_entries_are_short_lines_first_marked():
    report = OverflowReport([entry("attn/Exp"), entry("attn/Div", inherited=True)], 5, [0], [0], [1024.0, 512.0], "o.h5")
    out = text(shell_views.overflow_report(report), width=120)
    assert ("5 op executions raised the float status in step 0 in o.h5; the first: attn/Exp (Exp), step 0 "
            "forward; updates skipped at step 0; loss scale 1024 -> 512") in " ".join(out.split())
    assert "[1] FIRST  step 0 forward #3  attn/Exp (Exp)  float16" in out
    assert "[2] inherited  step 0 forward #3  attn/Div (Exp)" in out
    assert "outputs hold 12 saturated, 0 inf, 0 nan values" in out and "inputs [-1, 11.5]  outputs [0, 65504]" in out
    assert "hint: keep it in float32" in out


def test_no_overflow():
    report = OverflowReport([], 0, [], [], [], "t.h5")
    assert text(shell_views.overflow_report(report)).strip() == "No op raised the float status in t.h5."


def test_fusion_suspects():
    suspect = FusionSuspect(0, "ln/Fused", "LayerNormFused", "LayerNormFusionPass", ("ln/Mean", "ln/Sub"),
                            0.2, 0.001, 200.0, "switch off LayerNormFusionPass")
    out = text(shell_views.fusion_report(FusionReport({"LayerNormFusionPass": 2}, [suspect], True)), width=160)
    assert "LayerNormFusionPass   2" in out and "switch off" in out
    assert "1    0 ln/Fused LayerNormFused LayerNormFusionPass            0.2       0.001   200" in out
    assert "Load golden" in text(shell_views.fusion_report(FusionReport({"P": 1}, [], False)))


def test_attribution_reading():
    a = Attribution(0, "fc/MatMul", "MatMul", "forward", "float16", observed=0.3, inherited=0.001,
                    introduced=0.3, expected=0.001)
    out = text(shell_views.attribution(a), width=160)
    assert "most of its error is introduced here; it computes 300x worse than float16 allows" in out
    b = Attribution(0, "fc/MatMul", "MatMul", "forward", "float16", 0.3, 0.3, None, None)
    assert "cannot replay this op" in text(shell_views.attribution(b))


def test_verdict_and_json_form():
    verdict = Verdict("attn/Exp", "overflow", 0, "forward", "Exp", ("saturated 12 values",), "keep Exp in fp32")
    diagnosis = Diagnosis(verdict, OverflowReport([entry("attn/Exp")], 1, [0], [], [math.nan], ""),
                          None, [], ["precision mode allow_fp32_to_fp16"], 3, "attn/Exp")
    raw = text(shell_views.auto_check(AutoCheck(diagnosis, None, 1)))
    assert raw.index("root cause") < raw.index("Overflow") < raw.index("Comparison")  # the answer first
    out = " ".join(raw.split())
    assert "Verdict: overflow" in out and "Op: attn/Exp (step 0, forward, Exp)" in out
    assert "3 ops at or below the cosine threshold; first: attn/Exp" in out and "Action: keep Exp in fp32" in out
    document = shell_views.diagnosis_dict(diagnosis)
    assert document["verdict"]["class"] == "overflow" and document["overflow"]["loss_scale"] == [None]
    assert document["fusion"] is None and document["flagged"] == 3


def test_an_overflow_with_clean_outputs_says_it_happened_inside_the_kernel():
    quiet = OverflowEntry(1, 7, "norm/LayerNormFused", "LayerNormFused", "backward", "float16", False, 0, 0, 0,
                          (Range(-0.5, 0.5),), (Range(-62592.0, 56800.0),), "switch the pass off")
    out = " ".join(text(shell_views.overflow_report(OverflowReport([quiet], 1, [1], [], [1.0, 1.0], "o.h5"))).split())
    assert ("1 op execution raised the float status in step 1 in o.h5; the first: norm/LayerNormFused "
            "(LayerNormFused), step 1 backward; no update was skipped; loss scale stayed 1") in out
    assert "no output holds inf, nan or a saturated value: the overflow is inside the kernel" in out


def test_the_attribution_table_shows_the_ops_up_to_the_culprit_unless_all():
    from precision_tool.analysis.results import Attribution

    scored = [Attribution(0, f"layer{i}/Mul", "Mul", "forward", "float16", 0.1, 0.1, 0.01, 0.001) for i in range(20)]
    verdict = Verdict("layer12/Mul", "precision_loss", 0, "forward", "Mul", ("evidence",), "keep it in fp32")
    diagnosis = Diagnosis(verdict, None, None, scored, [], 1, "layer12/Mul")
    shown = [a.name for a in shell_views.attribution_path(diagnosis)]
    assert shown == [f"layer{i}/Mul" for i in range(5, 13)]
    assert len(shell_views.attribution_path(diagnosis, show_all=True)) == 20
    out = " ".join(text(shell_views.auto_check(AutoCheck(diagnosis, None, 1)), width=120).split())
    assert "Attribution 20 ops scored; the 8 up to the culprit shown (--all: every one)" in out
    assert "layer4/Mul" not in out and "layer13/Mul" not in out
    everything = text(shell_views.auto_check(AutoCheck(diagnosis, None, 1, show_all=True)), width=120)
    assert "layer0/Mul" in everything and "layer19/Mul" in everything


def test_the_attribution_table_fits_80_columns_with_every_column():
    long = "GPT2LMHeadModel/transformer/h.1/mlp/c_fc/aten.addmm_0/aten.mm_1"
    scored = [Attribution(0, long, "aten.mm", "backward", "float16", 0.0004596, 0.0009419, 0.0002298, 0.0002905)]
    verdict = Verdict(long, "overflow", 0, "backward", "aten.mm", ("evidence",), "lower the loss scale")
    out = text(shell_views.diagnosis(Diagnosis(verdict, None, None, scored, [], 1, long)), width=80)
    table = out[out.index("Attribution"):].splitlines()
    assert table[:4] == [
        "Attribution  1 op scored",
        "Op                             Step Dir  Observed Inherited Introduced  Expected",
        "─" * 80,
        "…/c_fc/aten.addmm_0/aten.mm_1     0 bwd 0.0004596 0.0009419  0.0002298 0.0002905"]


def test_summaries_count_one_thing_in_the_singular_and_say_which_attributions_they_show():
    one = [Attribution(0, "a/Mul", "Mul", "forward", "float16", 0.1, 0.1, None, None)]
    fused = FusionSuspect(0, "ln/Fused", "LayerNormFused", "LayerNormFusionPass", ("ln/Mean",), 0.2, 0.001, 200.0,
                          "switch off LayerNormFusionPass")
    d = Diagnosis(Verdict("ln/Fused", "fusion", 0, "forward", "LayerNormFused", (), "switch it off"),
                  OverflowReport([entry("attn/Exp")], 1, [0], [], [1.0], ""),
                  FusionReport({"LayerNormFusionPass": 1}, [fused], True), one, [], 1, "ln/Fused")
    out = " ".join(text(shell_views.diagnosis(d), width=200).split())
    assert "Overflow 1 op execution raised the float status, the first attn/Exp (step 0 forward)" in out
    assert "Fusion 1 pass applied; 1 fused op worse than its unfused ops" in out
    assert "Comparison 1 op at or below the cosine threshold; first: ln/Fused" in out
    assert "Attribution 1 op scored" in out
    unreplayed = [Attribution(0, f"l{i}/Mul", "Mul", "forward", "float16", 0.1, 0.1, None, None) for i in range(20)]
    none = Diagnosis(Verdict(None, "none", None, None, None, (), "nothing to do"), None, None, unreplayed, [], 0, None)
    out = " ".join(text(shell_views.diagnosis(none), width=200).split())
    assert "Attribution 20 ops scored; the first 8 shown (--all: every one)" in out


def test_rerun_says_when_an_op_overflows_here_or_its_inputs_already_did():
    saturated = Attribution(0, "fc/aten.mm_1", "aten.mm", "backward", "float16", 0.00046, 0.00094, 0.00023, 0.00029,
                            overflowed=2)
    out = " ".join(text(shell_views.attribution(saturated), width=200).split("│"))
    out = " ".join(out.split())
    assert ("Overflowed 2 output values golden holds are beyond the target format's range (left out of the errors "
            "above)") in out
    assert ("Reading it makes values beyond its format's range here, from inputs that hold none (ac judges whether "
            "the ops reading it suffer)") in out
    downstream = Attribution(0, "fc/Add", "Add", "forward", "float16", 0.2, 0.2, 0.2, 0.001, new_nan=3,
                             inputs_off=("input_0",))
    out = " ".join(" ".join(text(shell_views.attribution(downstream), width=200).split("│")).split())
    assert "New NaN 3 output values are NaN where golden's are finite" in out
    assert "Inputs off input_0 already holds overflowed or NaN values" in out
    assert "Reading its inputs already hold overflowed or NaN values: look upstream" in out
