"""Stats first, tensors where it diverges: how much smaller and how much slower or faster than one full dump.

    python bench/bench_zoom.py                                   # the sensor model, force_fp16, 6 steps
    python bench/bench_zoom.py --model transformer --steps 20    # any built-in model (or FILE.py:FACTORY)
    python bench/bench_zoom.py --torch                           # also examples/torch_zoom.py through zoom

The full approach collects golden and target with every tensor (`collect --mode dump`) and diagnoses them;
the zoom approach is `precision-tool zoom`: both runs in stats mode, compare, both runs again with full
tensors of the divergent region, diagnose. Prints each approach's bytes, wall time and verdict, and the
ratio of the zoom dumps' total size to the full dumps'.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from precision_tool.cli.main import main as cli  # noqa: E402


def _run(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli([str(a) for a in argv])
    if status != 0:
        raise SystemExit(f"precision-tool {' '.join(map(str, argv))}: exit {status}")
    return out.getvalue()


def _verdict(golden, target) -> str:
    verdict = json.loads(_run("diagnose", golden, target, "--format", "json"))["verdict"]
    return f"{verdict['class']} at {verdict['op']} (step {verdict['step']}, {verdict['direction']})"


def _size(*paths) -> int:
    return sum(Path(p).stat().st_size for p in paths)


def engine(model: str, steps: int, precision_mode: str, work: Path) -> tuple:
    golden, target = work / "full-golden.h5", work / "full-target.h5"
    start = time.perf_counter()
    _run("collect", model, "--device", "golden", "--steps", steps, "-o", golden)
    _run("collect", model, "--precision-mode", precision_mode, "--steps", steps, "-o", target)
    full_verdict = _verdict(golden, target)
    full_time = time.perf_counter() - start
    start = time.perf_counter()
    _run("zoom", model, "--precision-mode", precision_mode, "--steps", steps, "-o", work / "zoom")
    zoom_time = time.perf_counter() - start
    zoom_files = sorted((work / "zoom").iterdir())
    zoom_verdict = _verdict(work / "zoom" / "zoom-golden.h5", work / "zoom" / "zoom-target.h5")
    return (_size(golden, target), full_time, full_verdict), (_size(*zoom_files), zoom_time, zoom_verdict)


def torch_script(steps: int, work: Path) -> tuple:
    import os
    import subprocess

    script = [sys.executable, str(ROOT / "examples" / "torch_zoom.py"), "--steps", str(steps)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    golden, target = work / "torch-golden.h5", work / "torch-target.h5"
    start = time.perf_counter()
    for role, path in (("golden", golden), ("target", target)):
        subprocess.run([*script, "--role", role, "--out", str(path)], env=env, check=True, capture_output=True)
    full_verdict = _verdict(golden, target)
    full_time = time.perf_counter() - start
    os.environ["PYTHONPATH"] = str(ROOT)
    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        _run("zoom", "-o", work / "torch-zoom", "--", *script)
    zoom_time = time.perf_counter() - start
    zoom_verdict = _verdict(work / "torch-zoom" / "zoom-golden.h5", work / "torch-zoom" / "zoom-target.h5")
    return (_size(golden, target), full_time, full_verdict), \
        (_size(*(work / "torch-zoom").iterdir()), zoom_time, zoom_verdict)


def _report(name: str, full: tuple, zoom: tuple) -> None:
    print(f"{name}")
    print(f"  full dumps  {full[0] / 1024:10.1f} KiB  {full[1]:7.2f} s  {full[2]}")
    print(f"  zoom dumps  {zoom[0] / 1024:10.1f} KiB  {zoom[1]:7.2f} s  {zoom[2]}")
    same = "same verdict" if full[2] == zoom[2] else "VERDICTS DIFFER"
    print(f"  zoom/full size {zoom[0] / full[0]:.3f} ({full[0] / zoom[0]:.1f}x smaller), "
          f"time {zoom[1] / full[1]:.2f}x; {same}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sensor")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--precision-mode", default="force_fp16")
    parser.add_argument("--torch", action="store_true", help="also zoom examples/torch_zoom.py")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-zoom-") as folder:
        work = Path(folder)
        _report(f"{args.model}, {args.precision_mode}, {args.steps} steps",
                *engine(args.model, args.steps, args.precision_mode, work))
        if args.torch:
            _report(f"examples/torch_zoom.py, force_fp16, {args.steps} steps", *torch_script(args.steps, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
