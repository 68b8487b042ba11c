"""Rebuild the sample dumps: python sample_dumps/make_samples.py

The four dumps of the demo's `sensor` model (golden, npu, overflow and
fusion-off), two steps each, so that ``precision-tool shell sample_dumps/*.h5``
works right after install. They must stay under 2 MB in total.
"""

from __future__ import annotations

from pathlib import Path

from precision_tool.collect.demo import collect_demo

HERE = Path(__file__).resolve().parent
STEPS = 2


def main() -> None:
    runs = collect_demo(HERE, steps=STEPS)
    total = sum(run.path.stat().st_size for run in runs)
    for run in runs:
        print(f"{run.path.name:<16} {run.path.stat().st_size:>9,d} bytes  {run.description}")
    print(f"{'total':<16} {total:>9,d} bytes")
    if total > 2_000_000:
        raise SystemExit("sample dumps exceed 2 MB: lower STEPS")


if __name__ == "__main__":
    main()
