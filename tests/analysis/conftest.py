"""Dumps of the planted-fault models, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from precision_tool.collect import collect_to
from precision_tool.dump.reader import open_dump
from precision_tool.engine.device import FusionSwitch, golden, npu
from precision_tool.session import Session, SessionConfig

PLANTED = str(Path(__file__).with_name("planted.py"))


def record(path, model: str, device, hooks=(), mode: str = "dump", steps: int = 1) -> Path:
    with collect_to(path, mode=mode) as collector:
        Session(SessionConfig(model=model, steps=steps, device=device), hooks=[*hooks, collector]).run()
    return Path(path)


@pytest.fixture(scope="session")
def planted_dumps(tmp_path_factory):
    """Open (golden, target, fusion_off) dumps for a planted model: planted_dumps(name, mode, hooks)."""
    root = tmp_path_factory.mktemp("planted")
    cache = {}

    def make(name: str, precision_mode: str = "force_fp16", hooks=(), fusion_off: bool = False):
        key = (name, precision_mode, tuple(type(h).__name__ for h in hooks), fusion_off)
        if key not in cache:
            model = name if ":" not in name and "/" not in name and name in ("mlp", "transformer", "cnn") \
                else f"{PLANTED}:{name}"
            stem = root / "_".join(str(k) for k in key[:3]).replace("/", "_")
            paths = [record(f"{stem}_g.h5", model, golden()),
                     record(f"{stem}_t.h5", model, npu(precision_mode=precision_mode), hooks)]
            if fusion_off:
                paths.append(record(f"{stem}_f.h5", model,
                                    npu(precision_mode=precision_mode, fusion_switch=FusionSwitch(all_off=True))))
            cache[key] = paths
        return [open_dump(p) for p in cache[key]]

    return make
