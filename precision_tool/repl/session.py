"""One shell session: the dumps it loaded by role, and what it has computed so far.

Everything a command needs lives on this object (no module globals), so two
sessions in one process, as the tests run them, never share state.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from precision_tool.errors import InputError, PrecisionToolError
from precision_tool.repl.tensors import SIDES

ROLES = SIDES  # golden, target, overflow, fusion-off
_ROLE_OPTIONS = {"golden": "--golden", "target": "--target", "overflow": "--overflow", "fusion-off": "--fusion-off"}


class MissingDumpError(PrecisionToolError):
    """A command needs a dump of a role the session did not load."""

    def __init__(self, role: str, command: str = ""):
        who = f"{command} needs" if command else "this needs"
        article = "an" if role[0] in "aeiou" else "a"  # an overflow dump
        super().__init__(f"{who} {article} {role} dump; start the shell with {_ROLE_OPTIONS[role]} FILE "
                         f"or pass {article} {role} dump among FILES")


@dataclass
class OpIndex:
    """Op names of one dump, for lookups and completion: name -> steps per direction."""

    names: list[str]  # unique, in first-execution order
    steps: dict[tuple[str, str], list[int]]  # (name, direction) -> steps that recorded it
    first_step: int | None
    slots: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> tensor slots
    types: list[str] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._known = frozenset(self.names)

    def has(self, name: str) -> bool:
        return name in self._known


class ShellSession:
    """The loaded dumps (role -> open dump) and the cached comparison."""

    def __init__(self, dumps: dict[str, Any], compare_fn: Callable | None = None):
        unknown = set(dumps) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}")
        self.dumps = dict(dumps)
        self.runs: tuple = ()  # the run directories the shell was given (a rank of each is loaded): written over never
        self._compare_fn = compare_fn
        self._comparisons: dict = {}  # (steps, ops) or None (the whole run) -> CompareReport
        self._streamed: dict = {}  # (steps, ops) or None -> StreamedReport, for vcs (no record per op kept)
        self.delivery: dict = {}  # what the running command delivers (`CommandSpec.run`)
        self._flagged: dict[tuple, list] = {}
        self._indexes: dict[str, OpIndex] = {}
        self.progress: Callable | None = None  # a context manager factory yielding a progress callback (or None)
        self._preflighted = False

    @classmethod
    def open(cls, files=(), **by_role) -> "ShellSession":
        """Open FILES (roles from their metadata) and the files given per role (``fusion_off=``)."""
        from precision_tool.dump.reader import open_dump

        dumps: dict[str, Any] = {}
        try:
            for role, path in by_role.items():
                if path is not None:
                    _assign(dumps, role.replace("_", "-"), open_dump(path), path)
            for path in files:
                dump = open_dump(path)
                _assign(dumps, _role_of(dump, path), dump, path)
        except BaseException:
            for dump in dumps.values():
                dump.close()
            raise
        return cls(dumps)

    def close(self) -> None:
        for dump in self.dumps.values():
            dump.close()

    def __enter__(self) -> "ShellSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- dumps ---------------------------------------------------------------
    def has(self, role: str) -> bool:
        return role in self.dumps

    def dump(self, role: str, command: str = ""):
        """The dump loaded for ``role``; MissingDumpError names the option that loads it."""
        if role not in self.dumps:
            raise MissingDumpError(role, command)
        return self.dumps[role]

    def optional(self, role: str):
        """The dump loaded for ``role``, or None."""
        return self.dumps.get(role)

    def path(self, role: str, command: str = "") -> str:
        return str(self.dump(role, command).path)

    @property
    def inputs(self) -> tuple:
        """The loaded dumps' paths and the runs they belong to: no command writes over one of them (nor over any
        file of such a run)."""
        return (*(str(dump.path) for dump in self.dumps.values()), *self.runs)

    @property
    def primary_role(self) -> str | None:
        """The side lookups default to: target, else whatever was loaded first."""
        for role in ("target", "golden", "overflow", "fusion-off"):
            if role in self.dumps:
                return role
        return None

    def describe(self) -> list[tuple[str, str]]:
        """(role, file name) per loaded dump, in role order, for the toolbar and `ls`."""
        return [(role, Path(str(self.dumps[role].path)).name) for role in ROLES if role in self.dumps]

    def index(self, role: str) -> OpIndex:
        """The op index of one dump, built once from its op listing (no tensor reads)."""
        if role not in self._indexes:
            self._indexes[role] = build_index(self.dump(role).ops())
        return self._indexes[role]

    def op_names(self) -> list[str]:
        """Every op name of the primary dump (completion); empty when nothing is loaded."""
        role = self.primary_role
        return self.index(role).names if role else []

    # -- comparison ----------------------------------------------------------
    @property
    def comparison(self):
        """The cached comparison of the whole run (a CompareReport, or vcs's StreamedReport), or None before the
        first `vcs` / `ac`."""
        found = self._comparisons.get(None)
        return found if found is not None else self._streamed.get(None)

    def stream(self, options=None, threshold: float | None = None, limit: int = 0, judge=None):
        """The comparison made a window of ops at a time (`commands.sources.streamed_report`), cached for vcs;
        None when the whole comparison is cached already (`ac` made it) or the dumps need it."""
        from precision_tool.commands.sources import streamed_report

        key = None if options is None else (options.steps, options.ops)
        if key in self._comparisons:
            return None
        if judge is None and key in self._streamed:
            return self._streamed[key]
        golden, target = self._compared_dumps()
        with self._progress() as progress:
            report = streamed_report(golden, target, options, threshold, limit, judge, progress)
        if judge is None and report is not None:
            self._streamed[key] = report
        return report

    def compare(self, options=None, refresh: bool = False):
        """Compare target against golden once per session (and per --steps/--ops selection) and cache the report."""
        key = None if options is None else (options.steps, options.ops)  # the thread count changes no result
        if key not in self._comparisons or refresh:
            golden, target = self._compared_dumps()
            if self._compare_fn is not None:
                self._comparisons[key] = self._compare_fn(golden, target, *(() if options is None else (options,)))
            else:
                from precision_tool.compare import compare_dumps  # the comparator's entry point

                with self._progress() as progress:
                    self._comparisons[key] = compare_dumps(golden, target, options, progress)
            self._flagged = {k: v for k, v in self._flagged.items() if k[0] != key}
        return self._comparisons[key]

    def _compared_dumps(self):
        """Golden and target, once the preflight found them comparable: dumps of two models, or given the wrong way
        round, fail the command that compares them (`RunMismatch`, as `diagnose` and `check` do); an incomplete run
        is the shell's to look into."""
        golden, target = self.dump("golden", "the comparison"), self.dump("target", "the comparison")
        if not self._preflighted:
            from precision_tool.compare.preflight import raise_for_errors, run_problems

            raise_for_errors(run_problems(golden, target, allow_incomplete=True))
            self._preflighted = True
        return golden, target

    def _progress(self):
        return nullcontext() if self.progress is None else self.progress()

    def flagged(self, threshold: float, options=None) -> list:
        """Every op the comparison flags at ``threshold`` (the vcs rule), in execution order; memoised."""
        key = (None if options is None else (options.steps, options.ops), threshold)
        if key not in self._flagged:
            from precision_tool.compare import select_flagged

            self._flagged[key] = select_flagged(self.compare(options), threshold, None)
        return self._flagged[key]

    def flagged_ops(self, threshold: float) -> list:
        """`flagged` over the whole run."""
        return self.flagged(threshold)


def build_index(ops) -> OpIndex:
    names: dict[str, None] = {}
    steps: dict[tuple[str, str], list[int]] = {}
    slots: dict[str, tuple[str, ...]] = {}
    types: dict[str, None] = {}
    passes: dict[str, None] = {}
    first_step = None
    for op in ops:
        names.setdefault(op.name)
        types.setdefault(op.type)
        if op.pass_name:
            passes.setdefault(op.pass_name)
        seen = steps.setdefault((op.name, op.direction), [])
        if not seen or seen[-1] != op.step:
            seen.append(op.step)
        known = slots.get(op.name, ())
        if len(known) < len(op.tensors):  # backward records may hold more slots than forward
            slots[op.name] = tuple(dict.fromkeys([*known, *(t.slot for t in op.tensors)]))
        first_step = op.step if first_step is None else min(first_step, op.step)
    return OpIndex(list(names), steps, first_step, slots, sorted(types), sorted(passes))


def _role_of(dump, path) -> str:
    role = getattr(dump, "role", None)
    if role not in ROLES:
        raise InputError(path, f"its metadata names no role ({role!r}); give it with "
                               "--golden, --target, --overflow or --fusion-off")
    return role


def _assign(dumps: dict, role: str, dump, path) -> None:
    if role in dumps:
        dump.close()
        raise InputError(path, f"a second {role} dump (already have {dumps[role].path}); "
                               f"give one with {_ROLE_OPTIONS[role]}")
    dumps[role] = dump
