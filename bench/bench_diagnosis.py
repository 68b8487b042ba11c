"""The real-model diagnosis suite as a scoreboard: "named N/M, clean K/L".

    python bench/bench_diagnosis.py                 # every case of tests/realmodels/cases.py
    python bench/bench_diagnosis.py -k gpt2 -v      # cases whose id contains "gpt2", with evidence
    python bench/bench_diagnosis.py --level module [--mode stats]   # the same cases captured at module level
    python bench/bench_diagnosis.py --level module --mode stats --zoom   # ... then zoom's region, as zoom does

Each case trains a tiny transformers (or LSTM) model twice under
precision_tool.torch (golden float32, then a clean or faulty target) and
diagnoses the pair. A fault case is named when the verdict has the planted
class, direction and module; a clean case when the verdict is "none".
Prints one line a case and the totals, with the collect and diagnose times,
and how many fault cases got "none" (the rest of the misses name a wrong op
or class). ``--level module`` and ``--mode stats`` capture both runs as
``ptt.dump(..., level=, mode=)`` does (the loop variations are left out
there): module-level dumps show less than op-level ones, so fewer faults
are named, but a clean run must still get "none". ``--zoom`` then does
what `precision-tool zoom` does after its statistics phase: where a side
holds statistics and `analysis.zoom.zoom_region` finds a region, both runs
are collected again with that region's tensors at op level and that pair's
verdict is the case's (the workflow of a run left in module-level stats).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realmodels.cases import clean_cases, collect, fault_cases, judge, unsupported  # noqa: E402
from tests.realmodels.probed2 import bench_cases  # noqa: E402
from tests.realmodels.probed3 import bench_cases as bench_cases3  # noqa: E402
from tests.realmodels.probed4 import bench_cases as bench_cases4  # noqa: E402
from tests.realmodels.variation import VARIATIONS, run_variation  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only cases whose id contains this")
    parser.add_argument("-v", action="store_true", help="print the verdict's evidence")
    parser.add_argument("--json", type=Path, default=None, help="with --speed: write the figures, dated, here")
    parser.add_argument("--level", choices=("op", "module"), default="op", help="capture level of both runs")
    parser.add_argument("--mode", choices=("dump", "stats"), default="dump", help="capture mode of both runs")
    parser.add_argument("--zoom", action="store_true",
                        help="then collect zoom's region with tensors at op level and judge that verdict")
    parser.add_argument("--only", default=None,
                        help="with --speed: only the pairs whose label contains this; --json then keeps the other "
                             "pairs of that file, each with the date it was measured")
    parser.add_argument("--speed", action="store_true",
                        help="instead: time diagnose on a 2-step GPT-2 pair of a few hundred MB (clean and planted)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.speed:
        return speed(args.json, only=args.only)
    from precision_tool.analysis import diagnose
    from precision_tool.analysis.zoom import zoomed_diagnosis
    from precision_tool.dump.reader import open_dump

    tally = {True: [0, 0], False: [0, 0]}  # clean? -> [right, cases]
    slowest, unnamed = 0.0, 0

    def report(case_id: str, clean: bool, diagnosis, right: bool, said: str, timing: str) -> None:
        nonlocal unnamed
        tally[clean][0] += right
        tally[clean][1] += 1
        unnamed += not clean and not right and diagnosis.verdict.cls == "none"
        print(f"{'ok ' if right else 'BAD'} {case_id:38s} {said}  [{timing}]", flush=True)
        if args.v or not right:
            for line in diagnosis.verdict.evidence:
                print(f"      {line}")

    with tempfile.TemporaryDirectory() as tmp:
        goldens = Path(tmp) / "goldens"
        goldens.mkdir()
        cases = clean_cases() + fault_cases() + bench_cases() + bench_cases3() + bench_cases4()  # bench_cases: the
        for number, case in enumerate(cases):  # scoreboard's alone
            if args.k not in case.id:
                continue
            if unsupported(case):
                print(f"skip {case.id:37s} {unsupported(case)}", flush=True)
                continue
            workdir = Path(tmp) / f"{number}-{case.id}"  # (two roles of one fault share an id; zoom's region dumps
            # of one must not be taken for the other's)
            start = time.perf_counter()
            golden, target = collect(case, workdir, mode=args.mode, goldens=goldens, level=args.level)
            collected = time.perf_counter()
            with open_dump(golden) as g, open_dump(target) as t:
                diagnosis = diagnose(g, t)
                region = _zoom_region(g, t, diagnosis.verdict) if args.zoom else None
            if region is not None:  # as `precision-tool zoom` reports it (`zoomed_diagnosis`)
                golden, target = collect(case, workdir / "zoom", selection=region.selection())
                with open_dump(golden) as g, open_dump(target) as t:
                    diagnosis = zoomed_diagnosis(diagnosis.verdict, diagnose(g, t))
            took = time.perf_counter() - collected
            slowest = max(slowest, took)
            report(case.id, case.clean, diagnosis, *judge(case, diagnosis),
                   f"collect {collected - start:.1f}s, diagnose {took:.1f}s")
        for variation in VARIATIONS:  # tests/realmodels/variation.py: loops cases.train does not make
            if args.k not in variation.id or (args.level, args.mode) != ("op", "dump"):
                continue
            start = time.perf_counter()
            diagnosis, right, said = run_variation(variation, Path(tmp) / variation.id)
            report(variation.id, variation.clean, diagnosis, right, said,
                   f"collect and diagnose {time.perf_counter() - start:.1f}s")
    (named, faults), (clean_ok, cleans) = tally[False], tally[True]
    print(f"named {named}/{faults}, clean {clean_ok}/{cleans}  (slowest diagnose {slowest:.1f}s; "
          f"{unnamed} fault case(s) got none)")
    return 0


def _zoom_region(golden, target, verdict):
    """`precision-tool zoom`'s region of a pair with a statistics side (whose diagnosis is ``verdict``), else
    None."""
    from precision_tool.analysis.zoom import zoom_region
    from precision_tool.compare.comparator import compare_dumps

    return zoom_region(compare_dumps(golden, target), golden.metadata, target.metadata, verdict=verdict)


def speed(json_path: Path | None = None, repeats: int = 3, only: str | None = None) -> int:
    """diagnose on a larger GPT-2 (2 layers, width 128, batch 4 x 64 tokens, 1000 words), two steps, full dumps;
    and on a pair of many ops: a 4-layer GRU language model (width 128, batch 8 x 48 tokens), whose kernel runs
    cell by cell, ~6,000 ops a step, its head's weight gradient scaled in the target.

    Each pair is diagnosed ``repeats`` times in this process (the first pays torch's replay set-up); the
    median is printed, and with ``json_path`` written with the date for the README's table. ``only``: the pairs
    whose label contains it; the file's other pairs are kept, with their dates.
    """
    import datetime
    import json
    import statistics

    import torch
    import transformers

    import precision_tool.torch as ptt
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump
    from tests.realmodels.cases import Run, _hf_loss, scale_output, train
    from tests.realmodels.plant import weight_gradient

    transformers.logging.set_verbosity_error()

    def gpt2():
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                         eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
        ids = torch.randint(0, 1000, (4, 64))
        return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids},
                   _hf_loss)

    def gru():
        from bench_random_configs import recurrent

        torch.manual_seed(0)
        return recurrent(4, 128, 4, 48, 8, "gelu", "sgd", "sdpa")  # (heads 4: a GRU)

    pairs = (("clean mix", gpt2, None, lambda: ptt.simulate_npu("allow_mix_precision")),
             ("scaled act", gpt2, lambda run: scale_output(run, "transformer.h.1.mlp.act"),
              lambda: ptt.simulate_npu("must_keep_origin_dtype")),
             ("many ops: GRU, scaled weight gradient", gru, lambda run: weight_gradient(run, "head"), None))
    pairs = tuple(pair for pair in pairs if only is None or only in pair[0])
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        goldens = {}
        for label, build, plant, context in pairs:
            golden = goldens.get(build)
            if golden is None:
                golden = goldens[build] = Path(tmp) / f"golden_{build.__name__}.h5"
                with ptt.dump(golden):
                    train(build())
            target = Path(tmp) / f"{label.split(':')[0].replace(' ', '_')}.h5"
            run = build()
            if plant is not None:
                plant(run)
            with context() if context else contextlib.nullcontext(), ptt.dump(target, role="target"):
                train(run)
            size = (golden.stat().st_size + target.stat().st_size) / 1e6
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                with open_dump(golden) as g, open_dump(target) as t:
                    verdict = diagnose(g, t).verdict
                    ops = sum(1 for _ in t.ops())
                times.append(time.perf_counter() - start)
            took = statistics.median(times)
            figures[label] = {"pair_mb": round(size), "ops": ops, "median_s": took, "times_s": times,
                              "verdict": verdict.cls, "op": verdict.op, "date": datetime.date.today().isoformat()}
            print(f"{label}: pair {size:.0f} MB, {ops} ops a side, diagnose {took:.1f} s (median of {repeats}, "
                  f"{min(times):.1f}-{max(times):.1f}): {verdict.cls} at {verdict.op}")
    if json_path is not None:
        earlier = json.loads(json_path.read_text()) if only is not None and json_path.exists() else {"pairs": {}}
        kept = {label: {"date": earlier.get("date"), **pair} for label, pair in earlier["pairs"].items()}
        json_path.write_text(json.dumps({"date": datetime.date.today().isoformat(), "repeats": repeats,
                                         "pairs": {**kept, **figures}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
