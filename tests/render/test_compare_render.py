import csv
import io
import json
import math
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from rich.console import Console

from precision_tool.compare.check import CheckCriteria, check_report
from precision_tool.compare.comparator import compare_sources
from precision_tool.compare.memory import MemoryDump
from precision_tool.compare.report import select_flagged
from precision_tool.errors import ConfigError
from precision_tool.render.chart import UNDEFINED, sparkline
from precision_tool.render.check_view import check_json, check_view
from precision_tool.render.compare_export import CSV_COLUMNS, to_csv, to_json
from precision_tool.render.compare_view import compare_view, flagged_view
from precision_tool.render.junit import to_junit_xml
from precision_tool.render.plot import to_svg, write_plot

RNG = np.random.default_rng(5)
X = RNG.standard_normal(64).astype(np.float32)


@pytest.fixture(scope="module")
def report():
    golden, target = MemoryDump("golden.h5", role="golden"), MemoryDump("target.h5", role="target")
    for i in range(12):
        noise = np.float32(0.02 * i) * RNG.standard_normal(X.size).astype(np.float32)
        golden.add(f"block{i}/Mul", "Mul", {"input_0": X, "output_0": X})
        target.add(f"block{i}/Mul", "Mul", {"input_0": X, "output_0": X + noise}, dtypes={"output_0": "float16"})
    golden.add("head/MatMul", "MatMul", {"output_0": X})
    golden.add("head/Add", "Add", {"output_0": X})
    target.add("head/FusedMatMulAdd", "FusedMatMulAdd", {"output_0": np.zeros_like(X)},
               pass_name="MatMulAddFusion", original_names=("head/MatMul", "head/Add"),
               original_types=("MatMul", "Add"), output_origins=(("head/Add", 0),))
    golden.add("reshape", "Reshape", {"output_0": X})
    target.add("reshape", "Reshape", {"output_0": X[:32]})
    golden.add("only/golden", "Gone", {"output_0": X})
    target.add("only/target", "New", {"output_0": X})
    return compare_sources(golden, target)


def render(renderable, width=120) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


def test_table_lists_flagged_ops_first_first_with_dtypes_and_summary(report):
    ops = select_flagged(report, 0.98, 2)
    text = render(compare_view(report, ops, 0.98, 2))
    assert "Flagged ops (first 2 of 3)" in text
    body = [line for line in text.splitlines() if line.startswith("!")]
    assert len(body) == 2 and "fp16/fp32" in body[0]
    first = ops[0]
    assert f"first flagged: step 0 #{first.exec_index} {first.name}" in text
    assert "unmatched: 1 golden, 1 target" in text and "2 golden ops covered by fusion" in text
    assert "Unmatched golden (1):" in text and "only/golden" in text and "only/target" in text
    assert "1-cosine" in text and "max abs" in text  # the chart
    assert "one side is all zeros" in text  # the second flagged op's note
    assert "\x1b[" not in text


def test_all_listing_shows_problems_and_nan_cosine(report):
    text = render(compare_view(report, list(report.ops), 0.98, None, show_all=True))
    assert "All 14 compared ops" in text
    assert "shape mismatch" in text
    reshape_line = next(line for line in text.splitlines() if "reshape" in line)
    assert "n/a" in reshape_line
    assert "reshape output_0: shape mismatch: (32,) vs (64,)" in text
    fused_line = next(line for line in text.splitlines() if "head/FusedMatMulAdd" in line)
    assert " nan " in fused_line  # one side all zeros


def test_flagged_view_is_the_compare_view(report):
    ops = select_flagged(report, 0.98, 2)
    assert render(flagged_view(report, ops, 0.98, 2)) == render(compare_view(report, ops, 0.98, 2))


