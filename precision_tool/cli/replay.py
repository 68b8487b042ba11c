"""``precision-tool replay CHECKPOINT_DIR --step N -o OUT_DIR``: dump one step of a long run and diagnose it."""

from __future__ import annotations

import json
import shlex
import sys

import click

from precision_tool.commands.options import OutputFolder
from precision_tool.engine.formats import OVERFLOW_MODES
from precision_tool.engine.precision import PRECISION_MODES, PRECISION_MODES_V2


@click.command("replay", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint_dir", type=click.Path(file_okay=False, path_type=str))
@click.option("--step", type=click.IntRange(min=0), default=None, metavar="N",
              help="The step to replay (its checkpoint ckpt-N holds the state before it).  [default: the latest]")
@click.option("-o", "--output", "output_dir", required=True, type=OutputFolder(path_type=str),
              help="Directory for golden.h5 and target.h5 (created if missing).")
@click.option("--device", type=click.Choice(["golden", "npu"]), default=None,
              help="The target device.  [default: the run's]")
@click.option("--precision-mode", type=click.Choice(PRECISION_MODES), default=None, metavar="MODE",
              help="Replace the run's npu precision_mode.")
@click.option("--precision-mode-v2", type=click.Choice(PRECISION_MODES_V2), default=None, metavar="MODE",
              help="Replace the run's npu precision_mode_v2.")
@click.option("--overflow-mode", type=click.Choice(OVERFLOW_MODES), default=None, help="Replace the overflow mode.")
@click.option("--fusion-switch", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A fusion_switch.cfg JSON file replacing the run's fusion settings.")
@click.option("--modify-mixlist", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A modify_mixlist JSON replacing the run's mix list changes.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="The diagnosis as a rich view, or JSON for scripts.")
@click.option("--force", is_flag=True, help="Replace golden.h5 and target.h5 if OUTPUT already holds them.")
def replay(checkpoint_dir, step, output_dir, device, precision_mode, precision_mode_v2, overflow_mode,
           fusion_switch, modify_mixlist, fmt, force):
    """Replay one step of a run from its checkpoint, on golden and on the target, and diagnose it.

    CHECKPOINT_DIR is a collect --checkpoint-dir. The state before step N and
    step N's stored batch are restored into two sessions: one on the golden
    device, one on the device the run trained on (from the checkpoint's run
    settings; the options replace single settings). Each writes a full dump
    of that step alone into OUTPUT, and the pair is diagnosed as `diagnose`
    does. Exit status 0 whatever the verdict; 2 on a bad checkpoint or option.
    """
    from precision_tool.collect.replay import DeviceOverrides, ReplayRequest
    from precision_tool.collect.replay import replay as run_replay

    overrides = DeviceOverrides(device, precision_mode, precision_mode_v2, overflow_mode, fusion_switch,
                                modify_mixlist)
    request = ReplayRequest(checkpoint_dir, output_dir, step, overrides, overwrite=force,
                            command=shlex.join(["precision-tool", "replay", *sys.argv[2:]]))
    result = run_replay(request)
    from precision_tool.analysis import diagnose as run_diagnosis
    from precision_tool.dump.reader import open_dump

    with open_dump(result.golden) as g, open_dump(result.target) as t:
        diagnosis = run_diagnosis(g, t)
    if fmt == "json":
        from precision_tool.render.shell_views import diagnosis_dict

        click.echo(json.dumps({"replay": _replay_dict(result), "diagnosis": diagnosis_dict(diagnosis)},
                              indent=2, allow_nan=False))
        return
    from precision_tool.cli.consoles import console as pipe_console
    from precision_tool.render.shell_views import diagnosis as diagnosis_view

    click.echo(f"replayed step {result.step} from {result.checkpoint}: golden loss {result.golden_loss:.6g} "
               f"-> {result.golden}; target ({result.target_device.get('effective_precision_mode')}) loss "
               f"{result.target_loss:.6g}{', overflow' if result.target_overflow else ''} -> {result.target}")
    pipe_console().print(diagnosis_view(diagnosis))


def _replay_dict(result) -> dict:
    import dataclasses
    import math

    values = dataclasses.asdict(result)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
