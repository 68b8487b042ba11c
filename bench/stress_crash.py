"""Stress test of crash safety: kill a dump writer with SIGKILL at random times, then read what it left.

Runs the writer of ``tests/dump/test_crash.py`` (200 ops a step, half with tensor data) ``--kills``
times, each killed after two committed steps plus a random wait of up to ``--max-wait`` seconds, and
checks every dump it leaves: it opens, says it is incomplete, and every committed step and tensor reads
back. The suite's crash test kills at five fixed times; this finds the rare kills that land inside a
commit (before commits were undo-logged, 2 in 80 ``--session`` kills under two CPU hogs left an
unreadable dump; tests/dump/test_commit.py replays every kill point instead: see docs/dump-format.md).

With ``--session`` it kills the suite's other writer instead: an ``mlp`` collect in dump mode, whose
packed steps take about a millisecond, so far more kills land inside a commit (three steps first).

    python bench/stress_crash.py [--kills 200] [--max-wait 0.3] [--seed 0] [--session]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dump.test_crash import SESSION, WRITER, _check_readable, _kill_after  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--max-wait", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--session", action="store_true", help="kill an mlp collect instead of the plain writer")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    failures = 0
    for kill in range(args.kills):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "killed.h5"
            script, steps = (SESSION, 3) if args.session else (WRITER, 2)
            _kill_after(script, path, steps, rng.uniform(0.0, args.max_wait))
            try:
                _check_readable(f"{path}.partial", steps)  # a killed writer leaves its dump at NAME.partial
            except Exception as exc:  # any way of failing to read back is a finding
                failures += 1
                print(f"kill {kill}: {type(exc).__name__}: {exc}")
    print(f"{args.kills - failures} of {args.kills} killed writers left a readable dump")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