def test_json_has_rows_and_summary(report):
    ops = select_flagged(report, 0.98, 10)
    document = json.loads(to_json(report, ops, 0.98, 10, "flagged"))
    summary = document["summary"]
    assert summary["compared_ops"] == 14 and summary["unmatched_golden"] == 1 and summary["unmatched_target"] == 1
    assert summary["covered_by_fusion"] == 2 and summary["shape_mismatches"] == 1
    assert summary["flagged_ops"] == len(select_flagged(report, 0.98, None)) == 3
    assert summary["first_flagged"]["op"] == ops[0].name
    row = document["rows"][1]
    for key in ("step", "op", "type", "direction", "tensor", "cosine", "max_abs_err", "max_rel_err", "rmse",
                "target_dtype", "golden_dtype", "kl_divergence", "target_nan", "golden_saturated"):
        assert key in row
    fused = next(r for r in document["rows"] if r["op"] == "head/FusedMatMulAdd")
    assert fused["cosine"] is None and fused["note"] == "one side is all zeros"
    assert fused["golden_op"] == "head/Add" and fused["pass_name"] == "MatMulAddFusion"
    assert [u["op"] for u in document["unmatched_golden"]] == ["only/golden"]


def test_csv_parses_and_keeps_unmatched_rows(report):
    ops = list(report.ops)
    rows = list(csv.DictReader(io.StringIO(to_csv(report, ops, 0.98))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    compared = [r for r in rows if r["status"] == "compared"]
    assert len(compared) == len(report.rows)
    assert [r["op"] for r in rows if r["status"] != "compared"] == ["only/golden", "only/target"]
    fused = next(r for r in compared if r["op"] == "head/FusedMatMulAdd")
    assert fused["cosine"] == "nan"
    reshape = next(r for r in compared if r["op"] == "reshape")
    assert reshape["cosine"] == "" and reshape["problem"] == "shape mismatch" and reshape["shape"] == "32"


def test_junit_parses_with_one_testcase_per_op_and_named_failures(report):
    result = check_report(report, CheckCriteria(min_cosine=0.99))
    root = ET.fromstring(to_junit_xml(result))
    cases = root.findall("testcase")
    assert len(cases) == len(report.ops) + 2
    assert int(root.get("failures")) == len(result.failing_ops)
    failed = [c for c in cases if c.find("failure") is not None]
    first = result.failures[0]
    assert failed[0].get("name") == f"{first.op} ({first.direction})"
    assert failed[0].get("classname") == f"step{first.step}.{first.type}"
    assert first.tensor in failed[0].find("failure").get("message")
    assert "float16 vs float32" in failed[0].find("failure").get("message")
    assert len([c for c in cases if c.find("skipped") is not None]) == 2


def test_check_views(report):
    result = check_report(report, CheckCriteria(min_cosine=0.99))
    text = render(check_view(result))
    assert "FAILED" in text and "first failing op:" in text
    assert text.index(result.failures[0].op) < text.index(result.failures[-1].op)
    document = json.loads(check_json(result))
    assert document["passed"] is False and document["failures"][0]["op"] == result.failures[0].op


def test_svg_plot_is_valid_xml_with_both_series(report, tmp_path):
    root = ET.fromstring(to_svg(report, 0.98))
    assert root.tag.endswith("svg")
    text = ET.tostring(root, encoding="unicode")
    assert "first flagged" in text and "polyline" in text
    path = write_plot(report, tmp_path / "chart.svg", 0.98)
    ET.parse(path)


def test_png_plot_needs_matplotlib(report, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    path = write_plot(report, tmp_path / "chart.png", 0.98)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"precision-tool\[plot\]"):
        write_plot(report, tmp_path / "again.png", 0.98)


def test_plot_rejects_other_suffixes(report, tmp_path):
    with pytest.raises(ConfigError, match=".svg or .png"):
        write_plot(report, tmp_path / "chart.pdf", 0.98)


def test_sparkline_scales_buckets_and_marks():
    line, lo, hi = sparkline([1e-6, 1e-4, 1e-2, None, math.nan], 10)
    assert line == "▁▅█ " + UNDEFINED and (lo, hi) == (1e-6, 1e-2)
    line, _, _ = sparkline([1e-6] * 50 + [1.0] * 50, 10)  # buckets keep their worst value
    assert line == "▁" * 5 + "█" * 5


def test_sparkline_marks_exact_zeros_instead_of_drawing_them_at_a_floor():
    from precision_tool.render.chart import ZERO

    line, lo, hi = sparkline([0.0, 1e-6, 1e-2, 0.0], 10)
    assert line == ZERO + "▁█" + ZERO and (lo, hi) == (1e-6, 1e-2)  # the scale spans the nonzero values
    assert sparkline([0.0, 0.0], 4)[0] == ZERO * 2


def test_the_terminal_chart_draws_the_plots_data_with_step_starts_and_a_legend():
    from precision_tool.render.chart import ExecutionChart

    golden, target = MemoryDump("g.h5", role="golden"), MemoryDump("t.h5", role="target")
    for step in range(2):
        for name in ("a/Mul", "b/Add"):
            golden.add(name, name.split("/")[1], {"output_0": X}, step=step)
            target.add(name, name.split("/")[1], {"output_0": X * np.float32(1.0 + 0.5 * step)}, step=step)
    lines = _console_text(ExecutionChart(compare_sources(golden, target), 0.98), 80)
    assert lines[0] == "along execution order: 4 ops, log scale, taller is worse"
    assert lines[1].startswith("1-cosine    ··")  # step 0 is exact; step 1 scales by 1.5: cosine 1 too
    assert lines[2].startswith("max abs     ··")
    assert lines[3] == "steps         ┊   0..1"
    assert lines[-1] == "· exact zero  ┊ a step begins"


def test_cosines_that_round_to_one_keep_their_digits():
    from precision_tool.render.compare_view import fmt_cosine

    assert [fmt_cosine(v) for v in (1.0, 0.98, 0.9999997, 1 - 1e-14, None, math.nan)] == [
        "1.000000", "0.980000", "0.9999997", "1-1.0e-14", "n/a", "nan"]


def _sample_view(width: int) -> list[str]:
    from pathlib import Path

    from precision_tool.compare.comparator import compare_dumps

    samples = Path(__file__).resolve().parents[2] / "sample_dumps"
    report = compare_dumps(samples / "golden.h5", samples / "npu.h5")
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(compare_view(report, select_flagged(report, 0.98, 3), 0.98, 3, chart=False))
    lines = console.export_text().splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("  step")):]


