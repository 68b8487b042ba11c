"""Benchmark: `compare` end to end against merely reading the same datasets with h5py.

Builds a golden and a target dump (float32 tensors of 1-4 Mi elements, the
target slightly perturbed; at least 2 GB together by default) with
`DumpWriter`, warms the page cache, then times, alternating the order:

* ``read``: every tensor dataset of both files read with h5py (``ds[()]``);
* ``compare``: `compare_dumps` (open, index, match, every metric of every
  pair), with ``--jobs`` 1 and 2, each in a fresh interpreter (imports excluded from the time);
* with ``--baseline-tree DIR`` (a source tree of another version, e.g. ``git archive HEAD~1 | tar -x -C DIR``):
  ``baseline`` compare the same way from that tree, for before/after figures from one run on the same dumps,
  and the largest relative difference of any metric between the two versions;

and reports the throughput ratio compare/read (target: >= 0.70), the
peak memory of a compare run in a fresh process (VmHWM) next to the
largest tensor pair and the dump size, and how much two threads of plain
numpy work gain on this machine right then (about 2 when both cores are
free: jobs=2 figures mean little when they are not). The dumps are deleted
afterwards unless --keep is given.

    python bench/bench_compare.py [--gb 2.1] [--dir bench/out] [--repeats 3] [--keep] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = (1 << 20, 2 << 20, 4 << 20)  # elements per tensor, cycled


def build_dumps(directory: Path, total_bytes: float, seed: int = 0) -> tuple[Path, Path, int]:
    """Write golden.h5 and target.h5 holding ``total_bytes`` of float32 tensors together."""
    from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
    from precision_tool.dump.stats import tensor_stats
    from precision_tool.dump.writer import DumpWriter

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    golden_path, target_path = directory / "golden.h5", directory / "target.h5"
    writers = [DumpWriter(golden_path, {"mode": "dump", "role": "golden"}),
               DumpWriter(target_path, {"mode": "dump", "role": "target"})]
    for writer in writers:
        writer.begin_step(0)
    written, index, largest = 0, 0, 0
    while written < total_bytes:
        size = SIZES[index % len(SIZES)]
        golden = rng.standard_normal(size, dtype=np.float32)
        target = golden + np.float32(1e-3) * rng.standard_normal(size, dtype=np.float32)
        for writer, values in zip(writers, (golden, target)):
            tensor = TensorRecord("output_0", "float32", (size,), tensor_stats(values, "float32"))
            record = OpRecord(0, index, f"layer{index}/MatMul", "MatMul", "forward", "float32", False, (tensor,))
            writer.write_op(record, {"output_0": values})
        written += 2 * golden.nbytes
        largest = max(largest, 2 * golden.nbytes)
        index += 1
    for writer in writers:
        writer.end_step(StepRecord(0, 0.0, 1.0, False, ops_recorded=index))
        writer.close(complete=True)
    return golden_path, target_path, largest


def dataset_paths(path: Path) -> list[str]:
    """Every tensor dataset of a dump (those under /steps/*/ops/)."""
    import h5py

    found = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.append(name)
                     if isinstance(obj, h5py.Dataset) and "/ops/" in f"/{name}" else None)
    return found


def read_all(paths: dict[Path, list[str]]) -> int:
    """Read every listed dataset with h5py; return the bytes read."""
    import h5py

    total = 0
    for path, names in paths.items():
        with h5py.File(path, "r") as f:
            for name in names:
                total += f[name][()].nbytes
    return total


_METRICS = ("cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "mean_rel_err", "rmse", "rel_euclidean",
            "accumulated_rel_err", "kl_divergence")
# times compare_dumps in a fresh interpreter, from the source tree in argv[1] (or the installed package)
_COMPARE = f"""
import json, sys, time
if sys.argv[1]:
    sys.path.insert(0, sys.argv[1])
import h5py, precision_tool.dump.reader
from precision_tool.compare.comparator import CompareOptions, compare_dumps
start = time.perf_counter()
report = compare_dumps(sys.argv[2], sys.argv[3], CompareOptions(jobs=int(sys.argv[4])))
elapsed = time.perf_counter() - start
assert report.ops and not report.unmatched_golden and not report.unmatched_target
print(json.dumps({{"seconds": elapsed, "metrics": [[getattr(row.metrics, name) for name in {_METRICS!r}]
                                                  for row in report.rows]}}))
"""


def time_compare(golden: Path, target: Path, jobs: int, tree: Path | None = None) -> dict:
    """{seconds, metrics (one list per row)} of compare_dumps with ``jobs``, from ``tree`` if given."""
    args = [sys.executable, "-c", _COMPARE, str(tree or ""), str(golden), str(target), str(jobs)]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def largest_difference(first: list, second: list) -> float:
    """The largest relative difference between two runs' metrics (0 where both are equal or both NaN)."""
    worst = 0.0
    for row_a, row_b in zip(first, second):
        for a, b in zip(row_a, row_b):
            if a != b and not (a != a and b != b):
                worst = max(worst, abs(a - b) / max(abs(a), abs(b)))
    return worst


def parallel_speedup(seconds: float = 0.3) -> float:
    """How much two threads of GIL-free numpy work gain over one right now (2: both cores are free)."""
    import threading

    a = np.ones(1 << 17)

    def work(reps: int) -> None:
        t = np.empty_like(a)
        for _ in range(reps):
            np.multiply(a, a, out=t)

    def timed(threads: int, reps: int) -> float:
        workers = [threading.Thread(target=work, args=(reps,)) for _ in range(threads)]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - start

    reps = max(1, int(seconds / max(timed(1, 50) / 50, 1e-9)))
    return 2 * min(timed(1, reps) for _ in range(3)) / min(timed(2, reps) for _ in range(3))


# VmHWM of the process itself: ru_maxrss would carry the forking parent's high-water mark across exec
_HWM = ("print(next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM')))")


def peak_rss_of_compare(golden: Path, target: Path, jobs: int, tree: Path | None = None) -> int:
    """Peak resident memory (bytes) of `precision-tool compare` in a fresh process."""
    code = ((f"import sys; sys.path.insert(0, {str(tree)!r}); " if tree else "import sys; ")
            + "from precision_tool.cli.main import main; "
            f"status = main(['compare', {str(golden)!r}, {str(target)!r}, '--jobs', '{jobs}', '--format', 'json', "
            "'-o', '/dev/null']); "
            f"{_HWM}; sys.exit(status)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) * 1024


def baseline_rss() -> int:
    code = f"import precision_tool.cli.main, numpy, h5py, rich; {_HWM}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) * 1024


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.1, help="size of the two dumps together, in GB")
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the dumps")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--baseline-tree", type=Path, help="also time compare from this source tree (before/after)")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()[0]
    speedup_before = parallel_speedup()
    start = time.perf_counter()
    golden, target, largest_pair = build_dumps(args.dir, args.gb * 1e9)
    build_s = time.perf_counter() - start
    trees = {"compare": None, **({"baseline": args.baseline_tree.resolve()} if args.baseline_tree else {})}
    try:
        paths = {golden: dataset_paths(golden), target: dataset_paths(target)}
        data_bytes = read_all(paths)  # warm the page cache
        read_all(paths)
        times: dict[str, list[float]] = {"read": []}
        times.update({f"{tree} jobs={jobs}": [] for tree in trees for jobs in (1, 2)})
        metrics: dict[str, list] = {}
        for repeat in range(args.repeats):
            order = list(times) if repeat % 2 == 0 else list(reversed(times))
            for name in order:
                gc.collect()
                if name == "read":
                    t0 = time.perf_counter()
                    read_all(paths)
                    times[name].append(time.perf_counter() - t0)
                else:
                    run = time_compare(golden, target, int(name[-1]), trees[name.split()[0]])
                    times[name].append(run["seconds"])
                    metrics[name] = run["metrics"]
        best = {name: min(values) for name, values in times.items()}
        figures = {
            "data_gb": data_bytes / 1e9,
            "file_gb": (golden.stat().st_size + target.stat().st_size) / 1e9,
            "build_s": build_s,
            "cpus": os.cpu_count(),
            "load_average": [load_before, os.getloadavg()[0]],
            "two_thread_speedup": [speedup_before, parallel_speedup()],
            "best_s": best,
            "throughput_gb_s": {name: data_bytes / 1e9 / s for name, s in best.items()},
            "ratio": {name: best["read"] / s for name, s in best.items() if name != "read"},
            "largest_pair_mb": largest_pair / 1e6,
            "peak_rss_mb": {f"{tree} jobs={j}": peak_rss_of_compare(golden, target, j, path) / 1e6
                            for tree, path in trees.items() for j in (1, 2)},
            "import_rss_mb": baseline_rss() / 1e6,
            "kernel": _kernel_in_use(),
            "jobs_agree": largest_difference(metrics["compare jobs=1"], metrics["compare jobs=2"]) == 0.0,
        }
        if args.baseline_tree:
            figures["largest_metric_difference_vs_baseline"] = largest_difference(metrics["compare jobs=1"],
                                                                                  metrics["baseline jobs=1"])
    finally:
        if not args.keep:
            for path in (golden, target):
                path.unlink(missing_ok=True)
            if args.dir.exists() and not any(args.dir.iterdir()):
                shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    report(figures, args.repeats)
    return 0


def _kernel_in_use() -> str:
    """Which metric kernel compare runs with here ("c", or "numpy" where the C extension is not built)."""
    from precision_tool.compare.metrics import KERNEL

    return KERNEL


def report(figures: dict, repeats: int) -> None:
    """The figures as text."""
    print(f"dumps: {figures['file_gb']:.2f} GB on disk, {figures['data_gb']:.2f} GB of tensors, "
          f"built in {figures['build_s']:.1f} s; {figures['cpus']} CPUs (load average "
          f"{figures['load_average'][0]:.1f} before, {figures['load_average'][1]:.1f} after; two threads of numpy "
          "work gain {:.2f}x before, {:.2f}x after); best of {}".format(*figures["two_thread_speedup"], repeats))
    for name, seconds in figures["best_s"].items():
        print(f"  {name:<17} {seconds:7.2f} s  {figures['throughput_gb_s'][name]:6.2f} GB/s")
    for name, ratio in figures["ratio"].items():
        verdict = "meets" if ratio >= 0.7 else "misses"
        print(f"  {name} / read throughput: {ratio:.2f} ({verdict} the 0.70 target)")
    print("  peak RSS of a compare process: " + ", ".join(f"{k} {v:.0f} MB" for k, v in figures["peak_rss_mb"].items())
          + f" (imports alone {figures['import_rss_mb']:.0f} MB; largest tensor pair "
            f"{figures['largest_pair_mb']:.0f} MB; dumps {figures['file_gb'] * 1e3:.0f} MB)")
    print(f"  metric kernel: {figures['kernel']}; jobs=1 and jobs=2 give identical metrics: {figures['jobs_agree']}")
    if "largest_metric_difference_vs_baseline" in figures:
        print(f"  largest relative difference of any metric from the baseline tree: "
              f"{figures['largest_metric_difference_vs_baseline']:.1e}")


if __name__ == "__main__":
    sys.exit(main())
