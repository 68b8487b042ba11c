"""The specs of the commands that read dumps, for both front ends (`precision_tool.commands.spec`).

The batch CLI (`precision_tool.cli.batch`) and the shell (`precision_tool.repl.commands`) generate their
commands from these; the shell adds its own commands (ls, ni, pt, cp, of, fu, rerun) as specs of the same kind.
Importing this module imports click and the option types only: handlers are named, and imported when run.
"""

from __future__ import annotations

import click

from precision_tool.commands.options import (COSINE, COSINE_OPTION, DUMP, LIMIT_OPTION, OUT_FILE, READ_FILE,
                                             TOLERANCE, RunFolder, allow_incomplete_param, format_param, option,
                                             output_param, plot_param, scheduler_param, selection_params)
from precision_tool.commands.spec import BATCH, CommandSpec, Registry
from precision_tool.defaults import CHECK_MIN_COSINE, OVERFLOW_LIMIT

_HANDLERS = "precision_tool.commands.handlers"
ROLES = ("golden", "target", "overflow", "fusion-off")


def _golden_target() -> tuple:
    return (("golden", click.Argument(["golden"], type=DUMP)), ("target", click.Argument(["target"], type=DUMP)))


def _expect_callback(ctx, param, values):
    from precision_tool.analysis.precheck import SETTING_NAMES

    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETTING_NAMES]
    if unknown:
        raise click.BadParameter(f"unknown setting {unknown[0]!r}; valid: {', '.join(SETTING_NAMES)}")
    return tuple(names)


_SETTINGS = ("device, precision_mode, modify_mixlist, overflow_mode, fusion_switch, loss_scale, boost, "
             "accelerate_train_mode, seed, batch_size, model, optimizer, lr, steps")  # analysis.precheck.SETTING_NAMES (not imported by --help)

COMPARE = CommandSpec(
    "compare", "Score every op of a target dump against a golden dump.",
    """Compare every tensor of TARGET with its GOLDEN counterpart.

    Ops are matched by step, name, direction and tensor slot; a fused op
    through the ops it replaced. Lists the ops whose output cosine is at or
    below -c (first -l of them), or every op with --all, in execution order.
    GOLDEN and TARGET may be runs of several ranks (directories of rank
    dumps): rank r is compared with rank r, a table gives each rank's
    flagged ops, first flagged op and lowest cosine, and the rank that
    diverges first is named and listed.
    Exit status 0 (use `check` for a CI gate), 2 on a bad input file.
    """,
    f"{_HANDLERS}:compare",
    params=(option(*COSINE_OPTION[0], **COSINE_OPTION[1]), option(*LIMIT_OPTION[0], **LIMIT_OPTION[1]),
            option("--all", "show_all", is_flag=True, help="List every compared op, not only flagged ones."),
            format_param(("table", "csv", "json"), "A table with a chart, CSV, or JSON."),
            output_param(), plot_param(), *selection_params()),
    inputs=_golden_target(),
    shell_name="vcs", shell_summary="Ops whose output cosine is at or below -c, in execution order, at most -l.",
    delivered=("fmt", "output", "plot"), outputs=("output", "plot"),
    shell_help="""Compare summary: ops whose output cosine against golden is at or below -c, in execution order,
    at most -l (0: all), or every compared op with --all; the options of `precision-tool compare`. The
    comparison of the whole run is made once and cached; --steps and --ops make (and cache) one of
    their own. The table leaves out compare's full-run chart (it is in -o FILE's table).
    """,
)

