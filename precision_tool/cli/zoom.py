"""``precision-tool zoom``: statistics of both runs first, then full tensors of the divergent region only.

Phase 1 collects the golden and the target run in stats mode (DIR/stats-golden.h5, DIR/stats-target.h5) and
compares them; phase 2 re-collects both with full tensors of the region around the first divergent op
(`precision_tool.analysis.zoom`: its step, its module and the ops before it; DIR/zoom-golden.h5,
DIR/zoom-target.h5) and diagnoses those. A built-in or FILE.py:FACTORY model runs in-process through collect's
own parser (phase 2 runs the very commands `compare` prints); a torch script (``-- python train.py ...``)
runs four times, its `ptt.dump` reading the phase, role, folder and region from the environment
(`precision_tool.collect.zoom_env`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

import click

from precision_tool.commands.options import COSINE_OPTION, OutputFolder, option
from precision_tool.errors import ConfigError, InputError

ROLES = ("golden", "target")
# collect's options that zoom sets itself, or that four runs cannot share (one checkpoint directory)
NOT_SHARED = frozenset({"model", "output", "device", "mode", "force", "checkpoint_dir", "if_load",
                        "restore_model_version", "save_steps", "ranks", "fault_rank"})
NPU_ONLY = frozenset({"precision_mode", "precision_mode_v2", "overflow_mode", "fusion_switch", "modify_mixlist",
                      "accelerate_train_mode"})  # left out of the golden run


@dataclass
class ZoomRun:
    """What a zoom did: its four dumps (role -> path, by phase), the region, and the diagnosis."""

    stats: dict[str, str]
    zoom: dict[str, str] = field(default_factory=dict)
    region: object = None  # ZoomRegion, None when nothing diverges
    diagnosis: object = None  # AutoCheck
    statistics: object = None  # the statistics' Verdict (`zoom.zoomed_diagnosis`)

    def sizes(self) -> dict[str, int]:
        return {path: os.path.getsize(path) for path in (*self.stats.values(), *self.zoom.values())}


class ZoomCommand(click.Command):
    """Takes a script after ``--`` (kept whole, options and all) instead of MODEL."""

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            args, ctx.meta["zoom_script"] = args[:cut], args[cut + 1:]
        return super().parse_args(ctx, args)


def _collect_command():
    from precision_tool.cli.collect import collect

    return collect


def _params():
    shared = [p for p in _collect_command().params if p.name not in NOT_SHARED]
    own = [click.Argument(["model"], required=False),
           option("-o", "--output", "directory", required=True, type=OutputFolder(),
                  help="The folder for the four dumps (created if needed)."),
           option(*COSINE_OPTION[0], **COSINE_OPTION[1]),
           option("--force", is_flag=True, help="Replace the zoom's dumps already in the folder.")]
    return [*own, *shared]


def _zoom(**params):
    """Find the divergent op from statistics, then diagnose it from full tensors of its region only.

    \b
    precision-tool zoom MODEL [collect options] -o DIR
    precision-tool zoom -o DIR -- python train.py [args]
    Phase 1 collects the golden run and the target run (the collect options;
    golden leaves out the npu ones) in stats mode, DIR/stats-golden.h5 and
    DIR/stats-target.h5, and compares them. Phase 2 collects both again with
    full tensors of the divergent op's step, module and the ops before it
    only, DIR/zoom-golden.h5 and DIR/zoom-target.h5, and prints the diagnosis
    as `diagnose` does. A torch script runs four times: its ptt.dump(...)
    takes the phase, role, folder and region from the environment, and the
    script runs its target run when ptt.zoom_role() == "target" (see
    docs/torch.md). Exit status 0 (1 is not used), 2 on bad input; when
    nothing diverges it says so and stops after phase 1.
    """
    from precision_tool.cli.consoles import console as pipe_console

    ctx = click.get_current_context()
    script = ctx.meta.get("zoom_script")
    model = params.pop("model")
    directory, force, cosine = params.pop("directory"), params.pop("force"), params.pop("cosine")
    if model is None and not script:
        raise click.UsageError("give MODEL, or a script command after --")
    if model is not None and script is not None:
        raise click.UsageError("give MODEL, or a script command after --, not both")
    given = [p for p in ctx.command.params if p.name in params and ctx.get_parameter_source(p.name).name != "DEFAULT"]
    if script is not None and given:
        raise click.UsageError(f"{given[0].opts[-1]} is a collect option: a script sets its own runs")
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise InputError(folder, "is not a folder")
    stats = {role: str(folder / f"stats-{role}.h5") for role in ROLES}
    zooms = {role: str(folder / f"zoom-{role}.h5") for role in ROLES}
    console = pipe_console()
    created = not folder.exists()
    from precision_tool.outputs import make_folder

    make_folder(folder)
    try:
        from precision_tool.dump.partial import check_target

        for path in (*stats.values(), *zooms.values()):  # before anything runs
            check_target(path, force)
        if script is None:
            run = _zoom_model(model, ctx, stats, zooms, force, cosine)
        else:
            run = _zoom_script(script, stats, zooms, force, cosine, folder)
    except BaseException:
        if created and not any(folder.iterdir()):  # refused before anything was written: leave nothing behind
            folder.rmdir()
        raise
    from precision_tool.render.zoom_run import zoom_outcome

    console.print(zoom_outcome(run, cosine))


zoom = ZoomCommand("zoom", params=_params(), callback=_zoom, help=_zoom.__doc__,
                   short_help="Stats first, then full tensors of the divergent region only, and the diagnosis.",
                   context_settings={"help_option_names": ["-h", "--help"]})


# -- a model of the engine -------------------------------------------------------------------------------------
def _collect_argv(ctx) -> list[str]:
    """zoom's collect options as collect's argv words (npu-only ones marked), from the parsed values."""
    words = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name in NOT_SHARED or param.name not in _shared_names() or value in (None, False, ()):
            continue
        flag = param.opts[-1] if param.opts[-1].startswith("--") else param.opts[0]
        for item in (value if isinstance(value, tuple) else (value,)):
            words.append((param.name, [flag] if value is True else [flag, str(item)]))
    return words


def _shared_names() -> frozenset:
    return frozenset(p.name for p in _collect_command().params) - NOT_SHARED


def _plan(argv: list[str], force: bool):
    """A checked collection from collect argv words, through collect's own parser."""
    from precision_tool.cli.collect import _command_line, request_from
    from precision_tool.collect.run import plan_collect

    command = _collect_command()
    with command.make_context("collect", list(argv)) as ctx:
        request = request_from(ctx.params, _command_line(ctx))
    return plan_collect(replace(request, overwrite=force))


