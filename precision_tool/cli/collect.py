"""``precision-tool collect MODEL -o OUT.h5``: train a model on a device and record it to an HDF5 dump."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time

import click

from precision_tool.collect.modes import MODE_FORM, parse_modes
from precision_tool.collect.selection import STEPS_FORM, parse_op_types, parse_steps
from precision_tool.commands.options import OutputFolder
from precision_tool.engine.formats import OVERFLOW_MODES
from precision_tool.engine.hooks import Interruptible
from precision_tool.engine.precision import PRECISION_MODES, PRECISION_MODES_V2
from precision_tool.commands.options import SEED, FiniteFloat
from precision_tool.defaults import MAX_SCHEDULE, OPTIMIZERS
from precision_tool.errors import ConfigError, InputError, PrecisionToolError, printable

LOSS_SCALE_FORM = ("none | fixed:V | exponential:INIT[,INCR_EVERY_N_STEPS[,DECR_EVERY_N_NAN_OR_INF"
                   "[,INCR_RATIO[,DECR_RATIO]]]] | dynamic:INIT[,FACTOR[,WINDOW]]")


def _checked(parse):
    """A click callback that runs ``parse`` on the value and turns its error into a usage error."""
    def callback(ctx, param, value):
        if value is None or value == ():
            return value
        try:
            parse(value)
        except PrecisionToolError as exc:
            raise click.BadParameter(str(exc)) from None
        return value
    return callback


def _check_model(value):
    from precision_tool.session.models import check_model_name

    check_model_name(value)


def _check_loss_scale(value):
    from precision_tool.session import parse_loss_scale

    parse_loss_scale(value)


def _check_accelerate(value):
    from precision_tool.session import parse_accelerate

    parse_accelerate(value)


def _check_fusion_switch(value):
    from precision_tool.engine.fusion import load_fusion_switch

    load_fusion_switch(value)


@click.command("collect")
@click.argument("model", callback=_checked(_check_model))
@click.option("-o", "--output", required=True, type=click.Path(),
              help="The dump file to write (with --ranks: the run directory).")
@click.option("--device", type=click.Choice(["golden", "npu"]), default=None,
              help="golden (float32 reference) or npu (simulated).  [default: npu]")
@click.option("--mode", default=None, callback=_checked(parse_modes), metavar="MODE[,MODE]",
              help=f"What to record: {MODE_FORM}.  [default: dump]")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Training steps to run.  [default: 20]")
@click.option("--seed", type=SEED, default=None, help="Seed of weights and data.  [default: 0]")
@click.option("--precision-mode", type=click.Choice(PRECISION_MODES), default=None, metavar="MODE",
              help=f"npu precision_mode: {', '.join(PRECISION_MODES)}.  [default: allow_fp32_to_fp16]")
@click.option("--precision-mode-v2", type=click.Choice(PRECISION_MODES_V2), default=None, metavar="MODE",
              help=f"npu precision_mode_v2 (instead of --precision-mode): {', '.join(PRECISION_MODES_V2)}.")
@click.option("--overflow-mode", type=click.Choice(OVERFLOW_MODES), default=None,
              help="npu overflow behaviour.  [default: saturation]")
@click.option("--loss-scale", default=None, callback=_checked(_check_loss_scale), metavar="SPEC",
              help=f"Loss scaling: {LOSS_SCALE_FORM}.  [default: none]")
@click.option("--accelerate-train-mode", default=None, callback=_checked(_check_accelerate), metavar="SPEC",
              help="Train in mixed precision first, e.g. fast|step|0.9 or fast1|loss|1.05.")
@click.option("--fusion-switch", type=click.Path(exists=True, dir_okay=False), default=None,
              callback=_checked(_check_fusion_switch), help="A fusion_switch.cfg JSON file (npu).")
@click.option("--modify-mixlist", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A modify_mixlist JSON moving op types between the black, white and gray lists (npu).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Batch size.  [default: the model's]")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None, help="Optimizer.  [default: sgd]")
@click.option("--lr", type=FiniteFloat(min=0.0, max=3.4028234663852886e38, above_min=True), default=None,
              help="Learning rate.  [default: the optimizer's]")  # (the engine computes in float32)
@click.option("--target-loss", type=FiniteFloat(min=0.0), default=None,
              help="The loss at which a loss-triggered --accelerate-train-mode switches back.")
@click.option("--max-steps", type=click.IntRange(-1, MAX_SCHEDULE), default=None, metavar="N",
              help="Rec SDK schedule: total training steps, -1 for --steps.  [default: -1]")
@click.option("--train-steps", type=click.IntRange(-1, MAX_SCHEDULE), default=None, metavar="N",
              help="Evaluate on held-out data after every N steps; -1 after the last, 0 never.  [default: -1]")
@click.option("--eval-steps", type=click.IntRange(-1, MAX_SCHEDULE), default=None, metavar="N",
              help="Held-out batches per evaluation; -1 the whole held-out set (8), 0 none.  [default: -1]")
@click.option("--save-steps", type=click.IntRange(-1, MAX_SCHEDULE), default=None, metavar="N",
              help="Checkpoint into --checkpoint-dir after every N steps; -1 after the last, 0 never.  [default: -1]")
@click.option("--checkpoint-dir", type=OutputFolder(), default=None,
              help="Where checkpoints go (ckpt-NNNNNNNN.h5, the state before step N); see `replay`.")
@click.option("--if-load", is_flag=True, help="Resume from the latest checkpoint in --checkpoint-dir.")
@click.option("--restore-model-version", type=click.IntRange(0, MAX_SCHEDULE), default=None, metavar="N",
              help="With --if-load: resume from the checkpoint of step N instead of the latest.")
@click.option("--dump-steps", default=None, callback=_checked(parse_steps), metavar="LIST",
              help=f"Steps to record: {STEPS_FORM}.  [default: all]")
@click.option("--ops", multiple=True, metavar="GLOB",
              help="Record only ops whose name (or, for a fused op, an original name) matches; repeatable.")
@click.option("--modules", multiple=True, metavar="GLOB",
              help="Record only ops inside a module whose path matches (block1/conv1 holds block1/conv1/Conv2D); "
                   "adds to --ops; repeatable.")
@click.option("--op-types", default=None, callback=_checked(parse_op_types), metavar="T,...",
              help="Record only ops of these types (a fused op matches through its original types).")
@click.option("--no-backward", is_flag=True, help="Do not record backward ops.")
@click.option("--boost-level", type=click.Choice(["O0", "O1", "O2"]), default=None,
              help="mindspore.boost level: O0 off, O1 less_bn+grad_freeze, O2 adds adasum.  [default: O0]")
@click.option("--boost-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A mindspore.boost config JSON (boost mode and flags, per-algorithm settings).")
@click.option("--ranks", type=click.IntRange(min=1), default=None, metavar="N",
              help="Simulate N data-parallel ranks (each its shard of the batch, gradients all-reduced): "
                   "OUTPUT becomes a run directory of rank0.h5, rank1.h5, ... and run.json.")
@click.option("--fault-rank", type=click.IntRange(min=0), default=None, hidden=True,
              help="With --ranks: this rank's all-reduce skips the collective (a planted fault, for trying `ranks`).")
@click.option("--force", is_flag=True,
              help="Replace an existing dump at OUTPUT (once the new one is closed; never one being written).")
def collect(**params):
    """Train MODEL on a device and record its ops to an HDF5 dump.

    MODEL is a built-in name (mlp, mlp_regression, cnn, transformer, sensor) or
    FILE.py:FACTORY. The dump can be inspected with `precision-tool inspect`
    and compared with `precision-tool compare`. Interrupted with Ctrl-C (or
    SIGTERM), the dump keeps every finished step and says it is incomplete
    (exit 130).
    While it runs the dump is OUTPUT.partial (locked); it becomes OUTPUT when
    closed. An existing OUTPUT is kept unless --force is given.
    """
    from precision_tool.collect.run import plan_collect

    request = request_from(params, _command_line(click.get_current_context()))
    plan = plan_collect(request)  # every value checked before the model is built
    click.echo(_result_line(run_with_progress(plan)))


def request_from(params: dict, command: str):
    """The `CollectRequest` of collect's parsed parameters (``command``: the command line stored in the dump)."""
    from precision_tool.collect.run import CollectRequest

    if params["device"] == "golden" and params["accelerate_train_mode"] is not None:  # it switches npu modes
        raise ConfigError("--accelerate-train-mode applies to --device npu only")
    if params.get("fault_rank") is not None and params.get("ranks") is None:
        raise ConfigError("--fault-rank needs --ranks")
    output = params["output"]
    if not output:
        raise ConfigError("the output file name is empty; give the dump file to write (-o NAME.h5)")
    if params.get("ranks") is None and os.path.isdir(output):
        raise ConfigError(f"{printable(output)}: is a directory; a dump is a file (a run directory needs --ranks N)")
    if params.get("ranks") is None:
        _refuse_special(output)
    if params.get("checkpoint_dir"):
        _refuse_checkpoint_name(output, params["checkpoint_dir"])
    renamed = {"mode": params["mode"] or "dump", "ops": tuple(params["ops"]), "modules": tuple(params["modules"]),
               "backward": not params["no_backward"], "command": command, "overwrite": params["force"]}
    fields = {name: value for name, value in params.items() if name not in ("no_backward", "force")}
    return CollectRequest(**{**fields, **renamed})


