"""Real msprobe dumps (mindstudio-probe 26.2.0, CPU PyTorch): we name the planted op, as msprobe's compare does.

`msprobe_real_run.py` dumps a tiny MLP twice per task (tensor, statistics):
golden, and a target whose gelu returns 1.25 times its value. The bug keeps
gelu's output perfectly correlated with golden's (cosine 1.0), so a
cosine-only ranking misses it; msprobe's compare flags it through its
one-thousandth-error-ratio rule (``../shared/reference/MSPROBE.md`` 3.3.5),
and that row is its only error. We ask that `diagnose` names the same op as
the culprit (kernel_bug) on tensor dumps, and that the statistics comparison
flags it first on statistics dumps, where msprobe only warns about it and
calls an op after it the error. Skipped without msprobe or torch.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # four msprobe processes: ~30 s of CPU, ~15 s on two idle cores
pytest.importorskip("torch")
pytest.importorskip("msprobe")

from precision_tool.analysis.diagnose import diagnose  # noqa: E402
from precision_tool.compare.comparator import compare_dumps  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402

PLANTED = "Functional.gelu.0.forward"
SCRIPT = Path(__file__).with_name("msprobe_real_run.py")


def _run_all(commands: list[list], cwd: Path) -> None:
    """Run the commands side by side (each costs ~4 s of imports); fail with the first one's output."""
    processes = [subprocess.Popen([str(c) for c in command], cwd=cwd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT) for command in commands]
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    for command, process, output in zip(commands, processes, outputs):
        assert process.returncode == 0, f"{command}:\n{output.decode(errors='replace')[-3000:]}"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("msprobe")
    runs = {(task, run): root / f"{run}_{task}" for task in ("tensor", "statistics") for run in ("golden", "target")}
    commands = []
    for (task, run), path in runs.items():
        compare = [runs[(task, "golden")], root / f"msprobe_{task}"] if run == "target" else []
        commands.append([sys.executable, SCRIPT, path, task, run, *compare])
    _run_all(commands, root)
    return runs, root


def _msprobe_results(folder: Path) -> list[tuple[str, str]]:
    """(API, result) of every API msprobe's compare marks warning or error, in its row order (worst result)."""
    (result,) = folder.glob("compare_result_*.csv")
    with open(result, newline="") as handle:
        rows = list(csv.DictReader(handle))
    found: dict[str, str] = {}
    for row in rows:
        api = row["NPU Name"].split(".input.")[0].split(".output.")[0].split(".parameters.")[0]
        if row["Result"] in ("warning", "error") and found.get(api) != "error":
            found[api] = row["Result"]
    return list(found.items())


def test_the_layout_reads_as_msprobe_wrote_it(dumps):
    runs, _ = dumps
    with open_dump(runs[("tensor", "golden")]) as dump:
        assert dump.step_numbers() == [0, 1]
        names = [r.name for r in dump.ops(step=0)]
        assert names[:3] == ["Functional.linear.0.forward", "Module.fc1.Linear.forward.0", "Torch.relu.0.forward"]
        assert dump.op(0, "Module.fc2.Linear.forward.0").is_module
        assert dump.op(0, "Functional.gelu.0.backward", "backward").outputs[0].has_data
        assert {r.direction for r in dump.ops(step=0)} == {"forward", "backward", "optimizer"}


def test_diagnose_names_the_planted_op_like_msprobe_compare(dumps):
    runs, root = dumps
    assert _msprobe_results(root / "msprobe_tensor") == [(PLANTED, "error")]  # msprobe's own verdict on this pair
    with open_dump(runs[("tensor", "golden")]) as golden, open_dump(runs[("tensor", "target")]) as target:
        result = diagnose(golden, target)
        report = compare_dumps(golden, target)
    assert (result.verdict.cls, result.verdict.op, result.verdict.step) == ("kernel_bug", PLANTED, 0)
    row = next(r for r in report.rows if (r.op, r.tensor, r.step) == (PLANTED, "output_0", 0))
    assert row.metrics.cosine == pytest.approx(1.0, abs=1e-6)  # why cosine alone cannot find it
    assert row.metrics.rel_euclidean == pytest.approx(0.25, rel=1e-5)


def test_statistics_dumps_flag_the_planted_op_first(dumps, run_cli):
    runs, root = dumps
    # msprobe only warns at the planted op (its output's norm error is 10x its input's) and calls the gelu
    # backward after it the error; we flag the planted op first
    assert _msprobe_results(root / "msprobe_statistics")[0] == (PLANTED, "warning")
    assert ("Functional.gelu.0.backward", "error") in _msprobe_results(root / "msprobe_statistics")
    report = compare_dumps(runs[("statistics", "golden")], runs[("statistics", "target")])
    assert report.stats_only and report.summary(0.98).first_flagged.name == PLANTED
    result = run_cli("compare", runs[("statistics", "golden")], runs[("statistics", "target")])
    assert result.status == 0 and f"first flagged: step 0 #5 {PLANTED}" in " ".join(result.stdout.split())
