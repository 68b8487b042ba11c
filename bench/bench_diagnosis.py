"""The real-model diagnosis suite as a scoreboard: "named N/M, clean K/L".

    python bench/bench_diagnosis.py                 # every case of tests/realmodels/cases.py
    python bench/bench_diagnosis.py -k gpt2 -v      # cases whose id contains "gpt2", with evidence

Each case trains a tiny transformers (or LSTM) model twice under
precision_tool.torch (golden float32, then a clean or faulty target) and
diagnoses the pair. A fault case is named when the verdict has the planted
class, direction and module; a clean case when the verdict is "none".
Prints one line a case and the totals, with the collect and diagnose times.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realmodels.cases import clean_cases, collect, fault_cases, judge  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only cases whose id contains this")
    parser.add_argument("-v", action="store_true", help="print the verdict's evidence")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    named = faults = clean_ok = cleans = 0
    slowest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        goldens = Path(tmp) / "goldens"
        goldens.mkdir()
        for case in clean_cases() + fault_cases():
            if args.k not in case.id:
                continue
            workdir = Path(tmp) / case.id
            start = time.perf_counter()
            golden, target = collect(case, workdir, goldens=goldens)
            collected = time.perf_counter()
            with open_dump(golden) as g, open_dump(target) as t:
                diagnosis = diagnose(g, t)
            took = time.perf_counter() - collected
            slowest = max(slowest, took)
            right, said = judge(case, diagnosis)
            if case.clean:
                cleans += 1
                clean_ok += right
            else:
                faults += 1
                named += right
            print(f"{'ok ' if right else 'BAD'} {case.id:38s} {said}  "
                  f"[collect {collected - start:.1f}s, diagnose {took:.1f}s]", flush=True)
            if args.v or not right:
                for line in diagnosis.verdict.evidence:
                    print(f"      {line}")
    print(f"named {named}/{faults}, clean {clean_ok}/{cleans}  (slowest diagnose {slowest:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
