"""``precision-tool check`` (the CI gate) and ``precision-tool baseline``.

check exits 0 when every matched tensor passes, 1 when one fails (failing
ops printed, the first first), 2 on a usage or input error, including dumps
with no tensor in common (nothing to check is not a pass), dumps of different
models, golden and target swapped, and an incomplete run or one still being
written unless --allow-incomplete (`precision_tool.compare.preflight`).
"""

from __future__ import annotations

import click

from precision_tool.cli.compare import (DUMP, OUT_FILE, allow_incomplete_option, check_outputs, run_compare,
                                        selection_options)
from precision_tool.commands.options import COSINE, TOLERANCE
from precision_tool.defaults import CHECK_MIN_COSINE
from precision_tool.errors import InputError


@click.command("check", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("golden", type=DUMP)
@click.argument("target", type=DUMP)
@click.option("--min-cosine", type=COSINE, default=None,
              help=f"A tensor fails below this cosine (default {CHECK_MIN_COSINE}; with --baseline, "
                   "only tensors the baseline lacks unless given).")
@click.option("--max-abs-err", type=TOLERANCE, default=None,
              help="A tensor fails above this max absolute error (default: not checked).")
@click.option("--baseline", "baseline_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Fail when a tensor got worse than in this baseline file (see `precision-tool baseline`).")
@click.option("--junit", type=OUT_FILE, default=None, help="Also write JUnit XML, one testcase per op, to FILE.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="A table with a PASSED/FAILED footer, or JSON.")
@click.option("--judge-inputs", is_flag=True,
              help="Judge op inputs too (by default an input is judged as the output of the op that wrote it).")
@allow_incomplete_option
@selection_options
def check(golden, target, min_cosine, max_abs_err, baseline_file, junit, fmt, judge_inputs, allow_incomplete, steps,
          op_glob, jobs):
    """Exit 1 when a tensor of TARGET fails its tolerance against GOLDEN.

    Every matched op output is judged: cosine, max abs error, NaN/inf the
    golden tensor lacks, shape. Pairs shown "not judged" (workspaces,
    near-zero cancellations) are skipped, with the reason. Exit status 0 all
    pass, 1 a tensor fails, 2 usage or input error.
    """
    from precision_tool.compare.baseline import load_baseline
    from precision_tool.compare.check import CheckCriteria, check_report

    inputs = (golden, target, baseline_file)
    check_outputs(inputs, junit=junit)
    baseline = load_baseline(baseline_file) if baseline_file is not None else None  # fail fast, before reading
    criteria = CheckCriteria(
        min_cosine=CHECK_MIN_COSINE if min_cosine is None else min_cosine, max_abs_err=max_abs_err,
        baseline=baseline, absolute_on_baselined=min_cosine is not None or max_abs_err is not None,
        judge_inputs=judge_inputs)
    report = run_compare(golden, target, steps, op_glob, jobs, allow_incomplete)
    if not report.ops:
        raise InputError(target, f"no tensor matches the golden dump {golden}: nothing to check")
    result = check_report(report, criteria)
    if junit is not None:
        from precision_tool.outputs import write_text
        from precision_tool.render.junit import to_junit_xml

        write_text(junit, to_junit_xml(result), inputs)
    if fmt == "json":
        from precision_tool.render.check_view import check_json

        click.echo(check_json(result), nl=False)
    else:
        from rich.console import Console

        from precision_tool.render.check_view import check_view

        Console(highlight=False).print(check_view(result))
    # Through the error boundary, not click's Exit: `main` maps RegressionFound to exit status 1.
    result.raise_if_failed()


@click.command("baseline", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("golden", type=DUMP)
@click.argument("target", type=DUMP)
@click.option("-o", "--output", type=OUT_FILE, required=True, help="The baseline file to write (JSON).")
@allow_incomplete_option
@selection_options
def baseline(golden, target, output, allow_incomplete, steps, op_glob, jobs):
    """Save the per-tensor metrics of TARGET against GOLDEN for `check --baseline`."""
    from precision_tool.compare.baseline import baseline_from_report, save_baseline
    from precision_tool.outputs import replacing

    inputs = (golden, target)
    check_outputs(inputs, output=output)
    report = run_compare(golden, target, steps, op_glob, jobs, allow_incomplete)
    if not report.ops:
        raise InputError(target, f"no tensor matches the golden dump {golden}: nothing to save")
    saved = baseline_from_report(report)
    with replacing(output, inputs) as temporary:  # save_baseline writes the file in place
        save_baseline(saved, temporary)
    click.echo(f"baseline of {len(saved.entries)} tensors in {len(report.ops)} ops written to {output}")