DIAGNOSE = CommandSpec(
    "diagnose", "Name the op where error is introduced, and why.",
    """Name the op where error is introduced, and why.

    Reads the GOLDEN and TARGET dumps (and optionally an overflow-mode and a
    fusion-off dump of the target run), and prints the root-cause verdict
    first, then the overflow summary, fusion suspects, comparison summary,
    the attribution of the ops up to the culprit (--all: every scored op)
    and notes, as the shell's `ac` does. Given two runs of several ranks,
    every rank is compared and the rank that diverges first is diagnosed.
    """,
    f"{_HANDLERS}:diagnose",
    params=(format_param(help_text="A rich table, or JSON for scripts."),
            option("-c", "--compare", "compare_first", is_flag=True,
                   help="Also list the flagged ops, as compare and the shell's vcs do (the shell's ac -c)."),
            option("-l", "--limit", type=click.IntRange(min=0), default=None,
                   help=f"Overflow entries to show (0: all; default {OVERFLOW_LIMIT}, as ac -l)."),
            option("-a", "--all", "show_all", is_flag=True,
                   help="Every scored op in the attribution table, not only those up to the culprit."),
            scheduler_param()),
    inputs=(*_golden_target(),
            ("overflow", option("--overflow", type=DUMP, help="An overflow-mode dump of the target run.")),
            ("fusion-off", option("--fusion-off", "fusion_off", type=DUMP,
                                  help="The target run dumped with fusion switched off."))),
    batch_params=(allow_incomplete_param(),),
    shell_name="ac",
    shell_summary="Auto check: overflow, fusion, comparison, notes, then the root-cause verdict.",
    delivered=("fmt",),
    shell_help="""Auto check: the root-cause verdict first, then the pre-check of the runs' settings, the overflow
    summary, fusion suspects, comparison summary, the attribution of the ops up to the culprit (--all: every
    scored op) and precision-mode and cast notes, as `precision-tool diagnose` prints them. The comparison
    the verdict needs is made once and cached; -c also lists the flagged ops as vcs does.
    """,
)

CHECK = CommandSpec(
    "check", "CI gate: exit 1 when a tensor fails its tolerance.",
    """Exit 1 when a tensor of TARGET fails its tolerance against GOLDEN.

    Every matched op output is judged: cosine, max abs error, NaN/inf the
    golden tensor lacks, shape. Pairs shown "not judged" (workspaces,
    near-zero cancellations) are skipped, with the reason. Runs of several
    ranks are judged rank by rank (a table per rank; the run fails when any
    rank does). Exit status 0 all pass, 1 a tensor fails, 2 usage or input
    error.
    """,
    f"{_HANDLERS}:check",
    params=(option("--min-cosine", type=COSINE, default=None,
                   help=f"A tensor fails below this cosine (default {CHECK_MIN_COSINE}; with --baseline, "
                        "only tensors the baseline lacks unless given)."),
            option("--max-abs-err", type=TOLERANCE, default=None,
                   help="A tensor fails above this max absolute error (default: not checked)."),
            option("--baseline", "baseline_file", type=READ_FILE, default=None,
                   help="Fail when a tensor got worse than in this baseline file (see `precision-tool baseline`)."),
            option("--junit", type=OUT_FILE, default=None, help="Also write JUnit XML, one testcase per op, to FILE."),
            format_param(help_text="A table with a PASSED/FAILED footer, or JSON."),
            option("--judge-inputs", is_flag=True,
                   help="Judge op inputs too (by default an input is judged as the output of the op that wrote it)."),
            *selection_params()),
    inputs=_golden_target(),
    batch_params=(allow_incomplete_param(),),
    delivered=("fmt", "junit"), outputs=("junit",), reads=("baseline_file",),
    shell_summary="The CI gate's judgement of the loaded comparison: failing tensors, PASSED/FAILED.",
    shell_help="""Judge every matched op output of the comparison as `precision-tool check` does: cosine, max abs
    error, NaN/inf golden lacks, shape; failing tensors in execution order, then PASSED or FAILED. (The shell goes
    on either way; the batch command exits 1 on a failure.)
    """,
)

BASELINE = CommandSpec(
    "baseline", "Save per-op metrics for later `check --baseline`.",
    "Save the per-tensor metrics of TARGET against GOLDEN for `check --baseline`.",
    f"{_HANDLERS}:baseline",
    params=(output_param("The baseline file to write (JSON).", required=True),
            format_param(help_text="A line saying what was saved, or JSON."),
            *selection_params()),
    inputs=_golden_target(),
    batch_params=(allow_incomplete_param(),),
    front_ends=frozenset({BATCH}),
    delivered=("fmt",), outputs=("output",),
)