def _refuse_special(output: str) -> None:
    """A device, a FIFO or a socket at OUTPUT is refused, --force or not: finishing the dump renames it over
    the name, and would replace /dev/null itself."""
    import stat

    try:
        mode = os.stat(output).st_mode
    except OSError:
        return  # absent (or unreachable: the dump's own checks say why)
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise InputError(output, "is not a regular file (a device, a FIFO or a socket); a dump must be written "
                                 "to a file")


def _refuse_checkpoint_name(output: str, checkpoint_dir: str) -> None:
    """The dump may not be one of --checkpoint-dir's checkpoints (read with --if-load, written every
    --save-steps): the one would replace the other."""
    import re

    from precision_tool.outputs import same_file

    if os.path.abspath(output) == os.path.abspath(checkpoint_dir) or same_file(output, checkpoint_dir):
        raise ConfigError(f"-o and --checkpoint-dir both name {printable(output)}; the dump is a file and the "
                          "checkpoints a folder: give them different paths")
    folder = os.path.dirname(os.path.abspath(output))
    same_folder = same_file(folder, checkpoint_dir) or folder == os.path.abspath(checkpoint_dir)
    if same_folder and re.fullmatch(r"ckpt-\d{8,}\.h5", os.path.basename(output)):  # session.checkpoint's names
        raise InputError(output, f"is a checkpoint's name in --checkpoint-dir {printable(checkpoint_dir)}; "
                                 "give the dump another name")
    if os.path.isdir(checkpoint_dir) and os.path.isfile(output):
        from precision_tool.session.checkpoint import list_checkpoints

        for path in list_checkpoints(checkpoint_dir).values():
            if same_file(output, path):
                raise InputError(output, f"is the checkpoint {printable(path)}; writing the dump over it "
                                         "would destroy it: give the dump another name")


