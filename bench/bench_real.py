"""Benchmark: capture on real models. Each mode's training time against the plain run, and msprobe's.

The models are the real-model suite's (``tests/realmodels/cases.py``): tiny
Hugging Face GPT-2, BERT and ViT configs, a small ResNet and an LSTM language
model (oneDNN off), random init, nothing downloaded. Each configuration trains
a freshly built model (same seed): one optimizer step untimed inside the
configuration (it creates the dump file and its metadata, a one-off cost),
then ``--steps`` timed steps: the steady-state cost a long run pays per step. Per model, one process runs every configuration of ours,
interleaved over ``--repeats`` rounds (the order rotates each round):

* ``plain``: no instrumentation;
* ``noop mode``: an empty ``TorchDispatchMode`` around the step, the floor of
  any capture that intercepts aten ops from Python;
* ``stats module``: ``precision_tool.torch.dump(path, "stats", level="module")``,
  module calls only, no aten op intercepted;
* ``stats``, ``overflow``, ``dump``: ``precision_tool.torch.dump(path, mode)``;
* ``simulate``: ``simulate_npu("allow_mix_precision")``.

msprobe (``mindstudio-probe==26.2.0``, when installed) runs in processes of
its own, since it patches torch: its plain runs first, then
``PrecisionDebugger`` with task ``statistics`` and ``tensor`` at level L1
(torch API level), started and stopped around every step as its docs say.

Printed: the median time of each configuration as a ratio to plain, with the
spread (max/min over the rounds), and for ``dump`` its write speed: the
dump's bytes over the time it adds to plain, against raw h5py writing the
same bytes (every tensor read back from the dump and written, one dataset
each). ``--json FILE`` writes every figure, with the date, for the README's
table.

    python bench/bench_real.py [--models gpt2,bert,vit,resnet,lstm] [--steps 3] [--repeats 5] [--json FILE] [--no-msprobe]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gpt2": "gpt2-sdpa", "bert": "bert-sdpa", "vit": "vit", "resnet": "resnet", "lstm": "lstm-nodnn"}
OURS = ("plain", "noop mode", "stats module", "stats", "overflow", "dump", "simulate")
MSPROBE = ("msprobe plain", "msprobe stats", "msprobe tensor")


# ---- inside a worker process ---------------------------------------------------------------------

def _case(model: str):
    sys.path.insert(0, str(ROOT))
    from tests.realmodels.cases import Case, _quiet_transformers

    _quiet_transformers()
    return Case(model, "clean", "fp32")


def _step_loop(run, steps: int, around=None, warm: int = 1) -> float:
    """Seconds to train ``steps`` optimizer steps after ``warm`` untimed ones; ``around(step_index)`` is a
    context per step, if given."""
    import contextlib

    import precision_tool.torch as ptt

    start = time.perf_counter()
    for index in range(warm + steps):
        if index == warm:
            start = time.perf_counter()
        with (around(index) if around else contextlib.nullcontext()):
            loss = run.loss(run.model, run.batch)
            run.optimizer.zero_grad()
            loss.backward()
            run.optimizer.step()
            ptt.step(loss)
    return time.perf_counter() - start


def _ours(model: str, steps: int, repeats: int, workdir: Path) -> dict:
    import contextlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import precision_tool.torch as ptt
    from tests.realmodels.cases import _dnn, build

    case = _case(model)

    class Noop(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def context(name: str, path: Path):
        if name == "plain":
            return contextlib.nullcontext()
        if name == "noop mode":
            return Noop()
        if name == "simulate":
            return ptt.simulate_npu("allow_mix_precision")
        if name == "stats module":
            return ptt.dump(path, mode="stats", level="module")
        return ptt.dump(path, mode=name)

    times: dict[str, list[float]] = {name: [] for name in OURS}
    sizes: dict[str, int] = {}
    order = list(OURS)
    with _dnn(case), torch.no_grad() if False else contextlib.nullcontext():
        _step_loop(build(case), steps)  # warm-up: first-call costs of torch and the model
        for round_ in range(repeats + 1):
            for name in order:
                path = workdir / f"{name}.h5"
                run = build(case)
                with context(name, path):
                    seconds = _step_loop(run, steps)
                if round_:  # round 0 warms up every configuration
                    times[name].append(seconds)
                if path.exists():
                    sizes[name] = path.stat().st_size
                    if name != "dump":
                        path.unlink()
            order = order[1:] + order[:1]
    raw = _raw_write_seconds(workdir / "dump.h5", workdir / "raw.h5")
    return {"times": times, "sizes": sizes, "raw_write_s": raw}


def _raw_write_seconds(dump: Path, out: Path) -> float:
    """Seconds for h5py to write every stored tensor of ``dump`` again, one dataset each (best of 3)."""
    import h5py
    import numpy as np

    from precision_tool.dump.reader import open_dump
    from precision_tool.dump.storage import stored_dtype

    arrays = []
    with open_dump(dump) as d:
        for record in d.ops():
            for t in record.tensors:
                if t.has_data:
                    values = d.tensor(record.step, record.exec_index, t.slot)
                    arrays.append(np.ascontiguousarray(values.astype(stored_dtype(t.dtype), copy=False))
                                  if t.dtype != "bfloat16" else (values.view(np.uint32) >> 16).astype(np.uint16))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        with h5py.File(out, "w") as f:
            for i, array in enumerate(arrays):
                f.create_dataset(f"t{i:07d}", data=array)
        best = min(best, time.perf_counter() - start)
        out.unlink()
    return best


def _msprobe(model: str, steps: int, repeats: int, workdir: Path, task: str = "statistics") -> dict:
    """msprobe's ``task`` dump; one task per process, since its PrecisionDebugger is a process-wide singleton
    that keeps the first configuration it was given."""
    from tests.realmodels.cases import _dnn, build

    case = _case(model)
    name = f"msprobe {'stats' if task == 'statistics' else task}"
    times: dict[str, list[float]] = {"msprobe plain": [], name: []}
    with _dnn(case):
        _step_loop(build(case), steps)
        for _ in range(repeats):  # plain first: msprobe patches torch once imported and started
            times["msprobe plain"].append(_step_loop(build(case), steps))
        from msprobe.pytorch import PrecisionDebugger

        config = workdir / f"{task}.json"
        config.write_text(json.dumps({"task": task, "level": "L1", "dump_path": str(workdir / f"msprobe_{task}"),
                                      task: {"data_mode": ["all"]}}))
        debugger = PrecisionDebugger(config_path=str(config))
        for round_ in range(repeats + 1):
            run = build(case)

            class Around:
                def __init__(self, index):
                    pass

                def __enter__(self):
                    debugger.start(run.model)

                def __exit__(self, *exc):
                    debugger.stop()
                    debugger.step()

            seconds = _step_loop(run, steps, Around)
            if round_:
                times[name].append(seconds)
    written = sum(f.stat().st_size for f in (workdir / f"msprobe_{task}").rglob("*") if f.is_file())
    return {"times": times, "bytes": written}


# ---- the driver ------------------------------------------------------------------------------------

def _worker(kind: str, model: str, steps: int, repeats: int, *extra) -> dict:
    code = (f"import json, shutil, sys, tempfile, pathlib; sys.path.insert(0, {str(ROOT)!r}); "
            f"from bench.bench_real import _{kind}; "
            f"d = tempfile.mkdtemp(prefix='bench_real_'); "
            f"r = _{kind}({model!r}, {steps}, {repeats}, pathlib.Path(d), *{extra!r}); "
            f"shutil.rmtree(d, ignore_errors=True); print(json.dumps(r))")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{kind} {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _has_msprobe() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("msprobe") is not None
    except (ImportError, ValueError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-msprobe", action="store_true", help="leave msprobe's runs out even where installed")
    parser.add_argument("--markdown", type=Path, default=None, metavar="JSON",
                        help="print the table rows of docs/torch.md from a --json file, and stop")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    msprobe = _has_msprobe() and not args.no_msprobe
    results = {}
    for short in args.models.split(","):
        model = MODELS[short]
        result = _worker("ours", model, args.steps, args.repeats)
        if msprobe:
            stats = _worker("msprobe", model, args.steps, args.repeats, "statistics")
            tensor = _worker("msprobe", model, args.steps, args.repeats, "tensor")
            result["msprobe"] = {**stats["times"], "msprobe tensor": tensor["times"]["msprobe tensor"],
                                 "msprobe plain": stats["times"]["msprobe plain"] + tensor["times"]["msprobe plain"]}
            result["msprobe_tensor_bytes"] = tensor["bytes"]
        results[short] = result
        _print_model(short, result, args.steps)
    if not msprobe and not args.no_msprobe:
        print("msprobe not installed (pip install mindstudio-probe==26.2.0): its columns are left out")
    if args.json:
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "steps": args.steps,
                                         "repeats": args.repeats, "results": results}, indent=1))
    return 0


def _print_model(name: str, result: dict, steps: int) -> None:
    times = result["times"]
    plain = statistics.median(times["plain"])
    line = [f"{name:<7} plain {plain * 1000 / steps:6.1f} ms/step"]
    for config in OURS[1:]:
        values = times[config]
        line.append(f"{config} {statistics.median(values) / plain:5.2f}x (±{_spread(values):.0%})")
    print("  ".join(line))
    dump_bytes = result["sizes"].get("dump", 0)
    added = statistics.median(times["dump"]) - plain
    raw = result["raw_write_s"]
    if dump_bytes and added > 0:
        ours, theirs = dump_bytes / added, dump_bytes / raw
        print(f"        dump {dump_bytes / 1e6:.1f} MB: written at {ours / 1e6:.0f} MB/s over plain, raw h5py "
              f"{theirs / 1e6:.0f} MB/s -> {ours / theirs:.0%} of raw")
    if "msprobe" in result:
        mp = result["msprobe"]
        base = statistics.median(mp["msprobe plain"])
        print(f"        msprobe (own plain {base * 1000 / steps:.1f} ms/step): statistics "
              f"{statistics.median(mp['msprobe stats']) / base:.2f}x, tensor "
              f"{statistics.median(mp['msprobe tensor']) / base:.2f}x "
              f"({result.get('msprobe_tensor_bytes', 0) / 1e6:.1f} MB written)")


def markdown(document: dict) -> str:
    """The rows of the performance table in docs/torch.md: each ratio is a median of the saved runs."""
    rows = []
    for name, result in document["results"].items():
        times = result["times"]
        plain = statistics.median(times["plain"])
        cells = [name, f"{plain * 1000 / document['steps']:.1f} ms"]
        cells += [f"{statistics.median(times[c]) / plain:.2f}x" for c in ("noop mode", "stats module", "stats",
                                                                            "overflow")]
        added = statistics.median(times["dump"]) - plain
        speed = result["sizes"]["dump"] / added / (result["sizes"]["dump"] / result["raw_write_s"])
        cells.append(f"{statistics.median(times['dump']) / plain:.2f}x ({speed:.0%} of raw h5py)")
        cells.append(f"{statistics.median(times['simulate']) / plain:.2f}x")
        msprobe = result.get("msprobe")
        if msprobe:
            base = statistics.median(msprobe["msprobe plain"])
            cells += [f"{statistics.median(msprobe[c]) / base:.2f}x" for c in ("msprobe stats", "msprobe tensor")]
        else:
            cells += ["-", "-"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if values and min(values) > 0 else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
