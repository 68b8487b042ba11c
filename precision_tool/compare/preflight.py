"""Before comparing: are these two dumps runs that can be compared, and is the target finished?

`run_problems(golden, target)` looks only at what the two opened dumps say
about themselves (root metadata, completeness, committed steps) and returns
data: a list of `Problem`, errors first. ``check`` and ``diagnose`` refuse to
go on when one is an error (`raise_for_errors`, exit status 2) and print the
warnings; the diagnosis prints them before its verdict.

Errors (comparing would give an answer that means nothing):

* ``different-model``: the runs trained different models (their model names
  or parameter shapes differ; for torch dumps, whose model name defaults to
  the script's name, only the parameter shapes count);
* ``swapped``: the golden dump is a target run and the target dump the golden
  run;
* ``incomplete``: a run that was killed, or failed, before its last step
  (``complete`` false, or fewer steps committed than planned), or that another
  process is still writing. The steps it lacks would go unchecked, so a gate
  that passed would be lying. ``allow_incomplete=True`` makes this a warning.
* ``different-capture-level``: torch dumps of which one holds every aten op and
  the other module calls only (``level=``): a diagnosis would read the ops one
  side lacks as ops the other does not run;
* ``no-steps``: a finished run that holds no step (nothing trained under the
  dump): nothing to compare;
* ``being-replaced``: a new run is being written to ``PATH.partial``, to
  replace the dump given: that dump is the previous run, and checking it would
  pass or fail the wrong run. ``allow_incomplete=True`` makes this a warning.

Warnings (a real difference, but comparing still says something): a
different seed, data, batch size, optimizer or learning rate, a different
number of planned steps, target steps the golden run lacks, a golden dump that
is not a golden-role run, and a torch model under another name.
"""

from __future__ import annotations

from dataclasses import dataclass

from precision_tool.errors import PrecisionToolError, cut

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Problem:
    """One reason the two runs may not compare as they should."""

    code: str  # different-model, swapped, incomplete, different-seed, ... (module docstring)
    severity: str  # ERROR or WARNING
    message: str  # one line, naming the file(s) concerned
    side: str = "both"  # which dump it is about: golden, target or both

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR


class RunMismatch(PrecisionToolError):
    """The two dumps cannot be compared meaningfully (exit status 2); ``problem`` says why."""

    def __init__(self, problem: Problem):
        self.problem = problem
        super().__init__(problem.message)


# (metadata key, what it is) of the training settings whose difference is a warning
_SETTINGS = (("seed", "seed"), ("data", "data"), ("batch_size", "batch size"), ("optimizer", "optimizer"),
             ("lr", "learning rate"))


def run_problems(golden, target, allow_incomplete: bool = False) -> list[Problem]:
    """What is wrong with comparing ``target`` against ``golden`` (opened dumps), errors first."""
    g, t = _meta(golden), _meta(target)
    found = [*_model_problems(golden, target, g, t), *_role_problems(golden, target, g, t), *_same_file(golden, target),
             *_level_problems(golden, target, g, t)]
    for side, dump in (("target", target), ("golden", golden)):
        found.extend(_completeness(side, dump, allow_incomplete))
        found.extend(_replacement(side, dump, allow_incomplete))
    found.extend(_setting_problems(golden, target, g, t))
    found.extend(_step_problems(golden, target, g, t))
    return sorted(found, key=lambda p: not p.is_error)  # stable: the order above within each severity


def raise_for_errors(problems: list[Problem]) -> list[Problem]:
    """Raise `RunMismatch` for the first error; otherwise return the warnings."""
    for problem in problems:
        if problem.is_error:
            raise RunMismatch(problem)
    return [p for p in problems if not p.is_error]


def _meta(dump) -> dict:
    return dict(getattr(dump, "metadata", None) or {})


def _path(dump) -> str:
    return str(getattr(dump, "path", "<memory>"))


def _model_problems(golden, target, g: dict, t: dict) -> list[Problem]:
    torch = "torch" in (g.get("framework"), t.get("framework"))
    names = g.get("model"), t.get("model")
    both = f"golden {_path(golden)}, target {_path(target)}"
    if None not in names and names[0] != names[1] and not torch:
        return [Problem("different-model", ERROR, f"the dumps are of different models: golden {cut(names[0])!r} "
                                                  f"({_path(golden)}), target {cut(names[1])!r} ({_path(target)})")]
    shapes = g.get("parameters"), t.get("parameters")
    if isinstance(shapes[0], dict) and isinstance(shapes[1], dict) and shapes[0] != shapes[1]:
        differing = sorted(set(shapes[0]) ^ set(shapes[1])) or sorted(
            k for k in shapes[0] if shapes[0][k] != shapes[1].get(k))
        rewritten = boost_rewritten_modules(g) | boost_rewritten_modules(t)
        differing = [name for name in differing if not any(name.startswith(m + "/") for m in rewritten)]
    else:
        differing = []
    if differing:
        return [Problem("different-model", ERROR, f"the dumps are of different models: their parameters differ "
                                                  f"(first: {differing[0]}) ({both})")]
    if None not in names and names[0] != names[1]:
        return [Problem("different-model-name", WARNING, f"the dumps name different models: golden "
                                                         f"{cut(names[0])!r}, target {cut(names[1])!r}")]
    return []


