"""The `precision-tool collect` handler: check a request, train with a collector, report what was written."""

from __future__ import annotations

from dataclasses import dataclass, field

from precision_tool.collect import modes as M
from precision_tool.collect.collector import Collector
from precision_tool.collect.selection import Selection
from precision_tool.dump.partial import check_target, partial_path
from precision_tool.errors import ConfigError, InputError
from precision_tool.outputs import refuse_inputs


@dataclass(frozen=True)
class CollectRequest:
    """What to train and what to record; None takes the library default."""

    model: str
    output: str
    device: str | None = None  # "golden" or "npu"; None: npu (golden when nothing npu-specific is asked)
    mode: str = M.DUMP
    steps: int | None = None
    seed: int | None = None
    precision_mode: str | None = None
    precision_mode_v2: str | None = None
    overflow_mode: str | None = None
    loss_scale: str | None = None
    accelerate_train_mode: str | None = None
    fusion_switch: str | None = None  # a fusion_switch.cfg path
    modify_mixlist: str | None = None  # a modify_mixlist JSON path (npu)
    batch_size: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    target_loss: float | None = None
    max_steps: int | None = None
    train_steps: int | None = None
    eval_steps: int | None = None
    save_steps: int | None = None
    checkpoint_dir: str | None = None
    if_load: bool = False
    restore_model_version: int | None = None
    dump_steps: str | None = None
    ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    op_types: str | None = None
    backward: bool = True
    command: str = ""
    overwrite: bool = False  # replace an existing dump at ``output`` (collect --force)
    boost_level: str | None = None  # mindspore.boost level O0/O1/O2
    boost_config: str | None = None  # a boost config JSON path
    ranks: int | None = None  # simulate this many data-parallel ranks; ``output`` is then a run directory
    fault_rank: int | None = None  # with ranks: this rank's all-reduce skips the collective (a planted fault)


@dataclass
class CollectResult:
    """What a collection wrote."""

    path: str
    role: str
    mode: str
    modes: list[str]
    complete: bool
    steps_run: int
    ops_recorded: int
    tensors_recorded: int
    size_bytes: int
    overflow_steps: list[int] = field(default_factory=list)
    accelerate_switch_step: int | None = None
    evaluations: list[dict] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    resumed_from: int | None = None
    filtered: bool = False  # --dump-steps, --ops, --modules, --op-types or --no-backward narrowed it
    world_size: int | None = None  # a run of several ranks: ``path`` is its directory, the counts its totals


@dataclass
class CollectPlan:
    """A checked request: the session config and the collector settings, nothing built yet."""

    request: CollectRequest
    config: object  # SessionConfig
    modes: tuple[str, ...]
    selection: Selection


def plan_collect(request: CollectRequest) -> CollectPlan:
    """Check every value of ``request`` and build the SessionConfig; ConfigError/InputError on bad input."""
    from precision_tool.session import SessionConfig

    modes = M.parse_modes(request.mode)
    selection = Selection.build(request.dump_steps, request.ops, request.op_types, request.backward,
                                request.modules)
    inputs = [request.fusion_switch, request.modify_mixlist, _model_file(request.model), request.boost_config]
    for written in _written(request):
        refuse_inputs(written, inputs)
    if request.ranks is None:
        check_target(request.output, request.overwrite)
    else:
        check_run_target(request)
    kwargs = {k: v for k, v in (("steps", request.steps), ("seed", request.seed), ("batch_size", request.batch_size),
                                ("optimizer", request.optimizer), ("lr", request.lr),
                                ("target_loss", request.target_loss), ("max_steps", request.max_steps),
                                ("train_steps", request.train_steps), ("eval_steps", request.eval_steps),
                                ("save_steps", request.save_steps), ("checkpoint_dir", request.checkpoint_dir),
                                ("restore_model_version", request.restore_model_version),
                                ("boost_level", request.boost_level),
                                ("boost_config", request.boost_config)) if v is not None}
    if request.steps is not None and request.max_steps not in (None, -1) and request.steps != request.max_steps:
        raise ConfigError(f"--steps {request.steps} and --max-steps {request.max_steps} disagree; give one")
    config = SessionConfig(model=request.model, device=build_device(request, modes),
                           loss_scale=request.loss_scale, accelerate_train_mode=request.accelerate_train_mode,
                           if_load=request.if_load, **kwargs)
    if config.saves_checkpoints:  # before the dump is created: a fresh run never replaces another's checkpoints
        from precision_tool.session.checkpoint import refuse_foreign_checkpoints

        refuse_foreign_checkpoints(config.checkpoint_dir, resuming=config.if_load)
    return CollectPlan(request, config, modes, selection)


def _written(request: CollectRequest) -> list[str]:
    """The files a collection writes: the dump and its .partial, or every rank's."""
    if request.ranks is None:
        return [request.output, partial_path(request.output)]
    from precision_tool.dump.runs import rank_path

    return [p for r in range(request.ranks) for p in (rank_path(request.output, r), partial_path(rank_path(request.output, r)))]