def test_the_table_at_80_columns_drops_columns_before_it_cuts_a_name_and_never_breaks_a_number():
    lines = _sample_view(80)  # rmse leaves before a name is cut under 20 characters ('…LayerNormFused' said little)
    assert lines[:7] == [
        "  step op                    dir tensor   dtype             cosine   max abs",
        "────────────────────────────────────────────────────────────────────────────",
        "     0 norm/LayerNormFused   fwd input_0  fp16/fp32 0.999999988939   0.01454",
        "     0 norm/LayerNormFused   fwd input_1  fp16/fp32       1.000000         0",
        "     0 norm/LayerNormFused   fwd input_2  fp16/fp32       1.000000         0",
        "     0 norm/LayerNormFused   fwd input_3  fp16/fp32       1.000000 1.358e-08",
        "!    0 norm/LayerNormFused   fwd output_0 fp16/fp32       0.203955     437.5",
    ]
    assert all(len(line) <= 80 for line in lines)
    narrow = _sample_view(60)  # every droppable column gone: only then is the name cut, from its start
    assert narrow[2] == "     0 …LayerNormFused fwd input_0  0.999999988939   0.01454"


def test_the_table_at_120_columns_shows_every_column_and_whole_names():
    lines = _sample_view(120)
    assert lines[0] == ("  step # op                    type              dir tensor   dtype             cosine   "
                        "max abs   max rel      rmse")
    assert lines[6] == ("!    0 0 norm/LayerNormFused   LayerNormFused    fwd output_0 fp16/fp32       0.203955     "
                        "437.5     224.7     38.42")


def test_names_are_shortened_in_the_middle_at_a_path_boundary():
    from precision_tool.render.fit_table import shorten_start as shorten_middle

    name = "GPT2LMHeadModel/transformer/h.1/mlp/act/aten.mul_0"
    assert shorten_middle(name, 60) == name
    assert shorten_middle(name, 26).plain == "…/h.1/mlp/act/aten.mul_0"
    assert shorten_middle(name, 12).plain == "…/aten.mul_0"
    assert shorten_middle(name, 8).plain == "…n.mul_0"


def _sample_check(width: int) -> list[str]:
    from pathlib import Path

    from precision_tool.compare.comparator import compare_dumps

    samples = Path(__file__).resolve().parents[2] / "sample_dumps"
    result = check_report(compare_dumps(samples / "golden.h5", samples / "npu.h5"), CheckCriteria(min_cosine=0.99))
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(check_view(result))
    return console.export_text().splitlines()


