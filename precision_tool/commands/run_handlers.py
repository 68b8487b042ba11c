"""compare, check and diagnose over runs of several ranks: rank r of the target paired with rank r of golden.

`precision_tool.commands.handlers` hands a source whose golden and target are run directories here
(``source.runs()``, `precision_tool.dump.runs`). Each rank is compared by the single-dump handler, over a
source of its own; the results keep one row per rank (`RankRow`) and name the rank that diverges first:
the one whose first flagged op comes earliest, by (step, exec index), the lowest rank on a tie.
"""

from __future__ import annotations

import math

from precision_tool import defaults
from precision_tool.commands.results import RankRow, RunCheck, RunComparison, RunDiagnosis
from precision_tool.errors import ConfigError, InputError


def _rank_source(source, layouts: dict, rank: int):
    """Rank ``rank``'s source, its dumps' recorded rank and world size checked against the run's."""
    from precision_tool.dump.runs import check_rank_metadata

    sub = source.rank(rank, layouts)
    try:
        for role, layout in layouts.items():
            check_rank_metadata(layout.paths[rank], sub.dump(role).metadata, rank, layout.world_size)
    except BaseException:
        sub.close()
        raise
    return sub


def _each_rank(source, layouts: dict, run_one, keep=lambda rank, result: False):
    """``run_one(rank_source)`` for every rank, in rank order; a rank's source stays open while ``keep`` says."""
    results = []
    for rank in range(layouts["golden"].world_size):
        sub = _rank_source(source, layouts, rank)
        try:
            result = run_one(sub)
        except BaseException:
            sub.close()
            raise
        results.append(result)
        if keep(rank, result):
            source.keep_open(sub)
        else:
            sub.close()
    return results


def first_rank(rows: list[RankRow]) -> int | None:
    """The rank whose first flagged op comes first (step, exec index, then rank); None when none is flagged."""
    diverging = [row for row in rows if row.diverges]
    if not diverging:
        return None
    return min(diverging, key=lambda row: (row.first_step, row.first_exec_index, row.rank)).rank


def _min_cosine(report) -> float | None:
    cosines = [op.worst_output_cosine for op in report.ops]
    finite = [c for c in cosines if c is not None and not math.isnan(c)]
    return min(finite) if finite else None


def comparison_row(rank: int, target: str, report, flagged: list) -> RankRow:
    first = flagged[0] if flagged else None
    return RankRow(rank, target, len(report.ops), len(flagged),
                   first.step if first else None, first.exec_index if first else None,
                   first.name if first else "", first.direction if first else "", _min_cosine(report))


def compare_run(source, layouts: dict, compare, cosine=None, limit=None, show_all=False, steps=None, op_glob=None,
                jobs=None) -> RunComparison:
    """`compare` of two runs: a row per rank, and the listing of the rank that diverges first."""
    threshold = defaults.COSINE_THRESHOLD if cosine is None else cosine
    comparisons = _each_rank(source, layouts, lambda sub: compare(sub, cosine, limit, show_all, steps, op_glob, jobs),
                             keep=lambda rank, result: True)  # a listing may read its dumps when drawn
    rows = [comparison_row(rank, layouts["target"].paths[rank], c.report,
                           [op for op in c.report.ops if op.flagged(threshold)])
            for rank, c in enumerate(comparisons)]
    first = first_rank(rows)
    shown = 0 if first is None else first
    return RunComparison(layouts["golden"].path, layouts["target"].path, layouts["golden"].world_size, threshold,
                         rows, first, comparisons[shown], shown)


def check_run(source, layouts: dict, check, min_cosine=None, max_abs_err=None, baseline_file=None, judge_inputs=False,
              steps=None, op_glob=None, jobs=None) -> RunCheck:
    """`check` of two runs: every rank judged; the run fails when any rank does."""
    if baseline_file is not None:
        raise ConfigError("--baseline holds one dump pair's metrics: check a run's ranks against it one at a time "
                          "(RUN/rank0.h5 ...)")
    results = _each_rank(source, layouts, lambda sub: check(sub, min_cosine, max_abs_err, None, judge_inputs,
                                                            steps, op_glob, jobs))
    rows = []
    for rank, result in enumerate(results):
        first = result.first_failure
        rows.append(RankRow(rank, layouts["target"].paths[rank], result.checked, len(result.failures),
                            first.step if first else None, first.exec_index if first else None,
                            first.op if first else "", first.direction if first else "",
                            _min_cosine(result.report)))
    return RunCheck(layouts["golden"].path, layouts["target"].path, layouts["golden"].world_size, rows,
                    first_rank(rows), results)


def rank_rows(source, layouts: dict, threshold: float) -> list[RankRow]:
    """Every rank's comparison summed up in a row (each rank's dumps closed once compared)."""
    rows = []
    for rank in range(layouts["golden"].world_size):
        sub = _rank_source(source, layouts, rank)
        try:
            rows.append(comparison_row(rank, layouts["target"].paths[rank], sub.compare(), sub.flagged(threshold)))
        finally:
            sub.close()
    return rows


def diagnose_run(source, layouts: dict, diagnose, compare_first=False, limit=None, show_all=False) -> RunDiagnosis:
    """`diagnose` of two runs: compare every rank, then diagnose the rank that diverges first (rank 0 if none)."""
    threshold = defaults.COSINE_THRESHOLD
    rows = rank_rows(source, layouts, threshold)
    first = first_rank(rows)
    chosen = 0 if first is None else first
    sub = _rank_source(source, layouts, chosen)
    source.keep_open(sub)
    check = diagnose(sub, compare_first, limit, show_all)
    return RunDiagnosis(layouts["golden"].path, layouts["target"].path, layouts["golden"].world_size, threshold,
                        rows, first, chosen, check)


def refuse_run(source, command: str) -> None:
    """InputError for a command that reads one dump pair, when it was given runs."""
    runs = source.runs() if hasattr(source, "runs") else None
    if runs:
        raise InputError(runs["target"].path, f"is a run of {runs['target'].world_size} ranks; {command} reads one "
                                              "dump pair: give one rank's dumps (RUN/rank0.h5)")