def check_run_target(request: CollectRequest) -> None:
    """--ranks: ``output`` is a run directory (made if missing); every rank's dump must be writable."""
    import os

    from precision_tool.dump.runs import rank_path

    if request.ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {request.ranks}")
    if request.fault_rank is not None and not 0 <= request.fault_rank < request.ranks:
        raise ConfigError(f"--fault-rank {request.fault_rank} is not a rank of {request.ranks}")
    unsupported = {"--checkpoint-dir": request.checkpoint_dir, "--if-load": request.if_load or None,
                   "--boost-level": request.boost_level if request.boost_level not in (None, "O0") else None,
                   "--boost-config": request.boost_config}
    given = [name for name, value in unsupported.items() if value is not None]
    if given:
        raise ConfigError(f"{given[0]} is not supported with --ranks yet")
    if os.path.exists(request.output) and not os.path.isdir(request.output):
        raise InputError(request.output, "exists and is not a directory; --ranks writes a run directory")
    if not os.path.isdir(request.output):  # made when the run starts, in a directory that must exist
        parent = os.path.dirname(os.path.abspath(request.output))
        if not os.path.isdir(parent):
            raise InputError(request.output, f"cannot create the run directory: no directory {parent}")
        return
    for rank in range(request.ranks):
        check_target(rank_path(request.output, rank), request.overwrite)


def _model_file(model: str) -> str | None:
    """The Python file of a ``FILE.py:FACTORY`` model, None for a built-in name."""
    file = model.rpartition(":")[0]
    return file if file.endswith(".py") else None


def build_device(request: CollectRequest, modes: tuple[str, ...]):
    """The device profile the request names: golden, npu, or npu with fusion off for fusion-off mode."""
    from precision_tool.engine.device import FusionSwitch, golden, npu

    npu_options = {"--precision-mode": request.precision_mode, "--precision-mode-v2": request.precision_mode_v2,
                   "--overflow-mode": request.overflow_mode, "--fusion-switch": request.fusion_switch,
                   "--modify-mixlist": request.modify_mixlist}
    device = request.device or "npu"
    if device == "golden":
        given = [name for name, value in npu_options.items() if value is not None]
        if given:
            raise ConfigError(f"{given[0]} applies to --device npu only")
        if M.FUSION_OFF in modes:
            raise ConfigError("mode fusion-off runs the npu device with fusion passes off; "
                              "it cannot be combined with --device golden")
        return golden()
    if device != "npu":
        raise ConfigError(f"unknown device {device!r}; valid: golden, npu")
    fusion = request.fusion_switch
    if fusion is None and M.FUSION_OFF in modes:
        fusion = FusionSwitch(all_off=True)
    options = {"precision_mode": request.precision_mode, "precision_mode_v2": request.precision_mode_v2,
               "fusion_switch": fusion, "modify_mixlist": request.modify_mixlist}
    if request.overflow_mode is not None:
        options["overflow_mode"] = request.overflow_mode
    return npu(**options)


def run_collect(request: CollectRequest | CollectPlan, hooks=()) -> CollectResult:
    """Train as ``request`` says with a collector (plus ``hooks``); the dump is incomplete if it raises."""
    from precision_tool.session import Session

    plan = request if isinstance(request, CollectPlan) else plan_collect(request)
    req = plan.request
    if req.ranks is not None:
        return _collect_run(plan, hooks)
    collector = Collector(req.output, plan.modes, steps=plan.selection.steps, ops=plan.selection.ops,
                          op_types=plan.selection.op_types, backward=plan.selection.backward,
                          modules=plan.selection.modules,
                          command=req.command, overwrite=req.overwrite)
    session = Session(plan.config, hooks=[collector, *hooks])
    try:
        summary = session.run()
    except BaseException:
        collector.close(complete=False)
        raise
    return CollectResult(
        path=req.output, role=collector.role, mode=collector.mode, modes=list(plan.modes),
        complete=True, steps_run=collector.steps_run, ops_recorded=collector.ops_recorded,
        tensors_recorded=collector.tensors_recorded, size_bytes=collector.size_bytes,
        overflow_steps=list(summary.overflow_steps), accelerate_switch_step=summary.accelerate_switch_step,
        evaluations=list(summary.evaluations), checkpoints=list(summary.checkpoints),
        resumed_from=summary.resumed_from, filtered=not plan.selection.everything,
    )


def _collect_run(plan: CollectPlan, hooks=()) -> CollectResult:
    """--ranks: the run directory's dumps (`precision_tool.collect.ranks`); the counts summed over the ranks."""
    from precision_tool.collect.ranks import collect_ranks

    req = plan.request
    collectors, summaries = collect_ranks(plan, hooks)
    first = summaries[0]
    return CollectResult(
        path=req.output, role=collectors[0].role, mode=collectors[0].mode, modes=list(plan.modes), complete=True,
        steps_run=collectors[0].steps_run, ops_recorded=sum(c.ops_recorded for c in collectors),
        tensors_recorded=sum(c.tensors_recorded for c in collectors),
        size_bytes=sum(c.size_bytes for c in collectors),
        overflow_steps=list(first.overflow_steps), accelerate_switch_step=first.accelerate_switch_step,
        evaluations=list(first.evaluations), filtered=not plan.selection.everything, world_size=len(collectors))
