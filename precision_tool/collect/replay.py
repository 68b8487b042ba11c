"""One-step replay: restore step N of a run from its checkpoint and dump that step on golden and on the target.

The original tool's ``train`` command restored a TensorFlow checkpoint, fed
the saved inputs, and ran the train op once on the CPU and once on the NPU
with dumping on. This is the same for a session's checkpoints
(`precision_tool.session.checkpoint`): the state before step N and step N's
stored batch go into two sessions, one on the golden device and one on the
device the run trained on (taken from the checkpoint's run settings, each
setting overridable). Each writes a full dump of just that step; the
diagnosis then reads the pair like any other. A user looks at step 9,000
of a long run without dumping 9,000 steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from precision_tool.collect import modes as M
from precision_tool.collect.collector import Collector
from precision_tool.dump.partial import check_target
from precision_tool.errors import ConfigError, InputError

GOLDEN_NAME, TARGET_NAME = "golden.h5", "target.h5"


@dataclass(frozen=True)
class DeviceOverrides:
    """Replay settings that replace the checkpoint's target device settings; None keeps the recorded one."""

    device: str | None = None  # "golden" or "npu"
    precision_mode: str | None = None
    precision_mode_v2: str | None = None
    overflow_mode: str | None = None
    fusion_switch: str | None = None  # a fusion_switch.cfg path
    modify_mixlist: str | None = None  # a modify_mixlist JSON path

    def given(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ReplayRequest:
    checkpoint_dir: str
    output_dir: str
    step: int | None = None  # None: the latest checkpoint
    overrides: DeviceOverrides = DeviceOverrides()
    mode: str = M.DUMP
    overwrite: bool = False
    command: str = ""


@dataclass
class ReplayResult:
    """What a replay ran and wrote."""

    checkpoint: str
    step: int
    golden: str
    target: str
    golden_device: dict
    target_device: dict
    golden_loss: float
    target_loss: float
    golden_overflow: bool
    target_overflow: bool


def target_device(recorded: dict, overrides: DeviceOverrides):
    """The checkpoint's device with the given settings replaced."""
    from precision_tool.engine.device import FusionSwitch, device_from_description, golden, npu

    try:
        base = device_from_description(recorded)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"the checkpoint's device settings cannot be rebuilt: {exc}") from None
    given = overrides.given()
    if not given:
        return base
    kind = given.pop("device", base.kind)
    if kind == "golden":
        if given:
            raise ConfigError(f"--{next(iter(given)).replace('_', '-')} applies to an npu target only")
        return golden(float64=base.origin.name == "float64")
    if kind != "npu":
        raise ConfigError(f"unknown device {kind!r}; valid: golden, npu")
    npu_base = base if base.kind == "npu" else npu()
    device = npu(precision_mode=given.get("precision_mode", npu_base.precision_mode if "precision_mode_v2" not in given
                                          else None),
                 precision_mode_v2=given.get("precision_mode_v2", npu_base.precision_mode_v2
                                             if "precision_mode" not in given else None),
                 overflow_mode=given.get("overflow_mode", npu_base.overflow_mode),
                 modify_mixlist=given.get("modify_mixlist"),
                 fusion_switch=given.get("fusion_switch", npu_base.fusion if base.kind == "npu" else FusionSwitch()))
    if "modify_mixlist" not in given:
        device = dataclasses.replace(device, mixlists=npu_base.mixlists)
    return device


def replay(request: ReplayRequest, hooks=()) -> ReplayResult:
    """Run step ``request.step`` from its checkpoint on golden and on the target; write both dumps."""
    from precision_tool.engine.device import golden as golden_device
    from precision_tool.session import Session, SessionConfig
    from precision_tool.session.checkpoint import check_batch, find_checkpoint, load_checkpoint

    modes = M.parse_modes(request.mode)
    path = find_checkpoint(request.checkpoint_dir, request.step)
    checkpoint = load_checkpoint(path)
    out = Path(request.output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(out, "is not a directory; replay writes golden.h5 and target.h5 into a directory")
    paths = {"golden": out / GOLDEN_NAME, "target": out / TARGET_NAME}
    recorded = checkpoint.config
    target = target_device(recorded.get("device") or {}, request.overrides)
    reference = golden_device(float64=target.origin.name == "float64")
    try:
        base = SessionConfig(
            model=recorded["model"], steps=checkpoint.step + 1, seed=recorded["seed"],
            batch_size=recorded["batch_size"], optimizer=recorded["optimizer"], lr=recorded["lr"],
            loss_scale=_loss_scale(recorded.get("loss_scale")), target_loss=recorded.get("target_loss"),
            train_steps=0, eval_steps=0, save_steps=0, boost_level=recorded.get("boost_level") or "O0",
            boost_config=recorded.get("boost_config"))
    except KeyError as exc:
        raise InputError(path, f"its run settings lack {exc}") from None
    accelerate = recorded.get("accelerate_train_mode") if target.kind == "npu" else None
    configs = {"golden": dataclasses.replace(base, device=reference),
               "target": dataclasses.replace(base, device=target, accelerate_train_mode=accelerate)}
    runs = {}
    for role in ("golden", "target"):  # the checkpoint checked against both runs before anything is written
        collector = Collector(str(paths[role]), modes, command=request.command, overwrite=request.overwrite)
        session = Session(configs[role], hooks=[collector, *hooks])
        session.restore(checkpoint)
        if checkpoint.inputs:  # (none stored: the step regenerates its batch)
            check_batch(str(path), checkpoint.inputs, *_batch_form(session.data, checkpoint.step))
        runs[role] = collector, session
    _make_output(out, paths, request.overwrite)
    results = {}
    for role, (collector, session) in runs.items():
        try:
            session.hooks.on_run_begin({**session.metadata(), "replay_of": str(path)})
            session.step(batch=checkpoint.inputs or None)
            session.hooks.on_run_end(session.summary().to_dict())
        except BaseException:
            collector.close(complete=False)
            raise
        results[role] = session.results[-1]
    return ReplayResult(str(path), checkpoint.step, str(paths["golden"]), str(paths["target"]),
                        reference.describe(), configs["target"].device.describe(),
                        results["golden"].loss, results["target"].loss,
                        results["golden"].overflow, results["target"].overflow)


def _batch_form(data, step: int) -> tuple[dict, dict]:
    """One example of ``data``'s batch of ``step``, and the bound of each integer array (labels, token ids)."""
    from precision_tool.session.data import SyntheticData

    sample = SyntheticData(data.spec, data.seed, 1).batch(step)
    bounds = {"labels": data.n_out if data.classification else None,
              "x": int(data.spec.vocab_size) if data.spec.kind == "tokens" else None}
    return sample, bounds


def _make_output(out: Path, paths: dict, overwrite: bool) -> None:
    """Create ``out`` if missing and check both dumps can be written there; remove it again if they cannot."""
    from precision_tool.outputs import problem

    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(out, f"cannot create the output directory: {problem(exc)}") from None
    try:
        for written in paths.values():
            check_target(written, overwrite)
    except BaseException:
        if created:
            out.rmdir()
        raise


def _loss_scale(config):
    from precision_tool.session.loss_scale import loss_scale_from_config

    return loss_scale_from_config(config)

