"""A training script for `precision-tool zoom -- python zoom_script.py CASE_ID [LEVEL]`: one run of a real-model case.

Under zoom it runs the run `ptt.zoom_role()` names: the golden one plain, the target one with the case's fault
and precision; `ptt.dump` takes its path, mode and filters from the environment.
"""

import contextlib
import sys

import precision_tool.torch as ptt
from tests.realmodels.cases import FAULTS, MODELS, _target_context, build, fault_cases, train


def main(case_id: str, level: str = "op") -> None:
    case = next(c for c in fault_cases() if c.id == case_id)
    role = ptt.zoom_role() or "golden"
    run = build(case)
    context = contextlib.nullcontext()
    if role == "target":
        if FAULTS[case.fault] is not None:
            FAULTS[case.fault](run, MODELS[case.model][2][case.role])
        context = _target_context(case.target)
    with context, ptt.dump(f"{role}.h5", mode="stats", model=case.model, seed=0, level=level):
        train(run, loss_scale=case.loss_scale if role == "target" else 1.0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
