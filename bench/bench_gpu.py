"""Benchmark and check: capture on a CUDA device, where real users run the target.

Trains ``bench_real.py``'s width-256 families (``--size small``) on ``--device``
(default ``cuda``): plain, under an empty dispatch mode (the floor), and under
``precision_tool.torch.dump`` in stats mode at module and op level and in dump
mode, fp32 and under fp16 autocast. Wall clock, the device synchronised at the
end of each step; one untimed step in each configuration, then ``--steps``
timed ones, median of ``--repeats`` interleaved rounds; ratios to the plain
step of the same precision.

With ``--check`` it also diagnoses each model's fp16-autocast device run against
its fp32 CPU run (golden): a clean port, for which the right verdict is
"none", and the seconds ``diagnose`` takes.

    python bench/bench_gpu.py [--models gpt2,bert,vit,resnet,lstm] [--steps 3] [--repeats 3] [--check]
                              [--device cuda] [--json FILE]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CONFIGS = ("plain", "noop mode", "stats module", "stats", "dump")


def _build(model: str, device: str):
    import torch

    import bench_real

    make, dnn = bench_real._builder(bench_real.MODELS[model], "small")
    run = make()
    run.model.to(device)  # the optimizer keeps the same Parameter objects
    run.batch = {key: value.to(device) for key, value in run.batch.items()}
    for state in run.optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device)
    return run, dnn


def _train(run, steps: int, device: str, autocast: bool, warm: int = 1) -> float:
    import torch

    import precision_tool.torch as ptt

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    region = (lambda: torch.autocast(device.split(":")[0], dtype=torch.float16)) if autocast else \
        contextlib.nullcontext
    start = time.perf_counter()
    for index in range(warm + steps):
        if index == warm:
            sync()
            start = time.perf_counter()
        with region():
            loss = run.loss(run.model, run.batch)
        run.optimizer.zero_grad()
        loss.backward()
        run.optimizer.step()
        ptt.step(loss)
    sync()
    return time.perf_counter() - start


def _context(name: str, path: Path):
    import bench_real

    import precision_tool.torch as ptt

    if name == "plain":
        return contextlib.nullcontext()
    if name == "noop mode":
        return bench_real.noop_mode()
    if name == "stats module":
        return ptt.dump(path, mode="stats", level="module")
    return ptt.dump(path, mode=name)


def timings(model: str, device: str, steps: int, repeats: int, workdir: Path) -> dict:
    result = {}
    for autocast in (False, True):
        times: dict[str, list[float]] = {name: [] for name in CONFIGS}
        order = list(CONFIGS)
        for round_ in range(repeats + 1):
            for name in order:
                run, dnn = _build(model, device)
                path = workdir / f"{model}-{name}.h5"
                with dnn, _context(name, path):
                    seconds = _train(run, steps, device, autocast)
                path.unlink(missing_ok=True)
                if round_:
                    times[name].append(seconds / steps)
            order = order[1:] + order[:1]
        plain = statistics.median(times["plain"])
        result["fp16 autocast" if autocast else "fp32"] = {
            name: {"median_s": statistics.median(values), "ratio": statistics.median(values) / plain,
                   "spread": max(values) / min(values)} for name, values in times.items()}
    return result


def check(model: str, device: str, workdir: Path) -> dict:
    """Diagnose the fp16-autocast run on ``device`` against the fp32 run on the CPU: a clean port."""
    import precision_tool.torch as ptt
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    golden, target = workdir / f"{model}-golden.h5", workdir / f"{model}-target.h5"
    run, dnn = _build(model, "cpu")
    with dnn, ptt.dump(golden):
        _train(run, 2, "cpu", False, warm=0)
    run, dnn = _build(model, device)
    with dnn, ptt.dump(target):
        _train(run, 2, device, True, warm=0)
    start = time.perf_counter()
    with open_dump(golden) as g, open_dump(target) as t:
        result = diagnose(g, t)
    seconds = time.perf_counter() - start
    verdict = result.verdict
    return {"verdict": verdict.cls, "op": verdict.op, "direction": verdict.direction, "evidence": list(verdict.evidence),
            "diagnose_s": seconds, "golden_mb": golden.stat().st_size / 1e6, "target_mb": target.stat().st_size / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,vit,resnet,lstm")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--no-timings", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    import torch

    if options.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from tests.realmodels.cases import _quiet_transformers

    _quiet_transformers()
    name = torch.cuda.get_device_name() if options.device.startswith("cuda") else "cpu"
    document = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "models": {}}
    print(f"bench_gpu: {name}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        for model in options.models.split(","):
            entry = document["models"][model] = {}
            if not options.no_timings:
                entry["timings"] = timings(model, options.device, options.steps, options.repeats, workdir)
                for precision, rows in entry["timings"].items():
                    cells = "  ".join(f"{config} {row['ratio']:.2f}x" for config, row in rows.items()
                                      if config != "plain")
                    print(f"{model:7s} {precision:13s} plain {rows['plain']['median_s'] * 1e3:7.1f} ms  {cells}",
                          flush=True)
            if options.check:
                entry["check"] = check(model, options.device, workdir)
                print(f"{model:7s} check: {entry['check']}", flush=True)
    if options.json:
        options.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