def run_with_progress(plan):
    """Run a checked collection: a progress bar on a terminal, Ctrl-C stopping at the next step boundary."""
    from precision_tool.collect.run import run_collect

    total = plan.config.steps - (plan.request.restore_model_version or 0)
    hooks = [StepProgress(total)] if _is_tty() else []
    started = time.time()
    stop = StopOnInterrupt()
    try:
        with stop:
            return run_collect(plan, [*hooks, stop])
    except KeyboardInterrupt as exc:  # the error boundary adds what the dump kept to its one line
        exc.kept = _what_was_kept(plan.request.output, stop.finished, total, started)
        raise
    finally:
        for hook in hooks:
            hook.close()


def _what_was_kept(output: str, finished: int, total: int, started: float) -> str | None:
    """After Ctrl-C: what the dump at ``output`` holds, when this run wrote it, or that an earlier run's dump there
    is kept and this run's is ``output.partial`` (None when this run wrote neither)."""
    from precision_tool.dump.partial import partial_path

    from precision_tool.dump.runs import rank_path

    steps = f"the {finished} of {total} steps it finished" if finished else f"none of its {total} steps"
    run = os.path.isdir(output)  # (--ranks: rank 0's dump says what the run kept)
    dump = rank_path(output, 0) if run else output
    partial = partial_path(dump)
    try:
        if os.path.exists(partial) and os.stat(partial).st_mtime >= started - 1:  # (a run does not leave its
            # .partial but over a previous dump, kept: --force over a complete one)
            if run:
                return (f"{printable(output)} keeps the previous run; its rank<R>.h5.partial files keep {steps}, "
                        "marked incomplete")
            return (f"{printable(output)} keeps the previous dump; {printable(partial)} keeps {steps}, marked "
                    "incomplete")
        if os.stat(dump).st_mtime >= started - 1:
            return f"{printable(output)} keeps {steps}, marked incomplete"
    except OSError:
        return None
    return None


