"""Benchmark: where module-level statistics capture spends its time, on bench_real's models, in one process.

Each round trains the model plain, then under each configuration below for the same steps, alternating
their order from round to round; it prints the median CPU time of each as a ratio to the plain step (torch
on one thread):

* ``floor``: bench_real's ``module floor`` (the module hooks and gradient hooks, doing nothing);
* ``recorder floor``: bench_real's ``module recorder floor`` (the same hooks doing the least a module-level
  statistics capture must: statistics looked up by object or computed in C, a row kept; no names, no
  checks, no file);
* ``module``: ``precision_tool.torch.dump(path, "stats", level="module")``;
* ``no gradients``: the same with no module call's boundary gradients hooked (no backward records);
* ``no commit``: the same with no HDF5 flush and no commit at the end of a step (the step's metadata
  reaches the file when it closes).

The two last are not configurations a user can choose: the differences to ``module`` are what the
backward records and the per-step commit cost.

    python bench/bench_module_parts.py [--models gpt2,lstm] [--rounds 11] [--steps 30] [--size small]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_real  # noqa: E402

CONFIGS = ("floor", "recorder floor", "module", "no gradients", "no commit")


def _measure(model: str, size: str, rounds: int, steps: int, folder: Path) -> dict:
    import h5py
    import torch

    import precision_tool.torch as ptt
    from precision_tool.dump import guarded
    from precision_tool.torch import modules

    torch.set_num_threads(1)
    make, dnn = bench_real._builder(bench_real.MODELS[model], size)
    run = make()

    def loop(n: int) -> float:
        start = time.process_time()
        for _ in range(n):
            loss = run.loss(run.model, run.batch)
            run.optimizer.zero_grad()
            loss.backward()
            run.optimizer.step()
            ptt.step(loss)
        return (time.process_time() - start) / n

    @contextlib.contextmanager
    def configured(name: str):
        saved = h5py.File.flush, guarded.GuardedFile.commit, modules.ModuleGradients.watch
        try:
            if name == "floor":
                with bench_real._ModuleFloor():
                    yield
                return
            if name == "recorder floor":
                with bench_real._ModuleRecorderFloor():
                    yield
                return
            if name == "no commit":
                h5py.File.flush = guarded.GuardedFile.commit = lambda self: None
            elif name == "no gradients":
                modules.ModuleGradients.watch = lambda *args, **kwargs: None
            with ptt.dump(folder / f"{name.replace(' ', '_')}.h5", "stats", level="module"):
                yield
        finally:
            h5py.File.flush, guarded.GuardedFile.commit, modules.ModuleGradients.watch = saved

    times: dict[str, list[float]] = {"plain": [], **{name: [] for name in CONFIGS}}
    with dnn:
        loop(5)  # warm-up: first-call costs of torch and the model
        for round_ in range(rounds):
            times["plain"].append(loop(steps))
            for name in CONFIGS if round_ % 2 else CONFIGS[::-1]:
                with configured(name):
                    loop(3)
                    times[name].append(loop(steps))
    plain = statistics.median(times["plain"])
    return {"plain_ms": round(plain * 1e3, 2),
            **{name: round(statistics.median(times[name]) / plain, 3) for name in CONFIGS}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(bench_real.MODELS))
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    bench_real._case(bench_real.MODELS["gpt2"])  # the suite's models on the path, transformers quiet
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            row = _measure(model, args.size, args.rounds, args.steps, Path(folder))
            print(json.dumps({"model": model, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
