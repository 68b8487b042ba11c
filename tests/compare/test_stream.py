"""The streaming comparison (`compare.stream`) shows exactly what the in-memory one shows, or steps aside.

Each case runs a command twice in process, streaming and with ``PRECISION_TOOL_STREAM=0`` (the whole
comparison in memory), and asserts the same stdout, stderr, files and exit status; windows of a few ops make
every pair of dumps cross window boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest

from precision_tool.compare.memory import MemoryDump
from precision_tool.dump.records import StepRecord
from precision_tool.dump.writer import DumpWriter

RNG = np.random.default_rng(17)
X = RNG.standard_normal((4, 8)).astype(np.float32)
TERMS = RNG.standard_normal((64, 8)).astype(np.float32)
TERMS -= TERMS.mean(axis=0)  # a sum over rows that cancels: near zero next to its inputs
NEAR_ZERO = np.full(8, 1e-9, np.float32)


def _save(dump: MemoryDump, path, loss_scales: dict[int, float] | None = None) -> str:
    """`MemoryDump.save`, with a loss scale per step."""
    writer = DumpWriter(path, {"mode": dump.mode, "role": dump.role})
    try:
        for step in sorted({r.step for r in dump.ops()}):
            writer.begin_step(step)
            records = dump.ops(step)
            for record in records:
                writer.write_op(record, {t.slot: dump._arrays.get((step, record.exec_index, t.slot))
                                         for t in record.tensors})
            writer.end_step(StepRecord(step, 1.0, (loss_scales or {}).get(step, 1.0), False,
                                       ops_recorded=len(records)))
    finally:
        writer.close(complete=True)
    return str(path)


def _step(golden: MemoryDump, target: MemoryDump, step: int, scale: float) -> None:
    """One step of a varied pair: fp16/bf16, NaN/inf, zeros, repeats, modules, leftovers, loss-scaled grads."""
    def both(name, op_type, g_arrays, t_arrays=None, t_dtypes=None, **fields):
        golden.add(name, op_type, g_arrays, step=step, **fields)
        target.add(name, op_type, g_arrays if t_arrays is None else t_arrays, step=step, dtypes=t_dtypes, **fields)

    noise = RNG.standard_normal(X.shape).astype(np.float32)
    both("early", "aten.add", {"input_0": NEAR_ZERO, "output_0": X})  # reads what a later op finds near zero
    both("embed", "Gather", {"input_0": X, "output_0": X * 2})
    both("model/block", "module.Block", {"input_0": X, "output_0": X * 3}, {"input_0": X, "output_0": X * 3 + noise})
    both("fc1", "MatMul", {"input_0": X, "output_0": X * 4}, {"input_0": X, "output_0": X * 4 + 1e-3 * noise},
         t_dtypes={"output_0": "float16"})
    both("fc2", "MatMul", {"input_0": X, "output_0": X * 5}, {"input_0": X, "output_0": X * 5 + 0.5 * noise},
         t_dtypes={"output_0": "bfloat16"})
    overflowed = (X * 6).copy()
    overflowed[0, :2] = [np.inf, np.nan]
    both("act", "Relu", {"input_0": X, "output_0": X * 6}, {"input_0": X, "output_0": overflowed})
    both("act", "Relu", {"input_0": X, "output_0": X}, {"input_0": X, "output_0": np.zeros_like(X)})  # again
    both("model/head", "module.Head", {"input_0": X * 7, "output_0": X}, {"input_0": X * 7 + noise, "output_0": X})
    both("reshape", "Reshape", {"input_0": X, "output_0": X.reshape(8, 4)}, {"input_0": X, "output_0": X.reshape(32)})
    both("stats", "Norm", {"input_0": X, "output_0": X * 8}, {"input_0": X, "output_0": X * 9}, stats_only=True)
    both("rnn", "aten.mkldnn_rnn_layer", {"output_0": X, "output_1": np.arange(16, dtype=np.uint8)},
         {"output_0": X, "output_1": np.arange(16, dtype=np.uint8)[::-1]})
    both("fused", "FusedMatMulAdd", {"input_0": X, "output_0": X}, {"input_0": X, "output_0": X + 0.3 * noise},
         pass_name="MatMulAddFusion", original_names=("mm", "add"), original_types=("MatMul", "Add"),
         output_origins=(("add", 0),), input_origins=(("mm", 0),))
    golden.add("only_golden", "Dropout", {"output_0": X}, step=step)
    target.add("only_target", "Dropout", {"output_0": X}, step=step)
    golden.add("slots", "Split", {"output_0": X, "output_1": X}, step=step)
    target.add("slots", "Split", {"output_0": X, "output_2": X}, step=step)
    both("bias_grad", "aten.sum", {"input_0": TERMS, "output_0": NEAR_ZERO}, direction="backward")
    both("update", "aten.sub", {"input_0": NEAR_ZERO, "output_0": -NEAR_ZERO}, direction="backward")
    grad = RNG.standard_normal(16).astype(np.float32)
    both("mm_grad", "aten.mm", {"input_0": grad, "input_1": X.ravel()[:16], "output_0": grad * 2},
         {"input_0": grad * scale, "input_1": X.ravel()[:16], "output_0": grad * 2 * scale * (1 + 1e-3 * step)},
         direction="backward")


@pytest.fixture
def pair(tmp_path):
    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    for step in range(3):
        _step(golden, target, step, 1024.0)
    return (_save(golden, tmp_path / "golden.h5"),
            _save(target, tmp_path / "target.h5", {step: 1024.0 for step in range(3)}))


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
    """Windows of 3 ops, gathered rows read apart when 2 rows lie between: every case crosses boundaries."""
    monkeypatch.setattr("precision_tool.compare.stream.WINDOW_OPS", 3)
    monkeypatch.setattr("precision_tool.dump.windows.GAP", 2)
    monkeypatch.setattr("precision_tool.compare.stream_index.COLUMN_WINDOW", 5)


@pytest.fixture(autouse=True)
def fallbacks(monkeypatch):
    """Why each streaming comparison stepped aside: a case that expects none asserts that none did."""
    from precision_tool.compare import stream

    found, real = [], stream.stream_compare

    def recorded(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except Exception as exc:
            found.append(type(exc).__name__)
            raise

    monkeypatch.setattr(stream, "stream_compare", recorded)
    yield found
    assert found in ([], ["StreamUnsupported"] * len(found)), found


def _both(run_cli, monkeypatch, tmp_path, *args):
    """The command's stdout, stderr, status and written files, streaming and in memory; asserts they agree."""
    results = []
    for stream in ("1", "0"):
        monkeypatch.setenv("PRECISION_TOOL_STREAM", stream)
        out = tmp_path / f"out-{stream}"
        out.mkdir(parents=True)
        result = run_cli(*[str(a).replace("OUT", str(out)) for a in args])
        files = {p.name: p.read_text() for p in sorted(out.iterdir())}
        results.append((result.status, result.stdout.replace(str(out), "OUT"),
                        result.stderr.replace(str(out), "OUT"), files))
    assert results[0] == results[1]
    return results[0]