def test_check_at_80_and_120_columns():
    narrow, wide = _sample_check(80), _sample_check(120)
    assert narrow[1:4] == [
        "step  # op                         dir tensor   dtype     metric     value limit",
        "────────────────────────────────────────────────────────────────────────────────",
        "   0  0 norm/LayerNormFused        fwd output_0 fp16/fp32 cosine     0.204  0.99"]
    assert wide[3].rstrip() == ("   0  0 norm/LayerNormFused    LayerNormFused       fwd output_0 fp16/fp32 cosine     "
                                "0.204  0.99 cosine 0.203955 < 0.99")
    assert all(len(line) <= 80 for line in narrow)


def _svg(report):
    root = ET.fromstring(to_svg(report, 0.98))
    ns = "{http://www.w3.org/2000/svg}"
    return root, ns


def _by_class(root, ns, cls):
    return [e for e in root.iter() if e.get("class") == cls]


def test_svg_marks_nan_cosines_and_exact_zero_errors_instead_of_drawing_fake_values(report):
    root, ns = _svg(report)
    nan_ops = [op for op in report.ops if op.worst_output_cosine is not None and math.isnan(op.worst_output_cosine)]
    zero_ops = [op for op in report.ops if op.max_output_abs_err == 0.0]
    assert nan_ops and zero_ops  # the fixture has both
    nan_marks = [e for e in _by_class(root, ns, "nan") if e.find(f"{ns}title") is not None]
    zero_marks = [e for e in _by_class(root, ns, "zero") if e.find(f"{ns}title") is not None]
    assert len(nan_marks) == len(nan_ops) and len(zero_marks) == len(zero_ops)
    assert nan_ops[0].name in nan_marks[0].find(f"{ns}title").text
    legend = " ".join(t.text for t in _by_class(root, ns, "legend")[0].iter(f"{ns}text"))
    assert "cosine undefined (NaN)" in legend and "error exactly 0" in legend
    # the log axis spans the nonzero errors only: no 1e-12 floor stretching it
    labels = [t.text for t in _by_class(root, ns, "ytick")]
    assert "1e-12" not in labels


def test_svg_ticks_are_integers_and_never_overprint(report):
    root, ns = _svg(report)
    xticks = [t.text for t in _by_class(root, ns, "xtick")]
    assert xticks and all(t.isdigit() for t in xticks) and xticks[0] == "0"
    ys = sorted(float(t.get("y")) for t in _by_class(root, ns, "ytick"))
    assert all(b - a >= 14 for a, b in zip(ys, ys[1:]))
    assert len([t for t in _by_class(root, ns, "ytick") if t.text.startswith("1e")]) <= 7


def test_svg_step_boundaries_and_hover_titles():
    golden, target = MemoryDump("g.h5", role="golden"), MemoryDump("t.h5", role="target")
    for step in range(3):
        for name in ("a/Mul", "b/Add"):
            golden.add(name, name.split("/")[1], {"output_0": X}, step=step)
            target.add(name, name.split("/")[1], {"output_0": X * np.float32(1.0 + 0.1 * step)}, step=step)
    root, ns = _svg(compare_sources(golden, target))
    assert len(_by_class(root, ns, "step")) == 2  # between steps 0|1 and 1|2
    titles = [e.find(f"{ns}title").text for e in _by_class(root, ns, "point")]
    assert any(t.startswith("step 2 #1 b/Add (forward): cosine") for t in titles)


def test_integer_ticks_are_round_numbers():
    from precision_tool.render.plot import integer_ticks

    assert integer_ticks(1) == [0]
    assert integer_ticks(28) == [0, 5, 10, 15, 20, 25]
    assert integer_ticks(50_000)[:3] == [0, 10_000, 20_000]


