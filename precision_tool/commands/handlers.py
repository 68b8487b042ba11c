"""The handlers of the dump-reading commands, one per batch/shell pair: ``handler(source, **values) -> result``.

A source is the batch command's files (`precision_tool.commands.sources.DumpFiles`) or the shell's session;
see `precision_tool.commands.spec`. Nothing here prints or draws: the results are dataclasses, delivered by
`precision_tool.render.exports.deliver` and drawn by type.
"""

from __future__ import annotations

import dataclasses

from precision_tool import defaults
from precision_tool.commands.results import AutoCheck, BaselineSaved, Comparison, InspectResult
from precision_tool.commands.sources import compare_options
from precision_tool.errors import InputError


def compare(source, cosine=None, limit=None, show_all=False, steps=None, op_glob=None, jobs=None,
            scheduler=None) -> Comparison:
    """`compare` / `vcs`: ops whose output cosine is at or below ``cosine``, first ``limit`` (0: all); --all."""
    layouts = _runs(source)
    if layouts:
        from precision_tool.commands.run_handlers import compare_run

        return compare_run(source, layouts, compare, cosine, limit, show_all, steps, op_glob, jobs)
    threshold = defaults.COSINE_THRESHOLD if cosine is None else cosine
    limit = defaults.LIST_LIMIT if limit is None else limit
    options = compare_options(steps, op_glob, jobs, scheduler)
    streamed = _stream(source, options, threshold, limit) if not show_all and limit > 0 else None
    selecting = steps is not None or bool(op_glob)  # a selection that chose nothing is the user's to fix, as in check
    if streamed is not None:  # a window of ops at a time: the flagged ops listed are kept or scored again
        if selecting and not streamed.compared_ops:
            raise _nothing_to(source, "compare", steps, op_glob)
        rows = streamed.select_flagged(threshold, limit)
        return Comparison(streamed, rows, threshold, limit, streamed.flagged_count(threshold), show_all, None)
    report = source.compare(options)
    if selecting and not report.compared_ops:
        raise _nothing_to(source, "compare", steps, op_glob)
    every = source.flagged(threshold, options)  # memoised per threshold by the shell
    rows = list(report.ops) if show_all else (list(every[:limit]) if limit > 0 else list(every))
    return Comparison(report, rows, threshold, limit, len(every), show_all, _zoom(source, report, threshold))


def _stream(source, options, threshold=None, limit=0, judge=None):
    """The comparison made a window of ops at a time (`StreamedReport`), or None: the source cannot, or the
    command delivers what reads every op (--plot, --junit)."""
    delivery = getattr(source, "delivery", None) or {}
    stream = getattr(source, "stream", None)
    if stream is None or delivery.get("plot") or delivery.get("junit"):
        return None
    return stream(options, threshold, limit, judge)


def _zoom(source, report, threshold):
    """The region to re-collect with full tensors when a side holds statistics only (`analysis.zoom`)."""
    from precision_tool.analysis.zoom import is_stats, zoom_region

    if not (is_stats(report.golden) or is_stats(report.target)):
        return None
    metadata = [getattr(source.dump(role), "metadata", None) or {} for role in ("golden", "target")]
    return zoom_region(report, *metadata, threshold)


def diagnose(source, compare_first=False, limit=None, show_all=False, scheduler=None) -> AutoCheck:
    """`diagnose` / `ac`: the root-cause verdict over the (cached) comparison; overflow entries cut to ``limit``.

    The verdict always needs the comparison, so it is made once either way; ``-c`` also lists the flagged ops,
    as `compare` does.
    """
    layouts = _runs(source)
    if layouts:
        from precision_tool.commands.run_handlers import diagnose_run

        return diagnose_run(source, layouts, diagnose, compare_first, limit, show_all)
    from precision_tool.analysis import diagnose as run_diagnosis

    golden, target = source.dump("golden"), source.dump("target")
    overflow, fusion_off = source.optional("overflow"), source.optional("fusion-off")
    for option, dump in (("--overflow", overflow), ("--fusion-off", fusion_off)):
        check_extra_dump(option, dump, golden, target)
    comparison = source.compare(compare_options(scheduler=scheduler))
    full = run_diagnosis(golden, target, overflow=overflow, fusion_off=fusion_off, comparison=comparison)
    limit = defaults.OVERFLOW_LIMIT if limit is None else limit
    diagnosis = full
    if limit and full.overflow is not None:
        cut = dataclasses.replace(full.overflow, entries=full.overflow.cut(limit))
        diagnosis = dataclasses.replace(full, overflow=cut)
    flagged = compare(source) if compare_first else None
    return AutoCheck(diagnosis, flagged, limit, show_all, full=full)