@pytest.mark.parametrize("args", [
    (), ("-c", "0.999", "-l", "3"), ("-l", "1"), ("-c", "0.5"), ("--format", "json"), ("--format", "csv", "-l", "50"),
    ("-o", "OUT/table.txt"), ("--format", "json", "-o", "OUT/c.json"), ("--steps", "1-2"), ("--ops", "fc*"),
    ("--jobs", "1"), ("--all",), ("-l", "0"),
])
def test_compare_streams_the_same_output(run_cli, monkeypatch, tmp_path, pair, args, fallbacks):
    status, stdout, _, files = _both(run_cli, monkeypatch, tmp_path, "compare", *pair, *args)
    assert status == 0 and (stdout or files) and not fallbacks


def test_a_selection_of_no_op_is_the_same_error_streaming_or_not(run_cli, monkeypatch, tmp_path, pair, fallbacks):
    status, stdout, stderr, files = _both(run_cli, monkeypatch, tmp_path, "compare", *pair, "--ops", "nothing")
    assert (status, stdout, files) == (2, "", {}) and stderr.endswith("no op in --ops 'nothing': nothing to compare\n")


@pytest.mark.parametrize("args", [
    (), ("--format", "json"), ("--min-cosine", "0.5"), ("--max-abs-err", "0.1"), ("--judge-inputs",),
    ("--steps", "0"), ("--junit", "OUT/j.xml"),
])
def test_check_streams_the_same_output_and_status(run_cli, monkeypatch, tmp_path, pair, args):
    status, _, stderr, _ = _both(run_cli, monkeypatch, tmp_path, "check", *pair, *args)
    assert status == 1 and "check failed" in stderr


