"""Benchmark: what an aten-level capture in C++ would cost, against the Python dispatch mode's floor.

Issue 17 asks for aten-level statistics at 2.5x a plain step or less, and
ahead of msprobe on every model. Every aten-level configuration of
``bench_real.py`` intercepts ops with a Python ``TorchDispatchMode``, whose
own cost (``noop mode``: the mode doing nothing) is 2-4x a tiny model's step
before anything is recorded. This measures the alternative the issue names,
a hook in C++: ``bench/native/recorder_floor.cpp``, a RecordFunction
observer (the profiler's hook) that records the ops a dispatch mode sees,
each one's float inputs' statistics looked up and its outputs' computed in
C++, with no names, module paths or file: the floor of a native recorder,
as ``recorder floor`` is the floor of one in Python.

Per model, interleaved rounds (the order rotates), CPU time, torch on one
thread, the median of each configuration as a ratio to ``plain``:

* ``noop mode``: an empty TorchDispatchMode (bench_real's);
* ``recorder floor``: bench_real's least Python dispatch-mode recorder;
* ``native floor``: the C++ observer above;
* ``stats``: ``precision_tool.torch.dump(path, "stats")``, for scale.

It also prints how far the native observer's op sequence is from the
dispatch mode's (one step of each, op names in order): the ops only one of
them sees. Under a Python mode, autograd accumulates gradients out of place
(``add``, where it otherwise runs ``add_``) and autograd's saved tensors are
detached through the mode (``detach``); these are the differences a native
recorder must reconcile for its dumps to pair with a simulated target's,
which needs the dispatch mode.

Builds the observer with ``torch.utils.cpp_extension`` (a C++ compiler and
``ninja``; about 30 s the first time, cached under the build directory).

    python bench/bench_native_floor.py [--models gpt2,bert,vit,resnet,lstm] [--size tiny|small] [--steps 3]
                                       [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["BENCH_REAL_CLOCK"] = "cpu"  # before bench_real reads it: CPU time, torch on one thread

from bench import bench_real  # noqa: E402

CONFIGS = ("plain", "noop mode", "recorder floor", "native floor", "stats")
SOURCE = Path(__file__).resolve().parent / "native" / "recorder_floor.cpp"


def build_observer(build_dir: Path):
    """The compiled observer (`recorder_floor.cpp`), built into ``build_dir`` unless it is there already."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)  # ninja installed beside this interpreter
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    # -DNDEBUG as torch itself is built: RecordFunction's layout differs without it
    return cpp_extension.load(name="recorder_floor", sources=[str(SOURCE)], build_directory=str(build_dir),
                              extra_cflags=["-O3", "-DNDEBUG", "-fno-math-errno", "-fno-trapping-math"],
                              verbose=False)


class _Native:
    def __init__(self, observer):
        self.observer, self.names = observer, []

    def __enter__(self):
        self.observer.start()
        return self

    def __exit__(self, *exc):
        self.names = self.observer.stop()


def _mode_sequence(run) -> list[str]:
    """The op names a TorchDispatchMode sees in one step, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with Log() as log:
        bench_real._step_loop(run, 1, warm=0)
    return log.names


def measure(model: str, observer, size: str, steps: int, repeats: int, workdir: Path) -> dict:
    import precision_tool.torch as ptt

    build, dnn = bench_real._builder(bench_real.MODELS[model], size)

    def context(name: str):
        if name == "plain":
            return contextlib.nullcontext()
        if name == "noop mode":
            return bench_real.noop_mode()
        if name == "recorder floor":
            return bench_real._minimal_recorder()
        if name == "native floor":
            return _Native(observer)
        return ptt.dump(workdir / "stats.h5", mode="stats")

    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    order = list(CONFIGS)
    with dnn:
        bench_real._step_loop(build(), steps)  # first-call costs of torch and the model
        mode_ops = _mode_sequence(build())
        run = build()
        with _Native(observer) as native:
            bench_real._step_loop(run, 1, warm=0)
        native_ops = native.names
        for round_ in range(repeats + 1):
            for name in order:
                run = build()
                with context(name):
                    seconds = bench_real._step_loop(run, steps)
                if round_:
                    times[name].append(seconds)
            order = order[1:] + order[:1]
    only_mode = collections.Counter(mode_ops) - collections.Counter(native_ops)
    only_native = collections.Counter(native_ops) - collections.Counter(mode_ops)
    return {"times": times, "mode_ops": len(mode_ops), "native_ops": len(native_ops),
            "only_mode": dict(only_mode.most_common()), "only_native": dict(only_native.most_common())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(bench_real.MODELS))
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write every figure, with the date, to this file")
    parser.add_argument("--build-dir", default=str(Path(tempfile.gettempdir()) / "precision-tool-native-floor"))
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    bench_real._case("gpt2-sdpa")  # the suite's model builders on the path, transformers quiet
    observer = build_observer(Path(args.build_dir))
    results = {}
    print(f"{'model':8} {'plain':>9} " + " ".join(f"{name:>15}" for name in CONFIGS[1:]) + "   ops a step: mode / native")
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            result = measure(model, observer, args.size, args.steps, args.repeats, Path(work))
            results[model] = result
            plain = statistics.median(result["times"]["plain"])
            ratios = {name: statistics.median(result["times"][name]) / plain for name in CONFIGS[1:]}
            result["plain_step_s"] = plain / args.steps
            result["ratios"] = ratios
            result["spread"] = {name: bench_real._spread(result["times"][name]) for name in CONFIGS}
            print(f"{model:8} {plain / args.steps * 1e3:7.1f}ms " +
                  " ".join(f"{ratios[name]:14.2f}x" for name in CONFIGS[1:]) +
                  f"   {result['mode_ops']} / {result['native_ops']}")
            differences = [f"{name} {count}" for name, count in list(result["only_mode"].items())[:4]]
            extra = [f"{name} {count}" for name, count in list(result["only_native"].items())[:4]]
            print(f"{'':8} only the mode sees: {', '.join(differences) or '-'}; only native: {', '.join(extra) or '-'}")
    if args.json:
        document = {"date": datetime.date.today().isoformat(), "size": args.size, "steps": args.steps,
                    "repeats": args.repeats, "clock": "cpu", "results": results}
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
