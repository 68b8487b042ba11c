"""Benchmark: many small tensors. `compare`, `check` and `vcs` against reading the same bytes with numpy.

Builds a golden and a target dump of ``--ops`` ops (default 20,000), one
float32 tensor of ``--values`` values (default 1,000) each, the target
slightly perturbed, twice: packed (schema 2, the default writer) and with one
HDF5 dataset per tensor (``DumpWriter(pack_limit=-1)``, the layout of schema
1). Then, alternating the order over ``--repeats`` rounds, each in a fresh
interpreter:

* ``floor``: the same tensor bytes read with numpy from one flat file per
  side, tensor by tensor (``np.fromfile(f, count=...)``): what reading the
  bytes costs without any dump format;
* ``read/datasets``: every tensor dataset of the per-dataset pair opened and
  read with h5py;
* ``compare``: `compare_dumps` on the packed pair and on the per-dataset pair
  (imports excluded), with its peak memory (VmHWM);
* the CLI end to end on the packed pair (imports included): ``compare``,
  ``check`` and the shell's ``vcs``.

It prints the medians, compare's ratio to the floor (target: within 2x for
20,000 ops), and the peak resident memory of each CLI run (its own VmHWM,
written at exit). ``--ops 5000,20000,50000`` runs every count in turn and ends
with how each command's peak moves with the number of ops (the slope, KB per
op, of a least-squares line through the medians). ``--tree DIR`` also runs the
CLI commands from another source tree (``git archive REV | tar -x -C DIR``,
with its ``_native*.so``), interleaved with this one's, so before/after ratios
come from one run. The dumps are deleted afterwards unless --keep.

``--json FILE`` writes the medians, spreads and peaks with the date, for the
README's table (`bench/perf_table.py`).

    python bench/bench_many.py [--ops 20000[,50000...]] [--values 1000] [--repeats 3] [--dir DIR] [--keep]
                               [--packed-only] [--tree DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def build(directory: Path, ops: int, values: int, pack_limit: int | None, seed: int = 0) -> tuple[Path, Path]:
    """golden.h5 and target.h5 of ``ops`` ops, one float32 tensor of ``values`` values each."""
    from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
    from precision_tool.dump.stats import tensor_stats
    from precision_tool.dump.writer import DumpWriter

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "golden.h5", directory / "target.h5"
    options = {} if pack_limit is None else {"pack_limit": pack_limit}
    writers = [DumpWriter(paths[0], {"mode": "dump", "role": "golden"}, **options),
               DumpWriter(paths[1], {"mode": "dump", "role": "target"}, **options)]
    flats = [open(directory / "golden.bin", "wb"), open(directory / "target.bin", "wb")]
    for writer in writers:
        writer.begin_step(0)
    for index in range(ops):
        golden = rng.standard_normal(values, dtype=np.float32)
        target = golden + np.float32(1e-3) * rng.standard_normal(values, dtype=np.float32)
        for writer, flat, array in zip(writers, flats, (golden, target)):
            tensor = TensorRecord("output_0", "float32", (values,), tensor_stats(array, "float32"))
            writer.write_op(OpRecord(0, index, f"layer{index}/MatMul", "MatMul", "forward", "float32", False,
                                     (tensor,)), {"output_0": array})
            flat.write(array.tobytes())
    for writer, flat in zip(writers, flats):
        writer.end_step(StepRecord(0, 0.0, 1.0, False, ops_recorded=ops))
        writer.close(complete=True)
        flat.close()
    return paths


_FLOOR = """
import sys, time, numpy as np
ops, values = int(sys.argv[2]), int(sys.argv[3])
start = time.perf_counter()
for name in ("golden.bin", "target.bin"):
    with open(sys.argv[1] + "/" + name, "rb") as f:
        for _ in range(ops):
            np.fromfile(f, dtype=np.float32, count=values)
print(time.perf_counter() - start)
"""

_READ = """
import sys, time, h5py
start = time.perf_counter()
for name in ("golden.h5", "target.h5"):
    with h5py.File(sys.argv[1] + "/" + name, "r") as f:
        ops = f["steps/000000/ops"]
        for group in ops:
            ops[group]["output_0"][()]
print(time.perf_counter() - start)
"""

_COMPARE = """
import sys, time
from precision_tool.compare.comparator import CompareOptions, compare_dumps
start = time.perf_counter()
report = compare_dumps(sys.argv[1] + "/golden.h5", sys.argv[1] + "/target.h5", CompareOptions())
elapsed = time.perf_counter() - start
assert len(report.rows) == int(sys.argv[2])
peak = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")]
print(elapsed, peak[0] if peak else "nan")
"""


def python(code: str, *args) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True)
    return out.stdout.split()


_CLI = """
import atexit, os, runpy, sys

def peak():  # this process's own high-water mark: a fork's pages before exec are not counted
    with open("/proc/self/status") as status, open(os.environ["BENCH_PEAK_FILE"], "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM")))

