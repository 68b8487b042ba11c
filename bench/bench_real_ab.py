"""Benchmark: bench_real's capture configurations in two source trees, A/B, on the same machine in one run.

Where ``bench_real.py`` measures one tree against msprobe, this answers "did a change make capture
cheaper": for each model it runs ``bench_real._ours`` in a process of each tree (a git worktree of the
older commit, say), alternating which goes first from round to round, and prints each configuration's
median time as a ratio to that process's own plain step, old then new. Dump and overflow modes are left
out (their cost is the write, measured by bench_real itself), and so is msprobe. CPU time, torch on one
thread, as ``bench_real.py --cpu``.

    git worktree add --detach /tmp/old <commit>   (then build its C extension: python setup.py build_ext --inplace)
    python bench/bench_real_ab.py /tmp/old . [--size small] [--models gpt2,bert] [--repeats 2] [--rounds 1] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CONFIGS = ("plain", "noop mode", "module floor", "stats module", "stats", "simulate")
MODELS = {"gpt2": "gpt2-sdpa", "bert": "bert-sdpa", "vit": "vit", "resnet": "resnet", "lstm": "lstm-nodnn"}


def _run(root: Path, model: str, size: str, steps: int, repeats: int) -> dict:
    code = (f"import json, pathlib, shutil, sys, tempfile; sys.path.insert(0, {str(root)!r}); "
            f"import bench.bench_real as b; b.OURS = {CONFIGS!r}; b._raw_write_seconds = lambda *a: 0.0; "
            f"d = tempfile.mkdtemp(); r = b._ours({MODELS[model]!r}, {steps}, {repeats}, pathlib.Path(d), {size!r}); "
            f"shutil.rmtree(d, ignore_errors=True); print(json.dumps(r['times']))")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "BENCH_REAL_CLOCK": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    if done.returncode:
        raise SystemExit(f"{model} in {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="processes of each tree per model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    results: dict = {}
    for model in args.models.split(","):
        for round_ in range(args.rounds):
            for name in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                for config, times in _run(trees[name], model, args.size, args.steps, args.repeats).items():
                    results.setdefault(model, {}).setdefault(name, {}).setdefault(config, []).extend(times)
        for name in ("old", "new"):
            row = results[model][name]
            plain = statistics.median(row["plain"])
            print(f"{model:7s} {name}: plain {plain / args.steps * 1e3:6.1f} ms/step  " + "  ".join(
                f"{config} {statistics.median(times) / plain:5.2f}x" for config, times in row.items()
                if config != "plain"), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "steps": args.steps, "trees": {k: str(v) for k, v in
                                                                                            trees.items()},
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