def check_extra_dump(option: str, dump, golden, target) -> None:
    """An --overflow or --fusion-off dump is another run of the target's model: InputError when it is the golden
    or target file itself, or a golden run (it was taken as one, and said nothing)."""
    import os

    if dump is None:
        return
    path = str(getattr(dump, "path", ""))
    for role, other in (("golden", golden), ("target", target)):
        try:
            same = bool(path) and os.path.samefile(path, str(getattr(other, "path", "")))
        except (OSError, ValueError):
            same = False
        if same:
            raise InputError(path, f"is the {role} dump given again; {option} takes another run of the target's "
                                   f"model ({'in overflow mode' if option == '--overflow' else 'with fusion off'})")
    if (getattr(dump, "metadata", None) or {}).get("role") == "golden":
        raise InputError(path, f"is a golden run; {option} takes a run of the target's device "
                               f"({'in overflow mode' if option == '--overflow' else 'with fusion off'})")


def check(source, min_cosine=None, max_abs_err=None, baseline_file=None, judge_inputs=False, steps=None,
          op_glob=None, jobs=None, scheduler=None):
    """`check`: the CI gate's judgement of every matched op output (a `CheckResult`)."""
    layouts = _runs(source)
    if layouts:
        from precision_tool.commands.run_handlers import check_run

        return check_run(source, layouts, check, min_cosine, max_abs_err, baseline_file, judge_inputs, steps, op_glob, jobs)
    from precision_tool.compare.baseline import load_baseline
    from precision_tool.compare.check import CheckCriteria, CheckJudge, check_report

    baseline = load_baseline(baseline_file) if baseline_file is not None else None  # fail fast, before reading
    criteria = CheckCriteria(
        min_cosine=defaults.CHECK_MIN_COSINE if min_cosine is None else min_cosine, max_abs_err=max_abs_err,
        baseline=baseline, absolute_on_baselined=min_cosine is not None or max_abs_err is not None,
        judge_inputs=judge_inputs)
    options = compare_options(steps, op_glob, jobs, scheduler)
    judge = CheckJudge(criteria)
    streamed = _stream(source, options, judge=judge)  # judged as it streams
    report = streamed if streamed is not None else source.compare(options)
    if not report.compared_ops:
        raise _nothing_to(source, "check", steps, op_glob)
    result = judge.result(streamed) if streamed is not None else check_report(report, criteria)
    if getattr(source, "allow_incomplete", None) is None:  # the shell's check, which judges an unfinished run
        result.report.notes.extend(n for n in _unfinished(source) if n not in result.report.notes)  # as it is
    if baseline is not None and baseline.entries and result.baseline_missing == len(baseline.entries):
        # (every tensor judged by the absolute criteria alone: a gate that passes says nothing of the baseline)
        raise InputError(baseline_file, f"shares no tensor with this comparison: its {len(baseline.entries)} "
                                        "tensors name other ops or steps (a baseline of other runs?)")
    return result


def baseline(source, output, steps=None, op_glob=None, jobs=None, scheduler=None) -> BaselineSaved:
    """`baseline`: save the per-tensor metrics of the comparison to ``output`` for `check --baseline`."""
    from precision_tool.commands.run_handlers import refuse_run
    from precision_tool.compare.baseline import baseline_from_report, save_baseline
    from precision_tool.outputs import replacing

    refuse_run(source, "baseline")

    report = source.compare(compare_options(steps, op_glob, jobs, scheduler))
    if not report.ops:
        raise _nothing_to(source, "save", steps, op_glob)
    saved = baseline_from_report(report)
    with replacing(output, source.inputs) as temporary:  # save_baseline writes the file in place
        save_baseline(saved, temporary)
    return BaselineSaved(len(saved.entries), len(report.ops), output)


