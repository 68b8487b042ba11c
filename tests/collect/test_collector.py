"""The collector fed synthetic hook calls (no session)."""

import numpy as np
import pytest

from precision_tool.collect import Collector, collect_to
from precision_tool.dump.reader import open_dump
from precision_tool.engine.graph import FusionInfo
from precision_tool.engine.hooks import OpEvent, StepResult
from precision_tool.errors import ConfigError

METADATA = {"model": "toy", "seed": 3, "steps": 3,
            "device": {"device": "npu", "precision_mode": "", "precision_mode_v2": "",
                       "effective_precision_mode": "allow_fp32_to_fp16", "overflow_mode": "saturation",
                       "fusion": {"all_off": False, "off": []}},
            "loss_scale": {"kind": "fixed", "scale": 8.0}, "accelerate_train_mode": None}
FUSED = FusionInfo("MatMulBiasAddFusionPass", ("fc/MatMul", "fc/BiasAdd"), ("MatMul", "BiasAdd"),
                   (("fc/BiasAdd", 0),), (("fc/MatMul", 0), ("fc/MatMul", 1), ("fc/BiasAdd", 1)))


def _events(step: int, overflow_at=None):
    """Forward fused matmul, a relu reading its output, backward of both, an optimizer update."""
    x = np.full((2, 3), 0.5, np.float32)
    w = np.ones((3, 4), np.float32)
    b = np.zeros(4, np.float32)
    y = x @ w + b
    r = np.maximum(y, 0)
    if overflow_at == "relu":
        r = np.full_like(y, 65504.0)
    g = np.ones_like(r)
    events = [
        OpEvent(step, "fc/MatMulBiasAdd", "MatMulBiasAdd", 0, "forward", [x, w, b],
                ["float16", "float32", "float32"], "float16", FUSED, {"transpose_b": False}, [y], ["float16"]),
        OpEvent(step, "act/Relu", "Relu", 1, "forward", [y], ["float16"], "float16", None, {}, [r], ["float16"],
                overflow=overflow_at == "relu"),
        OpEvent(step, "act/Relu", "Relu", 2, "backward", [g], ["float16"], "float16", None, {}, [g], ["float16"]),
        OpEvent(step, "fc/MatMulBiasAdd", "MatMulBiasAdd", 3, "backward", [g], ["float16"], "float16", FUSED,
                {}, [None, x, b], ["", "float16", "float16"]),
        OpEvent(step, "fc/weight/ApplyGradientDescent", "ApplyGradientDescent", 4, "optimizer",
                [w, np.float32(0.1), w], ["float32"] * 3, "float32", None, {}, [w * 0.9], ["float32"]),
    ]
    if overflow_at == "inherited":
        bad = np.array([np.inf, 1.0], np.float32)
        events.append(OpEvent(step, "act/Exp", "Exp", 5, "forward", [bad], ["float16"], "float16", None, {},
                              [bad], ["float16"], overflow=True))
    return events


def _run(collector, steps=3, overflow=None):
    collector.on_run_begin(METADATA)
    for step in range(steps):
        collector.on_step_begin(step)
        for event in _events(step, (overflow or {}).get(step)):
            collector.after_op(event)
        collector.on_step_end(StepResult(step, 1.0 / (step + 1), step in (overflow or {}), 8.0, False,
                                         "allow_fp32_to_fp16", {"global_step": step + 1}))
    collector.on_run_end({"accelerate_switch_step": None, "global_step": steps})


def test_dump_mode_records_every_op_with_data(tmp_path):
    path = tmp_path / "d.h5"
    _run(Collector(path, "dump", command="test"))
    with open_dump(path) as dump:
        assert dump.complete and dump.role == "target" and dump.mode == "dump"
        assert dump.metadata["command"] == "test" and dump.metadata["overflow_mode"] == "saturation"
        assert dump.metadata["loss_scale"] == {"kind": "fixed", "scale": 8.0}
        ops = dump.ops(step=1)
        assert [(o.exec_index, o.direction) for o in ops] == [
            (0, "forward"), (1, "forward"), (2, "backward"), (3, "backward"), (4, "optimizer")]
        fused = ops[0]
        assert fused.pass_name == "MatMulBiasAddFusionPass" and fused.original_types == ("MatMul", "BiasAdd")
        assert fused.attrs == {"transpose_b": False}
        assert [t.slot for t in ops[3].tensors] == ["input_0", "output_1", "output_2"]  # the None grad is skipped
        assert ops[4].tensor("input_1").shape == () and ops[4].tensor("input_1").dtype == "float32"
        assert np.array_equal(dump.tensor(1, 1, "output_0"), np.full((2, 4), 1.5, np.float32))
        assert all(t.has_data for o in ops for t in o.tensors)


def test_stats_mode_writes_no_tensor_data(tmp_path):
    path = tmp_path / "s.h5"
    _run(Collector(path, "stats"))
    with open_dump(path) as dump:
        ops = dump.ops()
        assert len(ops) == 15 and not any(t.has_data for o in ops for t in o.tensors)
        assert ops[1].tensor("output_0").stats.mean == 1.5
        with pytest.raises(KeyError):
            dump.tensor(0, 1, "output_0")


