"""Benchmark: the cost of `precision_tool.torch` on the transformer example's training step.

Times one training step of ``examples/torch_transformer.py`` (forward,
backward, SGD with momentum) in one process, in rounds that alternate the
configurations so drift on a shared machine hits them alike:

* ``plain``: no instrumentation;
* ``dispatch-floor``: a TorchDispatchMode that only calls each op, the cost
  of intercepting aten ops from Python at all;
* ``stats``: inside ``dump(mode="stats")`` (target: at most 2x plain);
* ``overflow``: inside ``dump(mode="overflow")`` of the golden run;
* ``simulate``: inside ``simulate_npu("allow_mix_precision")`` (for information);
* ``simulate+stats``: both.

Each configuration runs ``--steps`` steps after two warm-up steps; the figure is
the median step time, the best of ``--rounds`` rounds. Sizes: ``small`` is
the example's default (batch 16, sequence 32, d_model 64: ~380 aten ops a
step over tensors of a few thousand values, where the per-op cost of
Python dominates: intercepting ops at all costs ``dispatch-floor``),
``medium`` and ``large`` grow the model toward realistic sizes.

    python bench/bench_torch.py [--size small medium large] [--steps 6] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import precision_tool.torch as ptt

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "small": {"batch": 16, "seq": 32, "d_model": 64},
    "medium": {"batch": 32, "seq": 64, "d_model": 256},
    "large": {"batch": 32, "seq": 128, "d_model": 512},
}


def load_example():
    spec = importlib.util.spec_from_file_location("torch_transformer", ROOT / "examples" / "torch_transformer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def configurations(folder: Path) -> dict:
    return {
        "plain": contextlib.nullcontext,
        "dispatch-floor": _PassThrough,
        "stats": lambda: ptt.dump(folder / "stats.h5", mode="stats"),
        "overflow": lambda: ptt.dump(folder / "overflow.h5", mode="overflow"),
        "simulate": lambda: ptt.simulate_npu("allow_mix_precision"),
        "simulate+stats": lambda: _both(folder),
    }


class _PassThrough(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # as precision_tool.torch's mode: no dynamo wrapper per op
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _both(folder: Path):
    with ptt.simulate_npu("allow_mix_precision"), ptt.dump(folder / "sim_stats.h5", mode="stats"):
        yield


def time_steps(example, sizes: dict, context, steps: int) -> float:
    """Median seconds per training step inside ``context()``, after two warm-up steps."""
    run = example.make_run(0, **sizes)
    times = []
    with context():
        for _ in range(steps + 2):
            start = time.perf_counter()
            example.train_step(*run)
            times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def count_ops(example, sizes: dict) -> int:
    """Aten ops recorded in a step after the first (which has no momentum buffers yet)."""
    run = example.make_run(0, **sizes)
    with tempfile.TemporaryDirectory() as folder, ptt.dump(Path(folder) / "count.h5", mode="stats") as dump:
        example.train_step(*run)
        ptt.step()
        first = dump.ops_recorded
        example.train_step(*run)
        ptt.step()
        return dump.ops_recorded - first


def bench(size: str, steps: int, rounds: int) -> dict:
    example = load_example()
    sizes = SIZES[size]
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        configs = configurations(Path(folder))
        for round_index in range(rounds):
            names = list(configs) if round_index % 2 == 0 else list(reversed(configs))
            for name in names:
                seconds = time_steps(example, sizes, configs[name], steps)
                best[name] = min(best.get(name, float("inf")), seconds)
    plain = best["plain"]
    return {
        "size": size, **sizes, "ops_per_step": count_ops(example, sizes), "threads": torch.get_num_threads(),
        "step_ms": {name: round(seconds * 1e3, 2) for name, seconds in best.items()},
        "ratio": {name: round(seconds / plain, 2) for name, seconds in best.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs="+", choices=list(SIZES), default=["small", "medium"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    results = [bench(size, args.steps, args.rounds) for size in args.size]
    for result in results:
        print(f"{result['size']}: batch {result['batch']}, seq {result['seq']}, d_model {result['d_model']}, "
              f"{result['ops_per_step']} ops recorded per step, {result['threads']} threads")
        for name, ms in result["step_ms"].items():
            target = "  (target <= 2x)" if name == "stats" else ""
            print(f"  {name:<15} {ms:9.2f} ms/step  {result['ratio'][name]:5.2f}x{target}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