def _unfinished(source) -> list[str]:
    """What the preflight says of a run that is incomplete or being replaced, which the batch check refuses."""
    from precision_tool.compare.preflight import run_problems

    golden, target = source._compared_dumps()
    return [p.message for p in run_problems(golden, target, allow_incomplete=True)
            if p.code in ("incomplete", "being-replaced")]


def _nothing_to(source, verb: str, steps=None, op_glob=None) -> InputError:
    """The error of a comparison that compared nothing: what --steps/--ops selected, when they did, else that the
    two dumps share no tensor."""
    chosen = [f"--steps {_ranges(steps)}" if steps is not None else "", f"--ops {op_glob!r}" if op_glob else ""]
    if not any(chosen):
        return InputError(source.path("target"), f"no tensor matches the golden dump {source.path('golden')}: "
                                                 f"nothing to {verb}")
    role, recorded = "golden", None
    if steps is not None:  # the side whose steps the selection misses (a target that stopped early, a dump of
        held = {side: _held_steps(source.dump(side)) for side in ("golden", "target")}  # steps=[...]), else golden
        role = next((side for side in ("golden", "target") if held[side] is not None and not set(steps) & held[side]),
                    "golden")
        recorded = held[role]
    held_text = f" (it holds steps {_ranges(recorded)})" if recorded else ""
    return InputError(source.path(role), f"no op in {' and '.join(c for c in chosen if c)}{held_text}: "
                                         f"nothing to {verb}")


def _held_steps(dump) -> set[int] | None:
    """The step numbers ``dump`` holds (a dump recorded with steps=[1, 2] holds 1 and 2), or None unknown."""
    numbers = getattr(dump, "step_numbers", None)
    if callable(numbers):
        return set(numbers())
    complete = getattr(dump, "steps_complete", None)
    return set(range(complete)) if complete is not None else None


def _ranges(steps) -> str:
    """{0, 1, 2, 5} -> "0-2,5": a step selection as --steps takes it."""
    parts, ordered = [], sorted(steps)
    for i, step in enumerate(ordered):
        if i and step == ordered[i - 1] + 1:
            parts[-1][1] = step
        else:
            parts.append([step, step])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def _runs(source) -> dict | None:
    """The run layouts when the source's golden and target are runs of several ranks (the shell's never are)."""
    runs = getattr(source, "runs", None)
    return runs() if callable(runs) else None


def ranks(source, limit=None):
    """`ranks RUN`: are the tensors data parallelism keeps identical the same on every rank? (a ConsistencyReport)"""
    from contextlib import ExitStack

    from precision_tool.analysis.ranks import check_consistency
    from precision_tool.dump.reader import open_dump
    from precision_tool.dump.runs import check_rank_metadata, find_run

    layout = find_run(source.path("run"))
    with ExitStack() as stack:
        dumps = []
        for rank, path in enumerate(layout.paths):
            dump = stack.enter_context(open_dump(path))
            check_rank_metadata(path, dump.metadata, rank, layout.world_size)
            dumps.append(dump)
        limit = defaults.LIST_LIMIT if limit is None else limit
        return check_consistency(layout.path, dumps, limit or None)


def inspect(source, role=None) -> InspectResult:
    """`inspect`: one dump's summary (the shell's ROLE, default the target, else the first loaded)."""
    role = role or source.primary_role or "target"
    return InspectResult(role, source.dump(role).summary())


def precheck(source, expect=()):
    """`precheck`: the pre-tuning checklist against the two runs' settings (a `PrecheckResult`)."""
    from precision_tool.analysis.precheck import precheck as run_precheck

    layouts = _runs(source)
    if layouts:  # every rank runs the same settings: rank 0 stands for the run
        rank0 = source.rank(0, layouts)
        source.keep_open(rank0)
        source = rank0
    return run_precheck(source.dump("golden"), source.dump("target"), source.optional("golden2"), tuple(expect))