INSPECT = CommandSpec(
    "inspect", "Summarise a dump: metadata, steps, ops, overflow, loss.",
    """Show a dump's run metadata, steps, op and tensor counts, overflowing ops,
    loss and loss-scale history, and size. Works on incomplete dumps (a killed
    run); never modifies the file.

    \b
    JSON keys include: schema_version, complete, steps_complete, ops, tensors,
    overflow_ops, overflow_steps, loss, loss_scale, accelerate_switch_step,
    size_bytes, model, device, precision_mode, mode, role, first_overflows.
    """,
    f"{_HANDLERS}:inspect",
    params=(format_param(help_text="Rich table, or one JSON object."),),
    inputs=(("dump", click.Argument(["file"], type=click.Path(dir_okay=True))),),
    shell_params=(click.Argument(["role"], required=False, type=click.Choice(list(ROLES))),),
    shell_summary="A loaded dump's run, counts, overflows and loss history.",
    delivered=("fmt",),
    shell_help="""A loaded dump's run metadata, steps, op and tensor counts, overflowing ops, loss and loss-scale
    history and size, as `precision-tool inspect` shows them (ROLE: default the target, else the first loaded).
    """,
)

PRECHECK = CommandSpec(
    "precheck", "Before tuning: do the two runs differ only where intended?",
    """Check that GOLDEN and TARGET differ only where intended, before tuning.

    Holds the pre-tuning checklist against the two dumps' recorded settings:
    device, precision mode and mix list, overflow mode, fusion switch, loss
    scale, boost, accelerate_train_mode, seed, batch size, model, optimizer,
    learning rate and steps. Each is the same, differs (golden X, target Y)
    or was not recorded. Differences that follow from the device (golden
    against npu: device, overflow mode, fusion) are intended; declare any
    other with --expect. Exit 1 when an undeclared difference is found.
    """,
    f"{_HANDLERS}:precheck",
    params=(option("--expect", multiple=True, callback=_expect_callback, metavar="NAME[,NAME]",
                   help=f"Settings meant to differ (repeatable): {_SETTINGS}."),
            format_param(help_text="A table with a PASSED/FAILED footer, or JSON.")),
    inputs=(*_golden_target(),
            ("golden2", option("--golden2", type=DUMP, default=None,
                               help="A second golden run of the same settings: the reference must repeat it "
                                    "exactly."))),
    delivered=("fmt",), shell_summary="The pre-tuning checklist: do the loaded runs differ only where intended?",
    shell_help="""The pre-tuning checklist against the loaded golden and target dumps' recorded settings, as
    `precision-tool precheck` holds it: each setting the same, different (golden X, target Y) or not recorded;
    declare intended differences with --expect.
    """,
)

RANKS = CommandSpec(
    "ranks", "Check that the ranks of a data-parallel run stay identical.",
    """Check, without a golden run, that the ranks of RUN agree.

    RUN is a run directory (rank0.h5, rank1.h5, ... and run.json), as
    `collect --ranks N` and `precision_tool.torch.dump` under
    torch.distributed write it. Data parallelism keeps some tensors
    bitwise identical on every rank: the outputs of gradient all-reduces
    (and broadcasts, all-gathers) and every tensor an optimizer update reads
    and writes. They are compared across the ranks step by step, and the
    first op where a rank departs from the others is named (for an
    all-reduce, the rank whose output is not the mean or sum of the ranks'
    inputs). Exit status 0 consistent, 1 the ranks disagree, 2 usage or
    input error (no rank dumps, a missing rank).
    """,
    f"{_HANDLERS}:ranks",
    params=(option("-l", "--limit", type=click.IntRange(min=0), default=None,
                   help="Show at most this many inconsistent tensors, in execution order (default 10; 0: all)."),
            format_param(help_text="A table with a CONSISTENT/INCONSISTENT footer, or JSON.")),
    inputs=(("run", click.Argument(["run"], type=RunFolder())),),
    front_ends=frozenset({BATCH}), delivered=("fmt",),
)

REGISTRY = Registry().add(COMPARE, DIAGNOSE, CHECK, BASELINE, INSPECT, PRECHECK, RANKS)
SPECS = REGISTRY.specs
