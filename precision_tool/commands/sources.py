"""`DumpFiles`: the batch commands' source of dumps, the files named on the command line, by role.

The shell's source is its session; both offer what a handler uses (`precision_tool.commands.spec`). Dumps are
opened on first use, read-only, and closed when the source is.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Callable


def compare_options(steps=None, op_glob: str | None = None, jobs: int | None = None, scheduler: str | None = None):
    """The comparator's options for --steps, --ops, --jobs and --scheduler; None when all are at their defaults."""
    if steps is None and op_glob is None and jobs is None and scheduler is None:
        return None
    from precision_tool.compare.comparator import CompareOptions
    from precision_tool.defaults import COMPARE_JOBS

    return CompareOptions(steps=steps, ops=op_glob, jobs=jobs or COMPARE_JOBS, scheduler=scheduler)


STREAM_ENV = "PRECISION_TOOL_STREAM"  # "0": compare, check and vcs build the whole comparison in memory


def streamed_report(golden, target, options=None, threshold: float | None = None, limit: int = 0, judge=None,
                    progress=None):
    """The two dumps compared a window at a time (`precision_tool.compare.stream`) into a `StreamedReport`; None
    when they need the whole comparison in memory: not two dump files, a side with statistics only (the zoom
    region reads every op), fused ops matched through the ops they replaced, unusual tables. Nothing is shown
    before the comparison ends, so comparing again the old way shows the same, errors included."""
    import os

    from precision_tool.compare.comparator import CompareOptions
    from precision_tool.compare.digest import DigestSink
    from precision_tool.compare.stream import stream_compare, streams
    from precision_tool.defaults import COSINE_THRESHOLD
    from precision_tool.dump.windows import TablesUnsupported
    from precision_tool.errors import InputError

    options = options or CompareOptions()
    if os.environ.get(STREAM_ENV) == "0" or not streams(golden, target, options):
        return None
    if any("stats" in dump.modes for dump in (golden, target)):
        return None
    sink = DigestSink(COSINE_THRESHOLD if threshold is None else threshold, limit, judge)
    try:
        outcome = stream_compare(golden, target, options, sink, progress)
    except (TablesUnsupported, InputError, ValueError, KeyError, IndexError):  # the old way says what is wrong
        return None
    return sink.report(outcome)