def _level_problems(golden, target, g: dict, t: dict) -> list[Problem]:
    """Torch dumps captured at different levels: one holds every aten op, the other module calls only. Their
    module calls pair, but a diagnosis reads the ops one side lacks as ops the other does not run."""
    levels = g.get("capture_level"), t.get("capture_level")
    if None in levels or levels[0] == levels[1] or not all(isinstance(level, str) for level in levels):
        return []
    said = {"op": "op level (every aten op)", "module": "module level (module calls only)"}
    return [Problem("different-capture-level", ERROR, f"the dumps were captured at different levels: golden "
                                                      f"{_path(golden)} at {said.get(levels[0], cut(levels[0]))}, "
                                                      f"target {_path(target)} at {said.get(levels[1], cut(levels[1]))}"
                                                      "; collect both at one level (ptt.dump(..., level=...))")]


def boost_rewritten_modules(meta: dict) -> set[str]:
    """Module paths a boost algorithm removed or replaced (metadata ``boost.changes``): their parameters
    may differ between two runs of one model."""
    boost = meta.get("boost")
    changes = boost.get("changes") if isinstance(boost, dict) else None
    return {m for c in changes or () if isinstance(c, dict) for m in c.get("modules", ()) if isinstance(m, str)}


def _same_file(golden, target) -> list[Problem]:
    """The one file given as both golden and target (by name, or through a link): it agrees with itself."""
    import os

    paths = getattr(golden, "path", None), getattr(target, "path", None)
    try:
        same = None not in paths and os.path.samefile(*paths)
    except (OSError, TypeError, ValueError):
        same = False
    if not same:
        return []
    return [Problem("same-file", WARNING, f"golden and target are the same file ({_path(target)}): every tensor "
                                          "agrees with itself; give the target run's dump")]


def _role_problems(golden, target, g: dict, t: dict) -> list[Problem]:
    golden_role, target_role = g.get("role"), t.get("role")
    if target_role == "golden" and golden_role not in (None, "golden"):
        return [Problem("swapped", ERROR, f"golden and target are swapped: {_path(target)} is the golden run "
                                          f"and {_path(golden)} a {golden_role} run; give the golden dump first")]
    if golden_role not in (None, "", "golden"):
        return [Problem("golden-not-golden", WARNING, f"{_path(golden)} is a {golden_role} run, not a golden one",
                        "golden")]
    return []


def _completeness(side: str, dump, allow_incomplete: bool) -> list[Problem]:
    meta = _meta(dump)
    planned, committed = meta.get("steps"), getattr(dump, "steps_complete", None)
    if committed is None:  # an in-memory dump: nothing was cut short
        return []
    if committed == 0 and bool(getattr(dump, "complete", True)) and not getattr(dump, "being_written", False):
        return [Problem("no-steps", ERROR, f"{_path(dump)}: the {side} run holds no step (nothing ran under the "
                                           "dump, or its steps= selected none): nothing to compare", side)]
    start = meta.get("resumed_from")  # a run resumed from a checkpoint (or a replay) holds the steps after it
    if _whole(planned) and _whole(start):
        planned -= start
    being_written = bool(getattr(dump, "being_written", False))
    complete = bool(getattr(dump, "complete", True))
    short = _whole(planned) and committed < planned
    if complete and not short and not being_written:
        return []
    of = f" of {planned}" if _whole(planned) else ""
    why = "is still being written by another process" if being_written else "is incomplete (killed or failed)"
    steps = getattr(dump, "steps", None) if not being_written else None
    failed = [s.step for s in (steps() if callable(steps) else steps or ()) if getattr(s, "cut_short", False)]
    if failed:  # (the torch capture keeps the ops of the step a script failed in, up to the failure)
        why = f"failed in step {failed[-1]}, whose ops up to the failure are kept"
    message = f"{_path(dump)}: the {side} run {why}: {committed}{of} steps committed"
    if allow_incomplete:
        return [Problem("incomplete", WARNING, message + "; only those are compared", side)]
    return [Problem("incomplete", ERROR, message + "; --allow-incomplete compares those only", side)]


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _replacement(side: str, dump, allow_incomplete: bool) -> list[Problem]:
    if not getattr(dump, "being_replaced", False):
        return []
    message = (f"{_path(dump)}: a new {side} run is being written to replace it ({_path(dump)}.partial); "
               f"this file holds the previous run")
    if allow_incomplete:
        return [Problem("being-replaced", WARNING, message, side)]
    return [Problem("being-replaced", ERROR, message + "; wait for the run to finish", side)]


def _setting_problems(golden, target, g: dict, t: dict) -> list[Problem]:
    found = []
    for key, what in _SETTINGS:
        if key in g and key in t and g[key] != t[key]:
            found.append(Problem(f"different-{key.replace('_', '-')}", WARNING,
                                 f"the runs differ in {what}: golden {_short(g[key])}, target {_short(t[key])}"))
    return found


def _step_problems(golden, target, g: dict, t: dict) -> list[Problem]:
    found = []
    planned = g.get("steps"), t.get("steps")
    if None not in planned and planned[0] != planned[1]:
        found.append(Problem("different-steps", WARNING,
                             f"the runs planned different step counts: golden {planned[0]}, target {planned[1]}"))
    golden_steps, target_steps = _step_set(golden), _step_set(target)
    if golden_steps is not None and target_steps is not None:
        missing = sorted(target_steps - golden_steps)
        if missing and golden_steps & target_steps:
            found.append(Problem("steps-not-in-golden", WARNING,
                                 f"{len(missing)} target steps have no golden step to compare with "
                                 f"(first: {missing[0]}); they are not checked", "target"))
    return found


def _step_set(dump) -> set[int] | None:
    steps = getattr(dump, "step_numbers", None)
    return set(steps()) if callable(steps) else None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
