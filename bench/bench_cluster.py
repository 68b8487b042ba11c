"""Benchmark: compare throughput on a Dask cluster as workers are added, against the local path.

Builds a golden/target pair with ``bench_many.build`` (``--ops`` ops of
``--values`` float32 values each; default 2,000 x 100,000 = 800 MB per side,
so scoring, not scheduling, dominates), then for each worker count in
``--workers`` (default 1,2) starts a `distributed.LocalCluster` of that many
single-threaded worker processes, and times `compare_dumps` with
``scheduler=`` its address, after one warm-up call that opens the dumps on
every worker. The local path (``jobs=1`` and the default pool) runs in the
same process between them. Prints seconds, MB/s of tensor bytes scored
(both sides) and the speed-up over one worker, median of ``--repeats``.

On one machine the workers share its cores, disk cache and memory bus with
the client: the ratios show how the work spreads, not what a cluster of
machines with their own disks would do (docs/scaling.md does that on paper).

    python bench/bench_cluster.py [--ops 2000] [--values 100000] [--workers 1,2] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--values", type=int, default=100_000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        return run(args, workdir)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args, workdir: Path) -> int:
    from distributed import LocalCluster

    from bench_many import build
    from precision_tool.compare.comparator import CompareOptions, compare_dumps

    golden, target = build(workdir, args.ops, args.values, None)
    megabytes = 2 * args.ops * args.values * 4 / 1e6

    def timed(options) -> float:
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            compare_dumps(golden, target, options)
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    print(f"{args.ops:,} ops x {args.values:,} float32 values, {megabytes:,.0f} MB scored per compare "
          f"(median of {args.repeats})")
    results = {"local jobs=1": timed(CompareOptions(jobs=1)), "local pool": timed(CompareOptions())}
    for count in (int(n) for n in args.workers.split(",")):
        with LocalCluster(n_workers=count, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            options = CompareOptions(scheduler=cluster.scheduler_address)
            compare_dumps(golden, target, options)  # warm-up: every worker opens the dumps
            results[f"dask {count} worker{'s' * (count > 1)}"] = timed(options)
    one = next((v for k, v in results.items() if k.startswith("dask 1 ")), None)
    for name, seconds in results.items():
        speedup = f"  {one / seconds:.2f}x one worker" if one and name.startswith("dask") else ""
        print(f"{name:16s} {seconds:7.2f} s  {megabytes / seconds:8.0f} MB/s{speedup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
