"""The README's performance table, generated from the benchmarks' saved output.

Every figure in the table is read from a ``--json`` file that a benchmark
wrote, with that file's date; nothing is typed in by hand. The files live in
``bench/results/``:

* ``real.json``: ``bench_real.py --json`` (torch capture on the real models);
* ``real-small.json``: ``bench_real.py --size small --json`` (the same families at width 256);
* ``many-20000.json``, ``many-50000.json``: ``bench_many.py --ops N --json``
  (compare, check and vcs on many small tensors, against reading the bytes);
* ``diagnosis-speed.json``: ``bench_diagnosis.py --speed --json`` (diagnose
  on 2-step GPT-2 pairs and on a GRU pair of many ops);
* ``native-floor.json``, ``native-floor-small.json``: ``bench_native_floor.py
  [--size small] --json`` (aten-level capture floors: the Python dispatch
  mode's against a C++ observer's).

    python bench/perf_table.py                  # print the table
    python bench/perf_table.py --write README.md  # replace the table between its markers
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
MODELS = ("gpt2", "bert", "vit", "resnet", "lstm")


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def capture_rows(document: dict) -> list[str]:
    """One row per model: ratios to the plain step (medians), the two floors, records a step, dump write
    speed against raw h5py, msprobe's statistics at L1 and L0 and its tensor dump."""
    rows = []
    for name in [m for m in MODELS if m in document["results"]] + sorted(set(document["results"]) - set(MODELS)):
        result = document["results"][name]
        times = result["times"]
        plain = statistics.median(times["plain"])

        def ratio(config: str) -> str:
            return f"{statistics.median(times[config]) / plain:.2f}×" if config in times else "–"

        added = statistics.median(times["dump"]) - plain
        raw = result.get("raw_write_s")
        same_clock = result.get("raw_clock", "wall") == document.get("clock", "wall")  # (before 2026-11-26 the
        write = f"{raw / added:.0%}" if raw and added > 0 and same_clock else "–"  # raw write was timed on the wall)
        records = result.get("records_per_step", {})
        ours = " / ".join(f"{records[c]:.0f}" if c in records else "–" for c in ("stats module", "stats"))
        msprobe = result.get("msprobe")
        theirs = ["–", "–", "–"]
        if msprobe:
            base = statistics.median(msprobe["msprobe plain"])
            counts = result.get("msprobe_records_per_step", {})

            def their(config: str, count: str | None = None) -> str:
                if config not in msprobe:
                    return "–"
                text = f"{statistics.median(msprobe[config]) / base:.1f}×"
                return f"{text} ({counts[count]:.0f})" if count in counts else text

            theirs = [their("msprobe stats L0", "stats L0"), their("msprobe stats", "stats"), their("msprobe tensor")]
        module_floor = ratio("module floor") + (f" / {ratio('module recorder floor')}"
                                                if "module recorder floor" in times else "")
        cells = [name, f"{plain * 1000 / document['steps']:.1f} ms", module_floor, ratio("stats module"),
                 ratio("noop mode") + (f" / {ratio('recorder floor')}" if "recorder floor" in times else ""),
                 ratio("stats"), ratio("stats, steps left out"), ours, ratio("dump"), write, ratio("simulate"),
                 *theirs]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def many_row(document: dict) -> str:
    median = document["median_s"]
    floor = median["floor"]
    peaks = document.get("peak_kb", {})
    cli_peaks = [peaks.get(f"cli {c}") for c in ("compare", "check", "vcs")]
    before = [peaks.get(f"before cli {c}") for c in ("compare", "check", "vcs")]
    cells = [f"{document['ops']:,d} ops × {document['values']:,d} float32", f"{floor:.2f} s",
             f"{median['compare/packed']:.2f} s ({median['compare/packed'] / floor:.1f}×)",
             " / ".join(f"{median[f'cli {c}']:.1f}" for c in ("compare", "check", "vcs")) + " s",
             " / ".join(f"{p / 1024:.0f}" for p in cli_peaks) + " MB" if all(cli_peaks) else "–",
             " / ".join(f"{p / 1024:.0f}" for p in before) + " MB" if all(before) else "–", document["date"]]
    return "| " + " | ".join(cells) + " |"