def _zoom_model(model, ctx, stats, zooms, force, cosine) -> ZoomRun:
    from precision_tool.cli.collect import _result_line, run_with_progress

    words = _collect_argv(ctx)
    plans = {}
    for role in ROLES:  # both checked before either runs
        options = [w for name, pair in words if role == "target" or name not in NPU_ONLY for w in pair]
        device = ["--device", "golden"] if role == "golden" else ["--device", "npu"]
        plans[role] = _plan([model, *options, *device, "--mode", "stats", "-o", stats[role]], force)
    for role in ROLES:
        click.echo(_result_line(run_with_progress(plans[role])))
    run = ZoomRun(stats)
    run.region, run.statistics = _region(stats, zooms, cosine)
    if run.region is None:
        return run
    plans = {side.role: _plan(shlex.split(side.command)[2:], force) for side in run.region.recollect}
    for role in ROLES:
        click.echo(_result_line(run_with_progress(plans[role])))
    run.zoom = zooms
    run.diagnosis = _diagnose(zooms, run.statistics)
    return run


# -- a torch script ---------------------------------------------------------------------------------------------
def _zoom_script(script, stats, zooms, force, cosine, folder) -> ZoomRun:
    import json

    from precision_tool.collect.zoom_env import DIR, PHASE, REGION, ROLE

    # --force: the previous dumps stay until the script's ptt.dump replaces each (a failing script leaves them)
    base = {DIR: str(folder.resolve())}
    for role in ROLES:
        _run_script(script, {**base, PHASE: "stats", ROLE: role}, stats[role])
    run = ZoomRun(stats)
    run.region, run.statistics = _region(stats, zooms, cosine)
    if run.region is None:
        return run
    region = json.dumps({**run.region.selection(), "float32": _runs_float32(stats["target"])})
    for role in ROLES:
        _run_script(script, {**base, PHASE: "tensors", ROLE: role, REGION: region}, zooms[role])
    run.zoom = zooms
    run.diagnosis = _diagnose(zooms, run.statistics)
    return run