class StopOnInterrupt:
    """A hook that turns Ctrl-C into KeyboardInterrupt at the next step boundary.

    Python raises KeyboardInterrupt wherever the main thread is; inside a
    weakref callback or a finaliser (h5py closes objects in them) it is
    printed and lost, and the run goes on. A second Ctrl-C raises at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self.finished = 0  # steps that ended: what an interrupted dump keeps
        self._previous = None

    def __enter__(self) -> "StopOnInterrupt":
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C is not ours to handle
            self._previous = None
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested or Interruptible.depth:  # (a second Ctrl-C; an evaluation, which writes nothing)
            raise KeyboardInterrupt
        self.requested = True

    _handle.defers = True  # SIGTERM's handler (`precision_tool.cli.main.stop_on_sigterm`) leaves the stop to us

    def on_step_begin(self, step) -> None:
        self._stop_if_asked()

    def on_step_end(self, result) -> None:
        self.finished += 1
        self._stop_if_asked()

    def _stop_if_asked(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if exc_type is None:
            self._stop_if_asked()  # asked during the last step's close: the dump is complete, the run was stopped


class StepProgress:
    """A hook drawing a rich progress bar over the training steps (interactive terminals only)."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("collecting"), BarColumn(), MofNCompleteColumn(),
                                  TimeRemainingColumn(), transient=True)
        self._task = self._progress.add_task("steps", total=total)
        self._progress.start()

    def on_step_end(self, result) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()


def _command_line(ctx: click.Context) -> str:
    """The command as run, rebuilt from the parsed values (stored in the dump)."""
    words = ["precision-tool", ctx.info_name or "collect", ctx.params["model"]]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param, click.Argument) or value in (None, False, ()):
            continue
        flag = param.opts[-1] if param.opts[-1].startswith("--") else param.opts[0]
        for item in (value if isinstance(value, tuple) else (value,)):
            words += [flag] if value is True else [flag, str(item)]
    return " ".join(shlex.quote(_storable(w)) for w in words)


def _storable(word: str) -> str:
    """``word`` as UTF-8 can hold it: bytes of a file name that were not UTF-8 (kept by Python as lone
    surrogates, which no HDF5 string can store) are written as \\xNN."""
    try:
        word.encode("utf-8")
    except UnicodeEncodeError:
        return word.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return word


def _is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _result_line(result) -> str:
    from precision_tool.render.inspect_view import format_size

    overflow = f", overflow in {len(result.overflow_steps)} steps" if result.overflow_steps else ""
    if result.ops_recorded == 0 and result.filtered and result.mode != "overflow":
        overflow += " (no op matched the selection)"
    if result.resumed_from is not None:
        overflow += f", resumed from the checkpoint of step {result.resumed_from}"
    if result.evaluations:
        last = result.evaluations[-1]
        overflow += f", eval {last['metric']} {last['value']:.4g} after step {last['step']}"
    if result.checkpoints:
        overflow += f", {len(result.checkpoints)} checkpoint{'s' * (len(result.checkpoints) != 1)} written"
    if result.world_size is not None:
        overflow += (f" over {result.world_size} ranks (rank0.h5 ... rank{result.world_size - 1}.h5, run.json)"
                     if result.world_size > 1 else " over 1 rank (rank0.h5, run.json)")
    return (f"{result.path}: {result.steps_run} steps, {result.ops_recorded:,} ops and "
            f"{result.tensors_recorded:,} tensors recorded ({'+'.join(result.modes)}, role {result.role}), "
            f"{format_size(result.size_bytes)}{overflow}")
