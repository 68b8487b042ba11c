"""Runs of two simulated ranks, collected once per session: a clean golden run, a clean npu run, a run whose
rank 1 skips the gradient all-reduce."""

from __future__ import annotations

import pytest

STEPS = 3


def _collect(path, **options):
    from precision_tool.collect.run import CollectRequest, run_collect

    return run_collect(CollectRequest(model="mlp", output=str(path), steps=STEPS, ranks=2, **options))


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    made = {"golden": root / "golden", "npu": root / "npu", "fault": root / "fault"}
    _collect(made["golden"], device="golden")
    _collect(made["npu"], device="npu", precision_mode="force_fp16")
    _collect(made["fault"], device="golden", fault_rank=1)
    return made