def test_overflow_mode_records_only_overflowing_ops(tmp_path):
    path = tmp_path / "o.h5"
    _run(Collector(path, "overflow"), overflow={1: "relu", 2: "inherited"})
    with open_dump(path) as dump:
        assert dump.role == "overflow"
        ops = dump.ops()
        assert [(o.step, o.name) for o in ops] == [(1, "act/Relu"), (2, "act/Exp")]
        assert not ops[0].inherited_nonfinite and ops[1].inherited_nonfinite
        assert ops[0].tensor("output_0").stats.saturated == 8
        assert np.array_equal(dump.tensor(1, 1, "input_0"), np.full((2, 4), 1.5, np.float32))
        summary = dump.summary()
        assert summary.overflow_ops == 2 and summary.overflow_steps == [1, 2]
        assert [s.step for s in dump.steps()] == [0, 1, 2]  # every step has its group


def test_overflow_plus_stats(tmp_path):
    path = tmp_path / "os.h5"
    _run(Collector(path, "overflow,stats", op_types="MatMulBiasAdd"), overflow={1: "relu"})
    with open_dump(path) as dump:
        assert dump.modes == ["stats", "overflow"] and dump.mode == "stats"
        step1 = dump.ops(step=1)
        assert [o.name for o in step1] == ["fc/MatMulBiasAdd", "act/Relu", "fc/MatMulBiasAdd"]
        assert not step1[0].tensors[0].has_data and step1[1].tensors[0].has_data


def test_selection_of_steps_ops_and_backward(tmp_path):
    path = tmp_path / "sel.h5"
    _run(Collector(path, "dump", steps="0,2", ops="act/*", backward=False))
    with open_dump(path) as dump:
        assert [(o.step, o.exec_index) for o in dump.ops()] == [(0, 1), (2, 1)]
        assert dump.steps_complete == 3
        assert dump.metadata["selection"] == {"steps": [0, 2], "ops": ["act/*"], "modules": [], "op_types": None,
                                              "backward": False}


def test_context_manager_marks_an_interrupted_run_incomplete(tmp_path):
    path = tmp_path / "ctx.h5"
    with pytest.raises(KeyboardInterrupt):
        with collect_to(path, mode="stats") as collector:
            collector.on_run_begin(METADATA)
            collector.on_step_begin(0)
            for event in _events(0):
                collector.after_op(event)
            collector.on_step_end(StepResult(0, 1.0, False, 8.0))
            collector.on_step_begin(1)
            raise KeyboardInterrupt
    with open_dump(path) as dump:
        assert not dump.complete and dump.steps_complete == 1


def test_one_collector_records_one_run(tmp_path):
    collector = Collector(tmp_path / "one.h5", "stats")
    _run(collector, steps=1)
    with pytest.raises(ConfigError, match="one run"):
        collector.on_run_begin(METADATA)


def test_golden_role_and_accelerate_switch(tmp_path):
    path = tmp_path / "g.h5"
    collector = Collector(path, "stats")
    collector.on_run_begin({**METADATA, "device": {"device": "golden"}})
    collector.on_step_begin(0)
    collector.on_step_end(StepResult(0, 1.0, False, 1.0))
    collector.on_run_end({"accelerate_switch_step": 7})
    with open_dump(path) as dump:
        assert dump.role == "golden" and dump.summary().accelerate_switch_step == 7


def test_an_array_is_stored_once_per_step(tmp_path):
    import h5py

    path = tmp_path / "links.h5"
    _run(Collector(path, "dump"), steps=1)
    with h5py.File(path, "r") as f:  # small tensors are packed: the two slots point at the same bytes
        step = f["steps/000000"]
        index, first = step["index"][()], step["op_index"]["first_tensor"]
        where = {(op, int(row["kind"]), int(row["slot"])): (int(row["pack"]), int(row["offset"]))
                 for op in (0, 1) for row in index[first[op]:first[op] + step["op_index"]["n_tensors"][op]]}
        produced, consumed = where[0, 1, 0], where[1, 0, 0]  # fc's output_0, act's input_0
        assert produced == consumed and produced[0] == 0
        assert where[0, 0, 0] != produced  # fc's input_0
    with open_dump(path) as dump:
        assert np.array_equal(dump.tensor(0, 1, "input_0"), dump.tensor(0, 0, "output_0"))


def test_steps_that_repeat_the_same_ops_share_one_op_index(tmp_path):
    import h5py

    from precision_tool.session import Session, SessionConfig

    path = tmp_path / "s.h5"
    with collect_to(path, mode="stats") as collector:
        Session(SessionConfig(model="mlp", steps=3), hooks=[collector]).run()
    with h5py.File(path, "r") as f:
        tables = [f[f"steps/{s:06d}/op_index"] for s in range(3)]
        addresses = {h5py.h5o.get_info(t.id).addr for t in tables}
        assert len(addresses) == 1  # one dataset, hard-linked from each step
        assert all(np.array_equal(t[()], tables[0][()]) for t in tables)
        indexes = [f[f"steps/{s:06d}/index"] for s in range(3)]
        assert len({h5py.h5o.get_info(t.id).addr for t in indexes}) == 3  # statistics differ every step
    with open_dump(path) as dump:
        assert [len(dump.ops(step=s)) for s in range(3)] == [collector.ops_recorded // 3] * 3
