"""Collector and dump-writer benchmarks, measured as ratios in one run.

    python bench/bench_dump.py [--steps N] [--repeats R] [--model transformer] [--dir DIR]

1. Full dump write speed: the op events of real training steps (captured
   once, in memory) written by the collector in ``dump`` mode (statistics,
   float16 conversion, op groups, index, commit) against raw h5py writes of
   the same arrays, one dataset per array slot, already in their stored dtype
   (``create_dataset(name, data=array)``; the conversion is not timed for
   raw). Speeds are of the tensor bytes of every slot; the collector stores
   an array that fills several slots of a step once and hard-links the rest
   (the raw side writes every slot). Target: >= 50 %.
2. ``stats`` mode against the un-instrumented training step. Target: <= 1.5x.
3. ``overflow`` mode when nothing overflows against the un-instrumented step.
   Target: <= 1.2x.

   Both per step: the median step time after two warm-up steps (a step runs
   from its first ``on_step_begin`` hook to its last ``on_step_end``, the
   collector's commit included), against the same for the plain run. The
   whole ``--steps``-step run's ratio, which also counts creating the dump
   and writing its metadata, is printed beside it.

Each figure is the best of ``repeats`` interleaved runs (noise only ever adds
time), the two sides of a ratio measured alternately. Ratios are of process
CPU time (user + system: the writes land in the page cache, so they are CPU
work), which other jobs on a shared machine disturb far less than wall-clock
time; wall-clock ratios are printed alongside.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from precision_tool.collect import Collector
from precision_tool.dump.storage import to_storage
from precision_tool.engine.device import golden, npu
from precision_tool.engine.hooks import OpEvent, StepResult
from precision_tool.session import Session, SessionConfig


class Capture:
    """A hook that keeps every op event and step result of a run."""

    def __init__(self) -> None:
        self.metadata: dict = {}
        self.steps: list[tuple[int, list[OpEvent], StepResult]] = []

    def on_run_begin(self, metadata: dict) -> None:
        self.metadata = metadata

    def on_step_begin(self, step: int) -> None:
        self.steps.append((step, [], None))

    def after_op(self, event: OpEvent) -> None:
        self.steps[-1][1].append(event)

    def on_step_end(self, result: StepResult) -> None:
        step, events, _ = self.steps[-1]
        self.steps[-1] = (step, events, result)


def capture(model: str, device, steps: int) -> Capture:
    hook = Capture()
    Session(SessionConfig(model=model, steps=steps, device=device), hooks=[hook]).run()
    return hook


def stored_arrays(run: Capture) -> list[np.ndarray]:
    """Every tensor of every event, in its stored dtype (what the dump file holds)."""
    arrays = []
    for _, events, _ in run.steps:
        for event in events:
            for values, dtypes in ((event.inputs, event.input_dtypes), (event.outputs, event.output_dtypes)):
                for array, dtype in zip(values, dtypes):
                    if array is not None:
                        arrays.append(to_storage(array, dtype))
    return arrays


class Clock:
    """CPU and wall-clock seconds of a block."""

    def __enter__(self) -> "Clock":
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.cpu = time.process_time() - self._cpu
        self.wall = time.perf_counter() - self._wall


def unique_tensors(run: Capture) -> int:
    """Distinct array objects per step, summed over steps."""
    total = 0
    for _, events, _ in run.steps:
        seen = {id(a) for e in events for a in (*e.inputs, *e.outputs) if a is not None}
        total += len(seen)
    return total


def time_raw(path: Path, arrays: list[np.ndarray]) -> Clock:
    with Clock() as clock:
        with h5py.File(path, "w") as f:
            for i, array in enumerate(arrays):
                f.create_dataset(f"t{i:07d}", data=array)
    path.unlink()
    return clock


def time_collector(path: Path, run: Capture, mode: str) -> Clock:
    with Clock() as clock:
        collector = Collector(path, mode, command="bench")
        collector.on_run_begin(run.metadata)
        for step, events, result in run.steps:
            collector.on_step_begin(step)
            for event in events:
                collector.after_op(event)
            collector.on_step_end(result)
        collector.on_run_end({"accelerate_switch_step": None})
    path.unlink()
    return clock


class StepClock:
    """Process CPU time of each training step: ``start`` is registered before every other hook, ``stop`` after.

    A step's time runs from the first ``on_step_begin`` to the last
    ``on_step_end``: the collector's commit of the step is in it, the run's
    setup (creating the dump, its metadata) and close are not.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._begin = 0.0
        clock = self

        class Start:
            def on_step_begin(self, step: int) -> None:
                clock._begin = time.process_time()

        class Stop:
            def on_step_end(self, result) -> None:
                clock.times.append(time.process_time() - clock._begin)

        self.start, self.stop = Start(), Stop()

    def per_step(self, warmup: int = 2) -> float:
        """The median step time after ``warmup`` steps (the first build the step's tables)."""
        return statistics.median(self.times[warmup:] or self.times)


