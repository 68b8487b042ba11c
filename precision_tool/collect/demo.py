"""The demo's four collections of the ``sensor`` model, shared by `precision-tool demo` and sample_dumps/.

The sensor model (see `precision_tool.session.models`) has a planted,
realistic fault: its LayerNorm is built from primitive ops and the npu's
LayerNormFusionPass fuses it into a kernel that takes the variance in one
pass in float16, which cancels catastrophically on raw readings around 30.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from precision_tool.collect.collector import collect_to
from precision_tool.dump.partial import check_target
from precision_tool.engine.device import FusionSwitch, golden, npu

DEMO_MODEL = "sensor"
DEMO_PRECISION_MODE = "force_fp16"  # GE's default precision mode
DEMO_STEPS = 6


@dataclass(frozen=True)
class DemoRun:
    """One collection: its role, what it ran on, where it went and how the loss went."""

    role: str
    description: str
    path: Path
    losses: tuple[float, ...]
    overflow_steps: tuple[int, ...]


def _plan(workdir: Path):
    on_npu = dict(precision_mode=DEMO_PRECISION_MODE, overflow_mode="saturation")
    return [
        ("golden", "golden CPU, float32", golden(), "dump"),
        ("target", f"npu {DEMO_PRECISION_MODE}, fusion on", npu(**on_npu), "dump"),
        ("overflow", f"npu {DEMO_PRECISION_MODE}, overflow mode", npu(**on_npu), "overflow"),
        ("fusion-off", f"npu {DEMO_PRECISION_MODE}, fusion off",
         npu(**on_npu, fusion_switch=FusionSwitch(all_off=True)), "fusion-off"),
    ]


FILE_NAMES = {"golden": "golden.h5", "target": "npu.h5", "overflow": "overflow.h5", "fusion-off": "fusion_off.h5"}


def demo_paths(workdir) -> list[Path]:
    """The four dumps the demo writes in ``workdir``."""
    return [Path(workdir) / name for name in FILE_NAMES.values()]


STAGING = ".demo-next"  # in the work directory: a run replacing earlier dumps writes here until all four are done


def collect_demo(workdir, steps: int = DEMO_STEPS, seed: int = 0, on_run=None,
                 overwrite: bool = True) -> list[DemoRun]:
    """Run the four collections into ``workdir``; ``on_run(DemoRun)`` is called after each.

    With ``overwrite=False`` nothing is run when one of the four dumps exists (InputError). A run that
    replaces dumps writes its four in ``workdir/.demo-next`` and moves them onto the earlier ones once the
    last is done: stopped before (Ctrl-C), it leaves the earlier four as they were, not a mix of two runs.
    """
    import os
    import shutil

    from precision_tool.outputs import mode_for, output_target
    from precision_tool.session import Session, SessionConfig

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for path in demo_paths(workdir):  # all four checked before the first run writes anything
        check_target(path, overwrite)
    replacing = any(os.path.lexists(path) for path in demo_paths(workdir))
    folder = workdir / STAGING if replacing else workdir
    if replacing:  # (the folder is the demo's own: what an earlier, stopped run left in it goes)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    runs = []
    for role, description, device, mode in _plan(workdir):
        path = folder / FILE_NAMES[role]
        config = SessionConfig(model=DEMO_MODEL, steps=steps, seed=seed, device=device)
        with collect_to(path, mode=mode, overwrite=overwrite) as collector:
            summary = Session(config, hooks=[collector]).run()
        run = DemoRun(role, description, workdir / FILE_NAMES[role], tuple(summary.losses),
                      tuple(summary.overflow_steps))
        runs.append(run)
        if on_run is not None:
            on_run(run)
    if replacing:
        for run in runs:
            target = output_target(run.path)  # (a link at the name is kept: the file it names is replaced)
            os.chmod(folder / run.path.name, mode_for(target))
            os.replace(folder / run.path.name, target)
        folder.rmdir()
    return runs