def test_the_chart_and_plot_leave_out_outputs_the_comparison_does_not_judge():
    """A key bias's gradient cancels to rounding noise: its cosine (here -1) is no verdict on the op,
    and drawn it would fill a clean run's chart with 1 - cosine ~ 1. The chart draws the judged outputs only."""
    from precision_tool.render.chart import ExecutionChart
    from precision_tool.render.plot import PlotData

    terms = RNG.standard_normal((64, 8)).astype(np.float32)
    terms -= terms.mean(axis=0)  # the rows cancel: their sum is near zero next to them
    near_zero = np.float32(1e-9) * np.array([1, 2, -1, 3, -2, 1, -1, 2], np.float32)
    wobble = np.float32(1e-3) * RNG.standard_normal(X.size).astype(np.float32)
    golden, target = MemoryDump("g.h5", role="golden"), MemoryDump("t.h5", role="target")
    for dump, out, bias_grad in ((golden, X * 4, near_zero), (target, X * 4 + wobble, np.float32(-0.5) * near_zero)):
        dump.add("fc/MatMul", "MatMul", {"input_0": X, "output_0": out})
        dump.add("k/bias_grad", "aten.sum", {"input_0": terms, "output_0": bias_grad}, direction="backward")
        dump.add("both/Split", "Split", {"input_0": terms, "output_0": X * 2, "output_1": bias_grad})
    report = compare_sources(golden, target)
    skipped = [r for op in report.ops for r in op.outputs if r.skip]
    assert [(r.tensor, r.cosine) for r in skipped] == [("output_0", pytest.approx(-1.0)),
                                                       ("output_1", pytest.approx(-1.0))]
    assert not select_flagged(report, 0.98, None)
    g, t = (X * 4).astype(np.float64), (X * 4 + wobble).astype(np.float64)
    one_minus = 1.0 - float(g @ t / np.sqrt((g @ g) * (t @ t)))
    assert [op.worst_output_cosine for op in report.ops] == [pytest.approx(1.0 - one_minus, abs=1e-12), None, 1.0]
    lines = _console_text(ExecutionChart(report, 0.98), 80)
    assert lines[1] == f"1-cosine    ▁ ·  {one_minus:.1e}..{one_minus:.1e}"  # the bias gradient is a blank
    assert lines[2].startswith("max abs     ▁ ·  ")
    assert PlotData.of(report, 0.98).worst == [0]