CAPTURE_HEAD = ["| model | plain step | module floor | stats, module | aten floor | stats, aten | steps left out "
                "| records a step | dump | dump write vs raw h5py | simulate | msprobe stats L0 | msprobe stats L1 "
                "| msprobe tensor |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def _recorder_floor(document: dict) -> str:
    """The caption's words for the recorder floor, where the run measured it (`bench_real._minimal_recorder`)."""
    if not any("recorder floor" in r["times"] for r in document["results"].values()):
        return ""
    return (" (after the slash: the least a statistics recorder in Python does, input statistics looked up by "
            "object, output statistics in C, no names, no checks, no file)")


def _module_recorder_floor(document: dict) -> str:
    """The caption's words for the module recorder floor, where the run measured it
    (`bench_real._ModuleRecorderFloor`)."""
    if not any("module recorder floor" in r["times"] for r in document["results"].values()):
        return ""
    return (" (after the slash: the least a module-level statistics recorder in Python does, the same hooks with "
            "each call's input statistics looked up by object and its outputs' and each boundary gradient's "
            "computed in C, no names, no checks, no file)")


def _msprobe_dates(document: dict) -> str:
    """A sentence saying when msprobe's figures were measured, where they were carried over from an earlier run."""
    dates = sorted({r["msprobe_date"] for r in document["results"].values() if r.get("msprobe_date")})
    return f" msprobe's columns are its runs of {', '.join(dates)} (`--msprobe-from`)." if dates else ""


NATIVE_HEAD = ["| model | plain step | no-op dispatch mode | recorder floor, Python | recorder floor, C++ | stats, aten "
               "| ops a step: mode / C++ |", "|---|---|---|---|---|---|---|"]


def native_rows(document: dict) -> list[str]:
    """One row per model of `bench_native_floor.py`'s output: its medians as ratios to the plain step."""
    rows = []
    for name in [m for m in MODELS if m in document["results"]]:
        result = document["results"][name]
        times = result["times"]
        plain = statistics.median(times["plain"])
        cells = [name, f"{plain * 1000 / document['steps']:.1f} ms",
                 *(f"{statistics.median(times[c]) / plain:.2f}×" for c in ("noop mode", "recorder floor",
                                                                           "native floor", "stats")),
                 f"{result['mode_ops']} / {result['native_ops']}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def table() -> str:
    lines = []
    real = load("real.json")
    if real:
        clock = "CPU time, torch on one thread" if real.get("clock") == "cpu" else "wall time"
        lines += [f"**Torch capture on real models** (`bench_real.py`, {real['date']}; {real['steps']} steps, "
                  f"median of {real['repeats']} interleaved rounds, {clock}; ratios to the plain step). Targets: "
                  "stats ≤ 1.5× at module level and ≤ 2.5× at aten level, dump ≥ 50 % of raw h5py write speed, "
                  "simulate ≤ 2×. The floors: module hooks that do nothing, for module level" +
                  _module_recorder_floor(real) + "; a no-op dispatch "
                  "mode, for aten level and simulate" + _recorder_floor(real) + ". Steps left out: the steps an "
                  "aten-level `steps=` filter does not record, which run without the dispatch mode. Records a step: "
                  "module level / aten level; msprobe's in "
                  "brackets (L0 is module level, L1 torch-API level)." + _msprobe_dates(real), "", *CAPTURE_HEAD,
                  *capture_rows(real), ""]
    small = load("real-small.json")
    if small:
        lines += [f"The same families at width 256 (`bench_real.py --size small`, {small['date']}, "
                  f"{small['steps']} steps, median of {small['repeats']} rounds, "
                  f"{'CPU time' if small.get('clock') == 'cpu' else 'wall time'}): the fixed cost per op and per "
                  "module call weighs less as the kernels grow." + _msprobe_dates(small), "", *CAPTURE_HEAD,
                  *capture_rows(small), ""]
    native = [d for d in (load("native-floor.json"), load("native-floor-small.json")) if d]
    if native:
        sizes = " and ".join(f"{'width 256' if d['size'] == 'small' else 'the tiny configs'} ({d['date']}, median of "
                             f"{d['repeats']} rounds)" for d in native)
        lines += [f"**Where aten-level capture's cost lies** (`bench_native_floor.py`, {sizes}; {native[0]['steps']} "
                  "steps, CPU time, torch on one thread). Every aten-level configuration above intercepts ops with a "
                  "Python dispatch mode, which costs the no-op column before recording anything. The C++ column is "
                  "a RecordFunction observer (the profiler's hook) seeing the same ops, each one's input "
                  "statistics looked up and its output statistics computed in C++, without names or a file: the "
                  "floor of a native recorder, which this project does not have yet. The op counts differ where "
                  "the mode itself changes what autograd runs (it detaches saved tensors; gradients accumulate "
                  "out of place).", ""]
        for document in native:
            label = "Width 256" if document["size"] == "small" else "Tiny configs"
            lines += [f"{label}:", "", *NATIVE_HEAD, *native_rows(document), ""]
    many = [d for d in (load("many-20000.json"), load("many-50000.json")) if d]
    if many:
        lines += ["**Many small tensors** (`bench_many.py`): `compare` in process against reading the same bytes "
                  "with numpy tensor by tensor (the floor; target within 2×), then `compare` / `check` / the "
                  "shell's `vcs` end to end with imports (target ≤ 10 s at 50,000 ops), their peak resident "
                  "memory (they stream: docs/compare.md), and the same commands' peaks before streaming "
                  "(`--tree`, interleaved in the same run).", "",
                  "| pair | floor | compare | CLI compare / check / vcs | CLI peak | before streaming | measured |",
                  "|---|---|---|---|---|---|---|", *[many_row(d) for d in many], ""]
    speed = load("diagnosis-speed.json")
    if speed:
        lines += ["**Diagnosis** (`bench_diagnosis.py --speed`): `diagnose` on two-step pairs with "
                  f"full dumps, median of {speed['repeats']} in one process: a GPT-2 (target ≤ 3 s), and a 4-layer GRU "
                  "whose kernel runs cell by cell (many ops).", "",
                  "| pair | dumps | ops a side | diagnose | verdict | measured |", "|---|---|---|---|---|---|"]
        for label, pair in speed["pairs"].items():
            ops = f"{pair['ops']:,}" if "ops" in pair else ""
            lines.append(f"| {label} | {pair['pair_mb']} MB | {ops} | {pair['median_s']:.1f} s | {pair['verdict']}"
                         f"{' at ' + pair['op'] if pair['op'] else ''} | {pair.get('date', speed['date'])} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write(readme: Path) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: no {START} ... {END} markers to replace between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table()}{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, default=None, help="replace the table in this file (README.md)")
    args = parser.parse_args(argv)
    if args.write:
        write(args.write)
    else:
        sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