def time_session(model: str, device, steps: int, path: Path | None, mode: str | None) -> tuple[Clock, float]:
    """Time of ``Session.run()`` (model building excluded) and its median step time, with a collector when
    ``mode`` is given."""
    collector = Collector(path, mode, command="bench") if mode else None
    steps_clock = StepClock()
    session = Session(SessionConfig(model=model, steps=steps, device=device),
                      hooks=[steps_clock.start, *([collector] if collector else []), steps_clock.stop])
    with Clock() as clock:
        session.run()
    if path is not None and path.exists():
        path.unlink()
    return clock, steps_clock.per_step()


def settle() -> None:
    """Let the kernel write back the write benchmark's gigabyte of dirty pages before timing steps.

    Background writeback competes for the two CPUs and the memory bus; left
    running, it slowed the overhead runs after it by up to 10 %.
    """
    if hasattr(os, "sync"):
        os.sync()
    time.sleep(1.0)


def best(clocks: list[Clock]) -> tuple[float, float]:
    """(best CPU seconds, best wall seconds)."""
    return min(c.cpu for c in clocks), min(c.wall for c in clocks)


def bench_write(workdir: Path, model: str, device_name: str, steps: int, repeats: int) -> float:
    device = npu() if device_name == "npu" else golden()
    run = capture(model, device, steps)
    arrays = stored_arrays(run)
    mbytes = sum(a.nbytes for a in arrays) / 1e6
    raw, ours = [], []
    for _ in range(repeats):
        raw.append(time_raw(workdir / "raw.h5", arrays))
        ours.append(time_collector(workdir / "dump.h5", run, "dump"))
    (raw_cpu, raw_wall), (ours_cpu, ours_wall) = best(raw), best(ours)
    ratio = raw_cpu / ours_cpu
    print(f"full dump write, {model} on {device_name}: {len(arrays)} tensors ({unique_tensors(run)} distinct "
          f"arrays; the dump stores each once a step and links the rest), {mbytes:.1f} MB, "
          f"{sum(len(e) for _, e, _ in run.steps)} ops; raw h5py {mbytes / raw_cpu:.0f} MB/s, "
          f"collector {mbytes / ours_cpu:.0f} MB/s -> {ratio:.0%} of raw (target >= 50%; "
          f"wall clock {raw_wall / ours_wall:.0%})")
    return ratio


def bench_overhead(workdir: Path, model: str, device_name: str, steps: int, repeats: int, mode: str,
                   target: float) -> float:
    """The ratio of a training step with the collector in ``mode`` to the plain step.

    The figure held against the target is per step (the median step after two,
    best of ``repeats``): the cost a training loop pays each step. The whole
    run's ratio, which also counts creating the dump and writing its metadata
    once per run (about 3 ms), is printed beside it.
    """
    device = npu() if device_name == "npu" else golden()
    time_session(model, device, 1, None, None)  # warm caches and imports
    plain, hooked = [], []
    for _ in range(repeats):
        plain.append(time_session(model, device, steps, None, None))
        hooked.append(time_session(model, device, steps, workdir / f"{mode}.h5", mode))
    plain_step, hooked_step = min(s for _, s in plain), min(s for _, s in hooked)
    (plain_cpu, plain_wall), (hooked_cpu, hooked_wall) = best([c for c, _ in plain]), best([c for c, _ in hooked])
    ratio = hooked_step / plain_step
    print(f"{mode} mode, {model} on {device_name}: plain {plain_step * 1e3:.1f} ms/step, with collector "
          f"{hooked_step * 1e3:.1f} ms/step -> {ratio:.2f}x (target <= {target}x); whole {steps}-step run, "
          f"the dump's setup included: {hooked_cpu / plain_cpu:.2f}x (wall clock {hooked_wall / plain_wall:.2f}x)")
    return ratio


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write the scratch files (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        workdir = Path(tmp)
        print(f"# {sys.version.split()[0]}, h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}, "
              f"numpy {np.__version__}, {os.cpu_count()} CPUs, scratch {workdir}")
        ok = True
        for device in ("npu", "golden"):
            ok &= bench_write(workdir, args.model, device, args.steps, args.repeats) >= 0.5
        settle()
        for device in ("npu", "golden"):
            ok &= bench_overhead(workdir, args.model, device, args.steps, args.repeats, "stats", 1.5) <= 1.5
            ok &= bench_overhead(workdir, args.model, device, args.steps, args.repeats, "overflow", 1.2) <= 1.2
        print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