def test_check_against_a_baseline_streams_the_same(run_cli, tmp_path, monkeypatch, pair):
    baseline = tmp_path / "baseline.json"
    assert run_cli("baseline", *pair, "-o", baseline).status == 0
    status, stdout, _, _ = _both(run_cli, monkeypatch, tmp_path, "check", *pair, "--baseline", baseline)
    # each run of "act" has its own baseline entry: the second's NaN/inf outputs are the baseline's too (they
    # shared one key, and the pair failed its own baseline: "FAILED | 3 failures in 3 ops of 45 tensors checked")
    assert status == 0 and "PASSED | 45 tensors checked" in stdout


def test_the_shells_vcs_streams_the_same_at_any_threshold_and_limit(run_cli, monkeypatch, tmp_path, pair):
    lines = "vcs; vcs -c 0.999 -l 2; vcs -l 1; vcs -c 0.1; vcs --format json -l 3; check; vcs"
    status, stdout, _, _ = _both(run_cli, monkeypatch, tmp_path, "shell", *pair, "-c", lines)
    assert status == 0 and stdout.count("Flagged ops") == 5


def test_the_shell_keeps_the_streamed_report_until_ac_makes_the_whole_one(pair):
    from precision_tool.compare.comparator import CompareOptions
    from precision_tool.compare.digest import StreamedReport
    from precision_tool.repl.session import ShellSession

    with ShellSession.open(pair) as session:
        first = session.stream(None, 0.98, 10)
        assert isinstance(first, StreamedReport) and session.stream(None, 0.5, 1) is first
        assert session.comparison is first
        assert isinstance(session.stream(CompareOptions(steps=frozenset({1}))), StreamedReport)
        session.compare()
        assert session.stream() is None and session.comparison is not first


def test_dumps_that_agree_stream_the_same(run_cli, monkeypatch, tmp_path, pair):
    status, stdout, _, _ = _both(run_cli, monkeypatch, tmp_path, "check", pair[0], pair[0])
    assert status == 0 and "PASSED" in stdout


def _sources(pair):
    from precision_tool.commands.sources import DumpFiles

    return DumpFiles({"golden": pair[0], "target": pair[1]})


def test_the_streamed_report_is_used_and_keeps_a_few_columns_per_op(pair):
    from precision_tool.commands import handlers
    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.compare.digest import StreamedReport

    full = compare_dumps(*pair)
    with _sources(pair) as source:  # ops not kept are scored again: the dumps stay open
        report = handlers.compare(source, limit=2).report
        assert isinstance(report, StreamedReport)
        assert (report.compared_ops, report.compared_tensors) == (full.compared_ops, full.compared_tensors) == (48, 96)
        assert sorted(report.kept) == [2, 5]  # the two listed; the first is the first flagged module too
        assert report.columns["cosine"].nbytes == 48 * 8 and report.bits.nbytes == 48
        bare = source.stream(None, 0.5, 0)  # nothing listed at 0.5: every op asked for later is scored again
        for threshold in (0.1, 0.9, 0.98, 0.999):
            for streamed in (report, bare):
                assert streamed.summary(threshold) == full.summary(threshold)
                assert streamed.select_flagged(threshold, None) == [op for op in full.ops if op.flagged(threshold)]
        assert full.summary(0.98).first_flagged == full.summary(0.98).first_flagged_module  # asked for twice