def _runs_float32(path: str) -> bool:
    """Whether phase 1's target dump computes in float32 (`omissions.runs_float32`)."""
    from precision_tool.analysis.omissions import runs_float32
    from precision_tool.dump.reader import open_dump

    with open_dump(path) as dump:
        return runs_float32(dump)


def _run_script(script: list[str], environment: dict, expected: str) -> None:
    what = f"{environment['PRECISION_TOOL_ZOOM_PHASE']} phase, {environment['PRECISION_TOOL_ZOOM_ROLE']} run"
    click.echo(f"running {shlex.join(script)} ({what})", err=True)
    before = _stamp(expected)
    try:
        status = subprocess.run(script, env={**os.environ, **environment}, check=False).returncode
    except OSError as exc:
        raise ConfigError(f"cannot run {script[0]!r}: {exc.strerror or exc}") from None
    if status != 0:
        failed = _failed_step(expected) if _stamp(expected) not in (None, before) else None
        if failed is None:
            raise InputError(script[0], f"{_ended(status)} in the {what}")
        click.echo(f"precision-tool: warning: {script[0]}: {_ended(status)} in the {what}, failing in "
                   f"step {failed}: its steps up to the failure are compared", err=True)
        return
    if _stamp(expected) in (None, before):  # absent, or the previous run's file left as it was
        raise InputError(script[0], f"wrote no {os.path.basename(expected)} in the {what}: does it train "
                                    "inside ptt.dump(...)?")


def _ended(status: int) -> str:
    """How a script's run ended, in words: its exit status, or the signal that stopped it (Python stops itself with
    SIGINT on a KeyboardInterrupt it does not catch: status -2)."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return "was interrupted (SIGINT)" if name == "SIGINT" else f"was killed by {name}"


def _failed_step(path: str) -> int | None:
    """The step a failed torch script's dump ``path`` keeps cut short (`StepRecord.cut_short`: its ops up to the
    failure, the evidence a zoom goes on with), or None."""
    from precision_tool.dump.reader import open_dump
    from precision_tool.errors import PrecisionToolError

    try:
        with open_dump(path) as dump:
            return next((s.step for s in reversed(dump.steps()) if s.cut_short), None)
    except (PrecisionToolError, OSError):
        return None


def _stamp(path: str):
    """What tells a file from the one that replaced it (a dump is renamed into place: a new inode)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size


# -- both -------------------------------------------------------------------------------------------------------
def _region(stats, zooms, cosine):
    """(the region around where the statistics diverge, or None; the statistics' verdict)."""
    from precision_tool.analysis import diagnose
    from precision_tool.analysis.zoom import zoom_region
    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.defaults import COSINE_THRESHOLD
    from precision_tool.dump.reader import open_dump

    with open_dump(stats["golden"]) as golden, open_dump(stats["target"]) as target:
        report = compare_dumps(golden, target)
        if not report.compared_ops:  # (not "no op diverges": nothing was compared)
            raise InputError(stats["target"], f"no op of the statistics phase pairs with one of golden's "
                                              f"({stats['golden']}): nothing to zoom into; does the selection "
                                              "(--dump-steps, --ops, --modules, --op-types) pick ops the run has?")
        verdict = diagnose(golden, target, comparison=report).verdict  # where the statistics alone point, for
        # the tensors to judge (the comparison is the report's: the dumps are read once)
        return zoom_region(report, golden.metadata, target.metadata,
                           COSINE_THRESHOLD if cosine is None else cosine, outputs=zooms, verdict=verdict), verdict


def _diagnose(zooms, statistics):
    """The region's diagnosis, or the statistics' verdict where its tensors name nothing (`zoomed_diagnosis`)."""
    from precision_tool.analysis.zoom import zoomed_diagnosis
    from precision_tool.commands.handlers import diagnose
    from precision_tool.commands.sources import DumpFiles

    with DumpFiles({"golden": zooms["golden"], "target": zooms["target"]}) as source:
        check = diagnose(source)
    full = check.full or check.diagnosis
    return replace(check, diagnosis=zoomed_diagnosis(statistics, check.diagnosis),
                   full=zoomed_diagnosis(statistics, full))