atexit.register(peak)
sys.argv = ["precision-tool", *sys.argv[1:]]
runpy.run_module("precision_tool", run_name="__main__", alter_sys=True)
"""


def cli(*args, tree: Path | None = None) -> tuple[float, float]:
    """Seconds and peak resident KB (VmHWM) of one precision-tool command, imports included; output discarded.

    ``tree``: run another source tree's package (its directory first on the path).
    """
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        env["BENCH_PEAK_FILE"] = peak.name
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _CLI, *map(str, args)], cwd=tree, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - start
        if done.returncode not in (0, 1):
            raise SystemExit(f"precision-tool {' '.join(map(str, args))} failed: {done.stderr.strip()}")
        return elapsed, float(peak.read() or "nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="20000", help="op count, or several separated by commas")
    parser.add_argument("--values", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--packed-only", action="store_true",
                        help="leave out the one-dataset-per-tensor pair (its build and compare take minutes)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="another source tree whose CLI runs interleaved with this one's (before/after)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure, with the date, here")
    args = parser.parse_args()
    counts = [int(n) for n in str(args.ops).split(",")]
    documents = [run_count(args, ops) for ops in counts]
    if len(counts) > 1:
        print_slopes(documents)
    if args.json is not None:
        payload = documents[0] if len(documents) == 1 else {"runs": documents}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")


def run_count(args, ops: int) -> dict:
    """Build the pairs of ``ops`` ops, time every job ``--repeats`` times, print and return the medians."""
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench_many_"))
    root = root / str(ops)
    packed, datasets = root / "packed", root / "datasets"
    started = time.perf_counter()
    build(packed, ops, args.values, None)
    built_packed = time.perf_counter() - started
    started = time.perf_counter()
    if not args.packed_only:
        build(datasets, ops, args.values, -1)
    built_datasets = time.perf_counter() - started
    size = sum((packed / n).stat().st_size for n in ("golden.h5", "target.h5"))
    print(f"\n{ops:,d} ops x {args.values:,d} float32, two dumps of {size / 1e6:.0f} MB; written in "
          f"{built_packed:.1f} s packed" + ("" if args.packed_only else
                                            f", {built_datasets:.1f} s one dataset per tensor (with the flat files)"))
    times: dict[str, list[float]] = {}
    peaks: dict[str, list[float]] = {}
    pair = (packed / "golden.h5", packed / "target.h5")
    commands = {"compare": ("compare", *pair), "check": ("check", *pair), "vcs": ("shell", *pair, "-c", "vcs")}
    trees = {"": None} if args.tree is None else {"": None, "before ": args.tree.resolve()}

    def timed_cli(name, command, tree):
        seconds, peak = cli(*command, tree=tree)
        peaks.setdefault(name, []).append(peak)
        return seconds

    try:
        for round_ in range(args.repeats):
            jobs = [("floor", lambda: float(python(_FLOOR, packed, ops, args.values)[0])),
                    ("read/datasets", lambda: float(python(_READ, datasets)[0])),
                    ("compare/packed", lambda: _compare(packed, ops, peaks, "compare/packed")),
                    ("compare/datasets", lambda: _compare(datasets, ops, peaks, "compare/datasets"))]
            for label, tree in trees.items():
                for command, argv in commands.items():
                    name = f"{label}cli {command}"
                    jobs.append((name, lambda name=name, argv=argv, tree=tree: timed_cli(name, argv, tree)))
            if args.packed_only:
                jobs = [job for job in jobs if not job[0].endswith("datasets")]
            if round_ % 2:
                jobs.reverse()
            for name, job in jobs:
                times.setdefault(name, []).append(job())
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    floor = median["floor"]
    print(f"\n{'':<20}{'median s':>10}{'spread':>9}{'/ floor':>9}{'peak MB':>9}")
    for name, values in times.items():
        peak = f"{statistics.median(peaks[name]) / 1024:>9.0f}" if name in peaks else ""
        print(f"{name:<20}{median[name]:>10.2f}{max(values) - min(values):>9.2f}{median[name] / floor:>9.1f}{peak}")
    if args.tree is not None:
        for command in commands:
            now, before = f"cli {command}", f"before cli {command}"
            print(f"{command}: {median[now] / median[before]:.2f}x the time, "
                  f"{statistics.median(peaks[now]) / statistics.median(peaks[before]):.2f}x the peak of {args.tree}")
    document = {"date": datetime.date.today().isoformat(), "ops": ops, "values": args.values,
                "repeats": args.repeats, "median_s": median,
                "spread_s": {k: max(v) - min(v) for k, v in times.items()},
                "peak_kb": {k: statistics.median(v) for k, v in peaks.items()}}
    print(json.dumps(document))
    return document


def print_slopes(documents: list[dict]) -> None:
    """Each job's median peak at every op count, and the least-squares slope in KB per op."""
    counts = [d["ops"] for d in documents]
    print(f"\n{'peak MB':<20}" + "".join(f"{n:>10,d}" for n in counts) + f"{'KB/op':>10}")
    for name in documents[0]["peak_kb"]:
        peaks = [d["peak_kb"][name] for d in documents]
        slope = float(np.polyfit(counts, peaks, 1)[0])
        print(f"{name:<20}" + "".join(f"{p / 1024:>10.0f}" for p in peaks) + f"{slope:>10.3f}")


def _compare(folder: Path, ops: int, peaks: dict, name: str) -> float:
    seconds, peak = python(_COMPARE, folder, ops)
    peaks.setdefault(name, []).append(float(peak))
    return float(seconds)


if __name__ == "__main__":
    main()