def _console_text(renderable, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def _samples():
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "sample_dumps"


def test_diagnose_at_80_and_120_columns_puts_the_verdict_first_and_wraps_beside_its_labels():
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump
    from precision_tool.render.shell_views import diagnosis

    with open_dump(_samples() / "golden.h5") as golden, open_dump(_samples() / "npu.h5") as target:
        result = diagnose(golden, target)
    narrow, wide = _console_text(diagnosis(result), 80), _console_text(diagnosis(result), 120)
    assert narrow[:5] == [
        "┏━ root cause ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓",
        "┃ Verdict: fusion                                                              ┃",
        "┃ Op:      norm/LayerNormFused (step 0, forward, LayerNormFused)               ┃",
        "┃ Module:  norm                                                                ┃",
        "┃   -      observed error 38.4, inherited from its inputs 0.00136              ┃"]
    assert narrow[9:12] == [
        "┃ Action:  switch off LayerNormFusionPass: put {\"GraphFusion\":                 ┃",
        "┃          {\"LayerNormFusionPass\": \"off\"}} in a fusion switch file (collect    ┃",
        "┃          --fusion-switch FILE)                                               ┃"]
    assert wide[7] == ("┃ Action:  switch off LayerNormFusionPass: put {\"GraphFusion\": {\"LayerNormFusionPass\": "
                       "\"off\"}} in a fusion switch file ┃")
    assert wide[10] == "Outcome  loss at step 1: golden 1.685, target 7.078"  # the checked-in dumps predate evaluations
    assert wide[11] == "Pre-check  1 setting differs: precision_mode (golden golden_float32, target force_fp16)"
    assert all(len(line) <= 80 for line in narrow) and all(len(line) <= 120 for line in wide)


def test_inspect_at_80_columns_keeps_each_overflowing_op_on_one_line():
    from precision_tool.dump.reader import open_dump
    from precision_tool.render.inspect_view import summary_view

    with open_dump(_samples() / "npu.h5") as dump:
        lines = _console_text(summary_view(dump.summary()), 80)
    start = lines.index("first overflowing ops")
    assert lines[start + 1:start + 5] == [
        "step # op                  type           dir compute cause max |out|",
        "─────────────────────────────────────────────────────────────────────",
        "   0 7 norm/LayerNormFused LayerNormFused bwd float16 here   0.211426",
        "   1 7 norm/LayerNormFused LayerNormFused bwd float16 here      62592"]
    assert lines[start - 2] == "recorded        28 ops, 110 tensors"


def test_inspect_shows_inf_as_the_largest_output_of_an_op_whose_outputs_hold_inf(tmp_path):
    """Statistics keep the finite values' min and max: an output of -inf and zeros peaks at inf, not at 0."""
    from precision_tool.dump.reader import open_dump
    from precision_tool.render.inspect_view import summary_view

    dump = MemoryDump("t.h5", role="target")
    dump.add("attn/aten.scalar_tensor_0", "aten.scalar_tensor", {"output_0": np.array(-np.inf, np.float32)},
             overflow=True)
    dump.add("attn/aten.where_0", "aten.where", {"output_0": np.array([0.0, -np.inf], np.float32)},
             overflow=True, inherited_nonfinite=True)
    dump.add("fc/aten.mm_0", "aten.mm", {"output_0": np.array([3.0, -70000.0], np.float32)}, overflow=True)
    with open_dump(dump.save(tmp_path / "t.h5")) as opened:
        lines = _console_text(summary_view(opened.summary()), 120)
    start = lines.index("first overflowing ops")
    assert [line.split()[-1] for line in lines[start + 3:start + 6]] == ["inf", "inf", "70000"]


def _long_chart(ops: int, flagged_at: int, name: str):
    from precision_tool.render.chart import ExecutionChart

    rng = np.random.default_rng(11)
    golden, target = MemoryDump("g.h5", role="golden"), MemoryDump("t.h5", role="target")
    for i in range(ops):
        op = name if i == flagged_at else f"layer{i}/Mul"
        noise = np.float32(1e-6 * (i + 1)) * rng.standard_normal(X.size).astype(np.float32)
        golden.add(op, "Mul", {"output_0": X}, step=i * 3 // ops)
        target.add(op, "Mul", {"output_0": -X if i == flagged_at else X + noise}, step=i * 3 // ops)
    return ExecutionChart(compare_sources(golden, target), 0.98)


def test_the_chart_at_80_columns_keeps_each_scale_on_its_sparklines_line():
    lines = _console_text(_long_chart(200, 20, "head/MatMul"), 80)  # 200 ops: the sparklines fill the width
    assert max(len(line) for line in lines) <= 80
    assert lines[1].startswith("1-cosine    ") and lines[1].endswith("  8.4e-12..2.0e+00")
    assert lines[2].startswith("max abs     ") and lines[2].endswith("  9.3e-06..4.9e+00")
    assert lines[3] == "steps                       ┊               ┊                 0..2"
    assert lines[4] == "                ^ first flagged: step 0 #20 head/MatMul (forward)"


def test_a_long_first_flagged_label_goes_before_its_caret_or_below_it():
    late = _console_text(_long_chart(200, 190, "attn/mm_0"), 80)
    assert late[4] == f"{' ' * 11}first flagged: step 2 #56 attn/mm_0 (forward) ^"
    name = "Model/encoder/layers.11/self_attn/aten.mm_0"
    early = _console_text(_long_chart(200, 10, name), 80)
    assert early[4:6] == [" " * 14 + "^", f"first flagged: step 0 #10 {name} (forward)"]


def test_a_note_shared_by_tensors_of_an_op_is_one_line_and_wrapped_lines_stay_indented():
    golden, target = MemoryDump("g.h5", role="golden"), MemoryDump("t.h5", role="target")
    golden.add("block/Split", "Split", {"output_0": X, "output_1": X})
    target.add("block/Split", "Split", {"output_0": np.zeros_like(X), "output_1": np.zeros_like(X)})
    golden.add("optimizer/weight/ApplyGradientDescent", "ApplyGradientDescent", {"output_0": X})
    report = compare_sources(golden, target)
    lines = _console_text(compare_view(report, select_flagged(report, 0.98, 10), 0.98, 10, chart=False), 60)
    assert "  step 0 #0 block/Split output_0, output_1: one side is all" in lines
    at = lines.index("Unmatched golden (1):")
    assert lines[at + 1:at + 4] == ["  step 0 #1 optimizer/weight/ApplyGradientDescent",
                                    "    (ApplyGradientDescent, forward): no target op of this",
                                    "    name"]
    assert lines[at + 4] == "compared 2 tensors in 1 op | flagged 1 op at cosine <= 0.98"