class DumpFiles:
    """The dumps of one batch command: role -> path (None: not given)."""

    def __init__(self, paths: dict[str, str | None], *, allow_incomplete: bool | None = None,
                 progress: Callable | None = None, warn: Callable[[str], None] | None = None):
        self.paths = dict(paths)
        self.allow_incomplete = allow_incomplete  # None: no preflight before comparing
        self.progress = progress  # a context manager factory yielding a progress callback (or None)
        self.warn = warn or (lambda message: None)
        self._stack = ExitStack()
        self._open: dict[str, object] = {}
        self._comparisons: dict = {}
        self._flagged: dict = {}
        self._preflighted = False
        self.streaming = True  # False: always the whole comparison (the ranks of a run)
        self.delivery: dict = {}  # what the command delivers (`CommandSpec.run` says): --plot and --junit read every op

    def __enter__(self) -> "DumpFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    @property
    def inputs(self) -> tuple:
        return tuple(path for path in self.paths.values() if path is not None)

    @property
    def primary_role(self) -> str | None:
        return next((role for role, path in self.paths.items() if path is not None), None)

    def path(self, role: str) -> str:
        return str(self.paths[role])

    def dump(self, role: str):
        if role not in self._open:
            from precision_tool.dump.reader import open_dump

            path = self.paths.get(role)
            if path is None:
                raise KeyError(f"no {role} dump given")  # a spec that reads a role it does not take: a bug
            self._open[role] = self._stack.enter_context(open_dump(path))
        return self._open[role]

    def optional(self, role: str):
        return self.dump(role) if self.paths.get(role) is not None else None

    # -- runs of several ranks ---------------------------------------------------------------------------------
    def runs(self) -> dict | None:
        """Role -> `RunLayout` when golden and target are run directories; None when neither is; InputError
        for one of each, for world sizes that differ, for a run missing a rank (see `precision_tool.dump.runs`)."""
        from precision_tool.dump.runs import check_world_sizes, find_run, is_run_dir

        if "golden" not in self.paths or "target" not in self.paths:
            return None
        given = {role: path for role, path in self.paths.items() if path is not None}
        runs = {role: is_run_dir(path) for role, path in given.items()}
        if not runs.get("golden") and not runs.get("target"):
            return None
        for role in ("golden", "target"):
            if not runs.get(role):
                other = "target" if role == "golden" else "golden"
                from precision_tool.errors import InputError

                raise InputError(given[role], f"is one dump, but the {other} {given[other]} is a run of several "
                                              "ranks: give two runs, or one rank dump of each (RUN/rank0.h5)")
        layouts = {role: find_run(path) for role, path in given.items() if runs[role]}
        check_world_sizes(layouts["golden"], layouts["target"])
        for role, layout in layouts.items():
            if role not in ("golden", "target"):
                check_world_sizes(layouts["golden"], layout)
        return layouts

    def keep_open(self, other) -> None:
        """Close ``other`` (a rank's source) when this source is closed."""
        self._stack.callback(other.close)

    def rank(self, rank: int, layouts: dict) -> "DumpFiles":
        """The source of rank ``rank``: each run's rank dump, and any single dump given as is."""
        paths = {role: (layouts[role].paths[rank] if role in layouts else path) for role, path in self.paths.items()}
        source = DumpFiles(paths, allow_incomplete=self.allow_incomplete, warn=self.warn)
        source.streaming = False  # a run's views read every op of each rank's report
        return source

    def _compared_dumps(self):
        """Golden and target, checked once by the preflight when asked (its warnings shown once)."""
        golden, target = self.dump("golden"), self.dump("target")
        if not self._preflighted:
            from precision_tool.compare.preflight import raise_for_errors, run_problems

            if self.allow_incomplete is not None:
                for problem in raise_for_errors(run_problems(golden, target, self.allow_incomplete)):
                    self.warn(problem.message)
            else:  # compare shows whatever it is given; two dumps given the wrong way round, of two models or
                # captured at two levels (only the module calls pair) are worth a word
                for problem in run_problems(golden, target, True):
                    if problem.code in ("swapped", "different-model", "same-file", "different-capture-level"):
                        self.warn(problem.message)
            self._preflighted = True
        return golden, target

    def stream(self, options=None, threshold: float | None = None, limit: int = 0, judge=None):
        """`streamed_report` of golden and target; None when it cannot stream, or the whole comparison is made."""
        if not self.streaming or _key(options) in self._comparisons:
            return None
        golden, target = self._compared_dumps()
        if self.progress is None:
            return streamed_report(golden, target, options, threshold, limit, judge)
        with self.progress() as progress:
            return streamed_report(golden, target, options, threshold, limit, judge, progress)

    def compare(self, options=None):
        """The comparison of target against golden (once per options); preflight first when asked."""
        key = _key(options)
        if key not in self._comparisons:
            golden, target = self._compared_dumps()
            from precision_tool.compare.comparator import compare_dumps

            if self.progress is None:
                self._comparisons[key] = compare_dumps(golden, target, options)
            else:
                with self.progress() as progress:
                    self._comparisons[key] = compare_dumps(golden, target, options, progress)
        return self._comparisons[key]

    def flagged(self, threshold: float, options=None) -> list:
        """Every op the comparison flags at ``threshold``, in execution order."""
        if (_key(options), threshold) not in self._flagged:
            from precision_tool.compare.report import select_flagged

            self._flagged[_key(options), threshold] = select_flagged(self.compare(options), threshold, None)
        return self._flagged[_key(options), threshold]


def _key(options):
    """What tells two comparisons apart (the thread count does not change a result)."""
    return None if options is None else (options.steps, options.ops)
