"""Stats first, tensors where it diverges: the region of a statistics comparison worth dumping in full.

A comparison with statistics on either side names the first divergent op (`CompareSummary.first_flagged`) but
cannot say why: its tensors were not kept. The **region** is what a second, full-tensor collection of both
runs needs for `diagnose` to name the culprit, and nothing more:

- the divergent op's **step** only;
- the divergent op's **module** (every op whose name lies under its module path: `block1/conv1` for
  `block1/conv1/Conv2D`, `Model/enc/layers.0` for `Model/enc/layers.0/aten.mm_0` and its backward ops);
  none at the root scope; for the outermost torch module (the model, or a loss module called outside it)
  its own ops only (``Model/aten.*``: its children's would be everything); for a torch module's forward
  call, its caller's own ops too (``Model/attn/aten.*`` for ``Model/attn/out_proj``: what the module reads
  may come from ops that module records do not show);
- the divergent op itself and the `ZOOM_OPS_BEFORE` ops executed before it in that step, by exact name,
  with the golden names they were matched to (a fused op's original ops);
- forward ops only when the divergent op is a forward one flagged at the threshold (nothing after it can
  have caused it);
- when the divergent op's step is not the first, also the **step before** it, backward ops included, with
  every torch optimizer op (``optimizer/*``; an engine run's lie in their modules): nothing departed in that
  step where the statistics look, so what changed the values is where they do not, a parameter's gradient
  or its update.

Where both runs compute in float32 the divergent op is the first whose statistics depart beyond float32
rounding (`FLOAT32_DEPARTURE`), flagged or not: a fault can move an output far less than the threshold's
2 % and still be where the run's error enters. Its backward ops are recorded too: a label smoothing moves
the loss by 1e-4 and the gradients after it by 10 %.

`precision-tool zoom` diagnoses the statistics first: an op that diagnosis names is the divergent op (a
call only golden made: the module calling it is the region's module), for the tensors to confirm or
overturn.

`zoomed_diagnosis` is what a zoom reports: the region's diagnosis, or where its tensors name nothing, the
statistics' verdict.

`zoom_region` builds it with the commands that re-collect it: `precision-tool collect` command lines rebuilt
from the ones the stats dumps recorded (``--mode dump --dump-steps N --ops ... --modules ...``), or the
`precision_tool.torch.dump` arguments for torch dumps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
from dataclasses import dataclass

from precision_tool.analysis.results import UPDATE_TYPE
from precision_tool.compare.report import OpComparison
from precision_tool.defaults import COSINE_THRESHOLD, ZOOM_OPS_BEFORE
from precision_tool.dump.records import MODULE_TYPE_PREFIX

STATS = "stats"
ENGINE, TORCH = "engine", "torch"
FLOAT32_MODE = "golden_float32"  # the precision mode of a run that computes in float32
FLOAT32_DEPARTURE = 1e-5  # statistics this far from golden's (relative) depart beyond float32 rounding
OPTIMIZER_OPS = "optimizer/*"  # every op of a torch optimizer's step (`precision_tool.torch.naming`)
LOOP_OPS = "aten.*"  # the training loop's own ops, outside every module and optimizer
_WITH_VALUE = frozenset({"--mode", "-o", "--output", "--dump-steps", "--ops", "--modules", "--op-types"})
_FLAGS = frozenset({"--no-backward", "--force"})


@dataclass(frozen=True)
class Recollect:
    """How to re-collect one side of the region with full tensors."""

    role: str  # golden or target
    source: str  # the dump the side came from
    output: str  # the full-tensor dump the command writes
    command: str = ""  # an engine run: the `precision-tool collect` command line; "" when not known
    call: str = ""  # a torch run: the `ptt.dump(...)` call
    note: str = ""  # why neither is given (the side already holds tensors, no command was recorded)


@dataclass(frozen=True)
class ZoomRegion:
    """The first divergent op of a statistics comparison and the region around it to dump in full."""

    step: int
    exec_index: int
    op: str
    type: str
    direction: str
    reasons: tuple[str, ...]
    module: str  # "" when the op is at the root scope
    ops: tuple[str, ...]  # exact op names (fnmatch-safe) the region records besides its modules
    modules: tuple[str, ...]  # module globs
    backward: bool  # whether backward ops are recorded
    framework: str  # engine or torch
    recollect: tuple[Recollect, ...] = ()
    steps: tuple[int, ...] = ()  # the steps recorded: ``(step,)``, or the step before too
    named: str = ""  # the class the statistics' diagnosis gave the op ("": the first divergent op)

    def selection(self) -> dict:
        """The region as `Selection.build` and the zoom environment take it."""
        return {"steps": list(self.steps or (self.step,)), "ops": list(self.ops), "modules": list(self.modules),
                "backward": self.backward}


def is_stats(info) -> bool:
    """Whether a compared side (`DumpInfo`) holds statistics only."""
    return STATS in (info.modes or (info.mode,))


def zoom_region(report, golden_metadata: dict, target_metadata: dict, cosine_threshold: float = COSINE_THRESHOLD,
                outputs: dict | None = None, verdict=None) -> ZoomRegion | None:
    """The region around the first divergent op of ``report`` when a side holds statistics only; else None.

    ``outputs`` maps golden/target to the full-tensor dumps to write (default: `zoom_path` of each stats dump).
    ``verdict``: the statistics pair's own diagnosis (`Verdict`); an op it names is the divergent op, for the
    tensors to confirm or overturn it, where the first departure may lie elsewhere (an overflow a float
    status shows before any statistic moves, a backward call that runs no ops).
    """
    if not (is_stats(report.golden) or is_stats(report.target)):
        return None
    first = report.summary(cosine_threshold).first_flagged
    reasons = tuple(first.flag_reasons(cosine_threshold)) if first is not None else ()
    named = _named_op(report, verdict) if verdict is None or verdict.type != UPDATE_TYPE else None  # (an update:
    # where it first shows, and the step before with the optimizer's ops, as for a first departure)
    both_float32 = all(m.get("precision_mode") == FLOAT32_MODE for m in (golden_metadata, target_metadata))
    whole = None
    if named is None and verdict is not None and verdict.type != UPDATE_TYPE:
        named = whole = _named_module(report, verdict)
    if named is not None:
        elsewhere = named is not first  # (the first divergent op as well: its flags say why)
        if elsewhere:
            reasons = (f"the statistics' diagnosis names it: {verdict.cls}",)
        # a call only golden made: its parent's ops too, whose backward the target runs, so that what is missing
        # is told from what is not; in float32 runs its backward too, where a departure under the threshold shows
        # more (a loss smoothed otherwise: 8e-5 in its value)
        region = _region(report, named, reasons, named.direction != "forward" or both_float32, False,
                         golden_metadata, target_metadata, outputs, parent=not named.rows and whole is None)
        return dataclasses.replace(region, named=verdict.cls) if elsewhere else region
    float32 = False  # found beyond float32 rounding, under the threshold
    if both_float32:
        departing, why = _first_departure(report)
        if departing is not None and (first is None or (departing.step, departing.exec_index) <
                                      (first.step, first.exec_index)):
            first, reasons, float32 = departing, why, True
    if first is None:
        return None
    # a departure under the threshold may show more in the backward ops it feeds (a changed loss: 1e-4 in its
    # value, 10 % in its gradient): they are recorded too
    return _region(report, first, reasons, first.direction != "forward" or float32, first.step > 0,
                   golden_metadata, target_metadata, outputs)


def zoomed_diagnosis(statistics, region):
    """What a zoom reports: the diagnosis of the region's tensors (``region``, a `Diagnosis`), or, where it names
    nothing while the statistics' diagnosis of the whole run (``statistics``, its `Verdict`) named a culprit, that
    verdict, with a note saying why it stands.

    The region holds the culprit's step and module, not what the statistics saw it do beyond them: the ops after
    it that read what it wrote, the optimizer step, the loss. A fault the statistics named from the structure of
    the whole step (an op golden does not run writing the gradient it reads 1.05 times, noise a hook adds to a
    weight's gradient that the optimizer then reads) harms nothing the region records, and its tensors, departing
    under the cosine threshold, flag nothing: they neither confirm nor overturn it. Where the region's tensors
    name an op, they are the answer; and so is their none for a verdict named from how far the statistics depart
    alone (`Verdict.departure_only`), which is what tensors confirm or overturn."""
    if statistics is None or statistics.cls == "none" or not statistics.op or statistics.departure_only or \
            region.verdict.cls != "none":
        return region
    why = region.verdict.evidence[0] if region.verdict.evidence else "nothing departs there"
    note = (f"the region's tensors name no culprit ({why}); it does not record what the statistics saw "
            f"{statistics.op} cause beyond it (the ops after it, the optimizer's step, the loss): the statistics' "
            "verdict stands")
    return dataclasses.replace(region, verdict=statistics, notes=[*region.notes, note])


def _named_op(report, verdict):
    """The compared op ``verdict`` names (its step and name), or None; an op only one run ran (a backward call
    the target never made, an op a hand-written replacement runs in the target alone: a sqrt in an activation)
    as one without tensors, whose region is the module calling it. A none that names an op (other random draws
    than golden's: `randomness`) names where the tensors are to confirm it."""
    if verdict is None or not verdict.op or verdict.step is None:
        return None

    def named(op) -> bool:
        return op.step == verdict.step and op.name == verdict.op and op.direction == (verdict.direction or
                                                                                     op.direction)
    found = next((op for op in report.ops if named(op)), None)
    if found is None:
        alone = next((op for op in (*report.unmatched_golden, *report.unmatched_target) if not op.slot and named(op)),
                     None)
        if alone is not None:
            found = OpComparison(alone.step, alone.exec_index, alone.name, alone.type, alone.direction, ())
    return found


def _named_module(report, verdict):
    """The module call ``verdict`` names where no record of it was compared (a backward call only golden made, in
    an op-level dump that keeps no module records: a Linear whose parameters the target froze, no gradient
    reaching it), as a compared op of a module type: its region is that module, whose ops one run runs and the
    other does not; None where no op of either run lies in it at that step and direction."""
    if not verdict.op or verdict.step is None or verdict.op != verdict.module:
        return None
    inside = next((op for op in (*report.unmatched_golden, *report.unmatched_target)
                   if not op.slot and op.step == verdict.step and op.name.startswith(verdict.op + "/")
                   and op.direction == (verdict.direction or op.direction)), None)
    if inside is None:
        return None
    call = next((op.type for op in report.ops if op.name == verdict.op and op.type.startswith(MODULE_TYPE_PREFIX)),
                MODULE_TYPE_PREFIX.rstrip("."))
    return OpComparison(inside.step, inside.exec_index, verdict.op, call, inside.direction, ())


def _region(report, first, reasons: tuple, backward: bool, step_before: bool, golden_metadata: dict,
            target_metadata: dict, outputs: dict | None, parent: bool = False) -> ZoomRegion:
    """The region around ``first``: its module (``parent``: the module that calls it), the ops before it, its
    step (and the one before)."""
    framework = TORCH if TORCH in (golden_metadata.get("framework"), target_metadata.get("framework")) else ENGINE
    module = op_module(first.name, first.type)
    if parent:
        module = module.rpartition("/")[0]
    whole = module.count("/") + 1 >= (2 if framework == TORCH else 1) and module
    modules = (_escape(module),) if whole else ()
    names = _region_names(report, first)
    ops = tuple(sorted({_escape(n) for n in names if not (whole and _inside(n, module))}))
    if module and not whole:  # the outermost torch module (the model, a loss module): its own ops only
        ops += (f"{_escape(module)}/aten.*",)
    caller = module.rpartition("/")[0] if whole and first.type.startswith(MODULE_TYPE_PREFIX) else ""
    if caller and framework == TORCH and first.direction == "forward":  # what a module reads may come from its
        ops += (f"{_escape(caller)}/aten.*",)  # caller's own ops (an attention's softmax between its projections),
        # which module records do not show
    steps = (first.step,)
    if step_before:  # the step before showed nothing: a gradient or an update it made, unseen in statistics
        steps, backward = (first.step - 1, first.step), True
        ops += (OPTIMIZER_OPS, LOOP_OPS) if framework == TORCH else ()  # (a GradScaler's unscaling and a clipping
        # run outside every module: without them the optimizer reads gradients the loss scale times golden's)
    region = ZoomRegion(first.step, first.exec_index, first.name, first.type, first.direction, reasons, module,
                        ops, modules, backward, framework, steps=steps)
    sides = (("golden", report.golden, golden_metadata), ("target", report.target, target_metadata))
    outputs = outputs or {}
    recollect = tuple(_recollect(region, role, info, metadata, outputs.get(role) or zoom_path(info.path, role))
                      for role, info, metadata in sides)
    return dataclasses.replace(region, recollect=recollect)


def _first_departure(report) -> tuple:
    """(the first op whose output statistics depart from golden's beyond float32 rounding, why); (None, ()).

    Where both runs compute in float32 a fault can move an output far less than the cosine threshold's 2 %
    (another GELU approximation: 4e-5 of the output's range) and still be the only departure: golden and
    target compute the same values to within a few float32 roundings (a different kernel or thread count:
    at most 5.1e-7 on the suite's models). `FLOAT32_DEPARTURE` lies between.
    """
    for op in report.ops:
        for row in op.outputs:
            if row.stats is None or row.skip:
                continue
            departure = max((d for d in (row.stats.rel_norm_diff, row.stats.rel_err_bound) if not math.isnan(d)),
                            default=0.0)
            if departure > FLOAT32_DEPARTURE:
                return op, (f"{row.tensor}: statistics {departure:.3g} from golden's, beyond float32 rounding "
                            f"({FLOAT32_DEPARTURE:g}) in two float32 runs",)
    return None, ()


def op_module(name: str, op_type: str = "") -> str:
    """The module an op ran in: a module record's own path, a torch op's path before its first ``aten.`` part,
    else the name's parent path ("" at the root scope)."""
    if op_type.startswith(MODULE_TYPE_PREFIX):
        return name
    parts = name.split("/")
    for index, part in enumerate(parts):
        if part.startswith("aten."):
            return "/".join(parts[:index])
    return "/".join(parts[:-1])


def zoom_path(path: str, role: str) -> str:
    """Where a stats dump's region goes: ``stats-X.h5`` -> ``zoom-X.h5``, else ``X-zoom.h5``, beside it."""
    folder, name = os.path.split(os.path.normpath(str(path)))
    stem = name[:-3] if name.endswith(".h5") else name or role
    stem = f"zoom-{stem[len('stats-'):]}" if stem.startswith("stats-") else f"{stem}-zoom"
    return os.path.join(folder, f"{stem}.h5")


def _region_names(report, first) -> set[str]:
    """The divergent op, the ops run before it in its step, and the golden ops they were matched to."""
    same_step = [op for op in report.ops if op.step == first.step and op.exec_index < first.exec_index]
    names = set()
    for op in (*same_step[-ZOOM_OPS_BEFORE:], first) if ZOOM_OPS_BEFORE else (first,):
        names.update((op.name, *op.original_names, *(row.golden_op for row in op.rows)))
    return names


def _inside(name: str, module: str) -> bool:
    return name == module or name.startswith(module + "/")


def _escape(name: str) -> str:
    """An exact name as an fnmatch pattern: ``[`` ``*`` ``?`` in brackets."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in name)


def _recollect(region: ZoomRegion, role: str, info, metadata: dict, output: str) -> Recollect:
    if not is_stats(info):
        return Recollect(role, info.path, info.path, note="holds full tensors already: use it as it is")
    if region.framework == TORCH:
        return Recollect(role, info.path, output, call=torch_call(region, output))
    command = recollect_command(str(metadata.get("command") or ""), region, output)
    if command is None:
        return Recollect(role, info.path, output, note="no `precision-tool collect` command recorded: rerun the "
                                                       "run with " + " ".join(_region_words(region, output)))
    return Recollect(role, info.path, output, command=command)


def recollect_command(command: str, region: ZoomRegion, output: str) -> str | None:
    """``command`` (a recorded `precision-tool collect` line) recording ``region`` in full to ``output``."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:2] != ["precision-tool", "collect"] or len(words) < 3:
        return None
    kept, skip = [], False
    for word in words[2:]:
        if skip:
            skip = False
            continue
        flag = word.split("=", 1)[0]
        if flag in _WITH_VALUE:
            skip = "=" not in word
            continue
        if flag not in _FLAGS:
            kept.append(word)
    return shlex.join(["precision-tool", "collect", *kept, *_region_words(region, output)])


def _region_words(region: ZoomRegion, output: str) -> list[str]:
    words = ["--mode", "dump", "--dump-steps", ",".join(str(s) for s in region.selection()["steps"])]
    for flag, patterns in (("--modules", region.modules), ("--ops", region.ops)):
        for pattern in patterns:
            words += [flag, pattern]
    if not region.backward:
        words.append("--no-backward")
    return [*words, "-o", output]


def torch_call(region: ZoomRegion, output: str) -> str:
    """The `precision_tool.torch.dump` call recording ``region`` in full to ``output``."""
    arguments = [json.dumps(output), 'mode="dump"', f"steps={region.selection()['steps']}"]
    if region.ops:
        arguments.append(f"ops={json.dumps(list(region.ops))}")
    if region.modules:
        arguments.append(f"modules={json.dumps(list(region.modules))}")
    if not region.backward:
        arguments.append("backward=False")
    return f"ptt.dump({', '.join(arguments)})"