def test_dumps_it_cannot_stream_are_compared_in_memory(tmp_path, pair):
    """Fused ops matched through the ops they replaced, statistics-only dumps, --plot and --junit: in memory."""
    from precision_tool.commands import handlers
    from precision_tool.commands.sources import streamed_report
    from precision_tool.compare.report import CompareReport
    from precision_tool.dump.reader import open_dump

    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    golden.add("mm", "MatMul", {"input_0": X, "output_0": X})
    golden.add("add", "Add", {"input_0": X, "output_0": X})
    target.add("mm_add", "FusedMatMulAdd", {"input_0": X, "output_0": X}, pass_name="MatMulAddFusion",
               original_names=("mm", "add"), original_types=("MatMul", "Add"), output_origins=(("add", 0),),
               input_origins=(("mm", 0),))
    fused = (golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5"))
    stats = MemoryDump(mode="stats", role="target")
    stats.add("embed", "Gather", {"input_0": X, "output_0": X}, stats_only=True)
    stats_pair = (pair[0], stats.save(tmp_path / "s.h5"))
    for paths in (fused, stats_pair):
        with open_dump(paths[0]) as g, open_dump(paths[1]) as t:
            assert streamed_report(g, t) is None
    with _sources(pair) as source:
        source.delivery = {"plot": str(tmp_path / "p.svg")}
        assert isinstance(handlers.compare(source).report, CompareReport)
        source.delivery = {"junit": str(tmp_path / "j.xml")}
        assert isinstance(handlers.check(source).report, CompareReport)


def test_a_fused_pair_matched_through_its_origins_shows_the_same(run_cli, monkeypatch, tmp_path, fallbacks):
    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    golden.add("mm", "MatMul", {"input_0": X, "output_0": X * 2})
    golden.add("add", "Add", {"input_0": X * 2, "output_0": X * 3})
    target.add("mm_add", "FusedMatMulAdd", {"input_0": X, "output_0": X * 3.5}, pass_name="MatMulAddFusion",
               original_names=("mm", "add"), original_types=("MatMul", "Add"), output_origins=(("add", 0),),
               input_origins=(("mm", 0),))
    paths = (golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5"))
    status, stdout, _, _ = _both(run_cli, monkeypatch, tmp_path, "compare", *paths)
    assert status == 0 and "covered by fusion" in stdout
    assert fallbacks == ["StreamUnsupported"]


@pytest.mark.parametrize("options", [{}, {"jobs": 1}, {"steps": frozenset({0, 2})}, {"ops": "*grad"}])
def test_every_streamed_op_and_leftover_is_the_in_memory_one(pair, options):
    from precision_tool.compare.comparator import CompareOptions, compare_dumps
    from precision_tool.compare.stream import stream_compare
    from precision_tool.dump.reader import open_dump

    class Every:
        def __init__(self):
            self.ops, self.rows = [], []

        def add(self, op, target_row, golden_row):
            self.ops.append(op)
            self.rows.append((op.step, target_row, golden_row))

    sink = Every()
    with open_dump(pair[0]) as golden, open_dump(pair[1]) as target:
        outcome = stream_compare(golden, target, CompareOptions(**options), sink)
        full = compare_dumps(golden, target, CompareOptions(**options))
        assert repr(sink.ops) == repr(full.ops)  # repr: NaN metrics compare equal as text
        assert repr(outcome.rescore(sink.rows[::-1])) == repr(full.ops[::-1])
    assert (outcome.unmatched_golden, outcome.unmatched_target, outcome.notes, outcome.stats_only) == (
        full.unmatched_golden, full.unmatched_target, full.notes, full.stats_only)


def test_a_long_run_draws_the_same_chart_buckets(run_cli, monkeypatch, tmp_path, fallbacks):
    """More ops than the chart has columns: the streamed chart buckets arrays, the in-memory one lists."""
    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    for step in range(2):
        for i in range(150):
            noise = RNG.standard_normal(X.shape).astype(np.float32) * np.float32(10.0 ** (i % 7 - 6))
            out = np.zeros_like(X) if i % 37 == 5 else X + noise  # an all-zero side now and then: undefined cosine
            golden.add(f"op{i}", "Op", {"input_0": X, "output_0": X}, step=step)
            target.add(f"op{i}", "module.Op" if i % 50 == 7 else "Op", {"input_0": X, "output_0": out}, step=step)
    paths = (golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5"))
    status, stdout, _, _ = _both(run_cli, monkeypatch, tmp_path, "compare", *paths, "-c", "0.99999")
    assert status == 0 and "along execution order: 300 ops" in stdout and not fallbacks


def test_statistics_only_tensors_in_full_dumps_stream_the_same(run_cli, monkeypatch, tmp_path, fallbacks):
    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    for i in range(12):
        golden.add(f"op{i}", "Op", {"input_0": X, "output_0": X * (i + 1)}, stats_only=True)
        target.add(f"op{i}", "Op", {"input_0": X, "output_0": X * (i + 1) * (1 + 0.01 * i)}, stats_only=True)
    paths = (golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5"))
    for args in ((), ("--format", "json")):
        status, stdout, _, _ = _both(run_cli, monkeypatch, tmp_path / str(len(args)), "compare", *paths, *args)
        assert status == 0 and stdout
    assert not fallbacks
