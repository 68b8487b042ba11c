"""Benchmark: a training step in a fresh process, with glibc's default malloc and as the CLI tunes it.

    python bench/bench_malloc.py [--model transformer] [--steps 12] [--rounds 3]

``precision-tool`` (the console script) calls
`precision_tool.cli.main.keep_freed_memory` before anything else, so freed
arrays stay in the heap instead of going back to the kernel between steps.
Each figure is the median process CPU time of a step after two warm-up steps,
in a new Python process, best of ``--rounds``; minor page faults a step are
shown beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, statistics, sys, time
from precision_tool.cli.main import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
from precision_tool.engine.device import golden, npu
from precision_tool.session import Session, SessionConfig

class Clock:
    def __init__(self):
        self.steps = []
    def on_step_begin(self, step):
        self.begin = (time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    def on_step_end(self, result):
        self.steps.append((time.process_time() - self.begin[0],
                           resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.begin[1]))

out = {}
for name, device in (("golden", golden), ("npu", npu)):
    clock = Clock()
    Session(SessionConfig(model=sys.argv[2], steps=int(sys.argv[3]), device=device()), hooks=[clock]).run()
    steps = clock.steps[2:]
    out[name] = (statistics.median(t for t, _ in steps), statistics.median(f for _, f in steps))
print(json.dumps(out))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    best: dict = {}
    for _ in range(args.rounds):
        for setting in ("default", "tuned"):
            run = subprocess.run([sys.executable, "-c", CHILD, setting, args.model, str(args.steps)],
                                 capture_output=True, text=True, check=True)
            for device, (seconds, faults) in json.loads(run.stdout).items():
                key = (device, setting)
                if key not in best or seconds < best[key][0]:
                    best[key] = (seconds, faults)
    for device in ("golden", "npu"):
        default, tuned = best[(device, "default")], best[(device, "tuned")]
        print(f"{args.model} on {device}: default malloc {default[0] * 1e3:.2f} ms/step ({default[1]:.0f} page "
              f"faults), tuned {tuned[0] * 1e3:.2f} ms/step ({tuned[1]:.0f}) -> {tuned[0] / default[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
