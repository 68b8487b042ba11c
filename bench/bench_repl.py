"""Shell timings: start-up to the prompt, and `vcs` over a 10,000-op comparison once it is loaded.

    python bench/bench_repl.py [--ops 10000]

Targets (DESIGN.md): the prompt within 1 s; `vcs` within 100 ms. Prints one
line per measurement; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_dump(path: Path, role: str, ops: int, seed: int, noise: float) -> None:
    """One step of ``ops`` forward MatMul ops with 64-element tensors."""
    from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
    from precision_tool.dump.stats import tensor_stats
    from precision_tool.dump.writer import DumpWriter

    rng = np.random.default_rng(seed)
    base = np.random.default_rng(0)
    writer = DumpWriter(path, {"role": role, "mode": "dump", "device": role})
    writer.begin_step(0)
    for index in range(ops):
        x = base.standard_normal(64).astype(np.float32)
        y = base.standard_normal(64).astype(np.float32)
        if index % 97 == 0:  # a few ops drift far enough to be flagged
            y = y + rng.standard_normal(64).astype(np.float32) * noise
        arrays = {"input_0": x, "output_0": y}
        tensors = tuple(TensorRecord(slot, "float32", (64,), tensor_stats(a, "float32")) for slot, a in arrays.items())
        record = OpRecord(0, index, f"block{index // 100}/op{index % 100}/MatMul", "MatMul", "forward", "float32",
                          False, tensors)
        writer.write_op(record, arrays)
    writer.end_step(StepRecord(0, 1.0, 1.0, False, ops_recorded=ops))
    writer.close(complete=True)


def median_ms(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def bench_vcs(golden: Path, target: Path, repeat: int) -> None:
    from rich.console import Console

    from precision_tool.render.shell_views import render
    from precision_tool.repl.runner import Runner
    from precision_tool.repl.session import ShellSession

    with ShellSession.open([str(golden), str(target)]) as session:
        runner = Runner(session)
        started = time.perf_counter()
        [first] = runner.run_line("vcs")
        print(f"first vcs (runs the comparison of {len(first.result.report.ops)} ops): "
              f"{(time.perf_counter() - started) * 1000:.0f} ms")
        thresholds = iter(np.linspace(0.97, 0.5, repeat))
        fresh = median_ms(lambda: runner.run_line(f"vcs -c {next(thresholds):.4f} -l 10"), repeat)
        print(f"vcs -c C -l 10, comparison loaded, a new threshold each time, handler only: {fresh:.1f} ms "
              f"(median of {repeat})")
        data = median_ms(lambda: runner.run_line("vcs -c 0.98 -l 10"), repeat)
        print(f"vcs -c 0.98 -l 10 again (flagged ops memoised), handler only: {data:.1f} ms (median of {repeat})")

        def shown():
            [outcome] = runner.run_line("vcs -c 0.98 -l 10")
            Console(file=io.StringIO(), width=120).print(render(outcome.result))

        print(f"vcs -c 0.98 -l 10 again, handler and rendering: {median_ms(shown, repeat):.1f} ms (median of {repeat})")


def bench_startup(golden: Path, target: Path, repeat: int) -> None:
    try:
        import pexpect
    except ImportError:
        print("startup: pexpect not installed; skipped")
        return
    exe = shutil.which("precision-tool") or str(Path(sys.executable).with_name("precision-tool"))
    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm",
               XDG_DATA_HOME=tempfile.mkdtemp(prefix="bench-xdg-"))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        child = pexpect.spawn(exe, ["shell", str(golden), str(target)], env=env, encoding="utf-8", timeout=30)
        child.expect_exact("PrecisionTool > ")
        times.append(time.perf_counter() - started)
        child.sendline("exit")
        child.expect(pexpect.EOF)
        child.close()
    print(f"start-up to the prompt (process start, imports, opening 2 dumps): median {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s over {repeat}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        golden, target = Path(folder) / "golden.h5", Path(folder) / "target.h5"
        started = time.perf_counter()
        write_dump(golden, "golden", args.ops, seed=1, noise=0.0)
        write_dump(target, "target", args.ops, seed=2, noise=1.0)
        print(f"wrote two {args.ops}-op dumps in {time.perf_counter() - started:.1f} s")
        bench_vcs(golden, target, args.repeat)
        bench_startup(golden, target, 5)


if __name__ == "__main__":
    main()
