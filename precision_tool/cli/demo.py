"""``precision-tool demo``: the whole flow on the embedded sample, ending in the diagnosis of its fault."""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from pathlib import Path

import click

from precision_tool.collect.demo import DEMO_MODEL, DEMO_STEPS
from precision_tool.commands.options import OutputFolder


@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workdir", type=OutputFolder(path_type=Path),
              help="Directory for the four dumps (created if needed). Default: a new temporary directory, kept.")
@click.option("--steps", type=click.IntRange(1, 200), default=DEMO_STEPS, show_default=True,
              help="Training steps per run.")
@click.option("--force", is_flag=True, help="Replace the demo's dumps already in --workdir.")
def demo(workdir, steps, force):
    """Run the whole flow on the embedded sample and diagnose its fault.

    \b
    Trains the `sensor` sample model (raw sensor readings, a LayerNorm built
    from primitive ops) four times: on the golden CPU device, on the
    simulated NPU (force_fp16, saturation, fusion on), in overflow mode and
    with fusion off. Then it compares the NPU run with golden and prints the
    diagnosis. The dumps stay in --workdir for `precision-tool shell`; dumps
    of those names already there are kept (nothing runs) unless --force,
    which replaces the four together once the last run is done.
    """
    from rich.text import Text

    from precision_tool.analysis import diagnose
    from precision_tool.cli.consoles import console as pipe_console
    from precision_tool.collect.demo import collect_demo, demo_paths
    from precision_tool.dump.partial import check_target
    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.compare.report import select_flagged
    from precision_tool.defaults import COSINE_THRESHOLD, LIST_LIMIT
    from precision_tool.dump.reader import open_dump
    from precision_tool.render.compare_view import flagged_view
    from precision_tool.render.shell_views import diagnosis as diagnosis_view

    console = pipe_console()
    if workdir and Path(workdir).is_dir():  # before anything is printed or run
        _refuse_existing(workdir, demo_paths(workdir), force)
        for path in demo_paths(workdir):
            check_target(path, force)
    workdir = _make_workdir(workdir)
    console.print(Text(f"precision-tool demo: model {DEMO_MODEL}, {steps} steps, dumps in {workdir}", style="bold"))

    def show(run):
        losses = f"loss {run.losses[0]:.3g} -> {run.losses[-1]:.4g}" if run.losses else ""
        overflow = f" [{len(run.overflow_steps)} overflow]" if run.overflow_steps else ""
        console.print(f"  {run.path.name:<14}{run.description:<31}{losses}{overflow}")

    started = time.time()
    try:
        runs = {run.role: run.path for run in collect_demo(workdir, steps, on_run=show, overwrite=force)}
    except KeyboardInterrupt as exc:  # the error boundary adds what the dumps kept to its one line
        exc.kept = _partials_left(demo_paths(workdir), started)
        raise
    with open_dump(runs["golden"]) as golden, open_dump(runs["target"]) as target, \
            open_dump(runs["overflow"]) as overflow, open_dump(runs["fusion-off"]) as fusion_off:
        report = compare_dumps(golden, target)
        console.print(Text("\nCompare npu.h5 with golden.h5 (the shell's `vcs`)", style="bold underline"))
        flagged = select_flagged(report, COSINE_THRESHOLD, LIST_LIMIT)
        console.print(flagged_view(report, flagged, COSINE_THRESHOLD, LIST_LIMIT))
        console.print(Text("\nDiagnosis (the shell's `ac`)", style="bold underline"))
        result = diagnose(golden, target, overflow=overflow, fusion_off=fusion_off, comparison=report)
        console.print(diagnosis_view(result, overflow_limit=3))
    quoted = {role: shlex.quote(str(path)) for role, path in runs.items()}  # commands to paste: one line each,
    files = " ".join(quoted[role] for role in ("golden", "target", "overflow", "fusion-off"))  # paths quoted
    console.print(Text("\nExplore it:", style="bold"))
    for command in (f"precision-tool shell {files}", f"precision-tool compare {quoted['golden']} "
                                                     f"{quoted['target']} --all"):
        console.print(Text(f"  {command}", no_wrap=True, overflow="ignore"), soft_wrap=True)


def _partials_left(paths, started: float) -> str | None:
    """After Ctrl-C: where this run's dumps are, when earlier dumps were kept (a run replacing them writes its own
    in the work directory's `STAGING` folder until all four are done; an earlier version, NAME.partial beside)."""
    from precision_tool.collect.demo import STAGING
    from precision_tool.dump.partial import partial_path
    from precision_tool.errors import printable

    left = []
    for path in paths:
        for candidate in (Path(path).parent / STAGING / Path(path).name, Path(path).parent / STAGING /
                          Path(partial_path(str(path))).name, Path(partial_path(str(path)))):
            try:
                if os.stat(candidate).st_mtime >= started - 1:
                    left.append(candidate)
            except OSError:
                continue
    if not left:
        return None
    if any(p.parent.name == STAGING for p in left):
        return (f"the previous dumps are kept; this run's, incomplete, are in {printable(left[0].parent)} ("
                + ", ".join(p.name for p in left) + ")")
    return "the previous dumps are kept; " + ", ".join(printable(p) for p in left) + \
        (" keeps" if len(left) == 1 else " keep") + " this run's, incomplete"


def _refuse_existing(workdir, paths, force: bool) -> None:
    """Without --force: InputError naming the files of the demo's names already in ``workdir`` (a demo's, or the
    user's own), and the two ways on."""
    from precision_tool.errors import InputError

    there = [Path(p).name for p in paths if os.path.isfile(p)]  # anything else: check_target says what it is
    if there and not force:
        held = ", ".join(there) + (" already exists" if len(there) == 1 else " already exist")
        raise InputError(workdir, f"{held} there, under the names the demo writes; --force replaces "
                                  f"{'it' if len(there) == 1 else 'them'}, or give another --workdir")


def _make_workdir(workdir) -> Path:
    """--workdir, made if missing, else a new temporary directory; InputError when it cannot be made."""
    from precision_tool.errors import InputError
    from precision_tool.outputs import make_folder, problem

    if workdir:
        return make_folder(workdir, "the demo's directory")
    try:
        return Path(tempfile.mkdtemp(prefix="precision-tool-demo-"))
    except OSError as exc:
        raise InputError(tempfile.gettempdir(), f"cannot create the demo's directory: {problem(exc)}") from None
