"""`replay`: re-running a recorded aten op through PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from .torch_helpers import make_mlp, train  # noqa: E402


def _inputs(dump, op):
    return [dump.tensor(op.step, op.exec_index, t.slot) for t in op.inputs]


def _outputs(dump, op):
    return [dump.tensor(op.step, op.exec_index, t.slot) for t in op.outputs]


def test_replaying_a_recorded_mm_reproduces_the_golden_output(tmp_path):
    with ptt.dump(tmp_path / "g.h5"):
        train(make_mlp())
    with open_dump(tmp_path / "g.h5") as dump:
        op = dump.op(0, "MLP/fc2/aten.addmm_0/aten.mm_1", "backward")
        assert op.type == "aten.mm"
        outputs = ptt.replay(op, _inputs(dump, op))
        np.testing.assert_array_equal(outputs[0], _outputs(dump, op)[0])
        by_slot = {t.slot: dump.tensor(0, op.exec_index, t.slot) for t in op.inputs}
        np.testing.assert_array_equal(ptt.replay(op, by_slot)[0], outputs[0])


def test_replay_rebuilds_scalar_and_integer_arguments(tmp_path):
    with ptt.dump(tmp_path / "g.h5"):
        train(make_mlp())
    with open_dump(tmp_path / "g.h5") as dump:
        loss = dump.op(0, "aten.nll_loss_forward_0")
        assert [t.dtype for t in loss.inputs][1] == "int64"
        np.testing.assert_array_equal(ptt.replay(loss, _inputs(dump, loss))[0], _outputs(dump, loss)[0])
        update = dump.op(0, "optimizer/SGD/aten.add__0", "optimizer")  # alpha=-lr, in place
        np.testing.assert_array_equal(ptt.replay(update, _inputs(dump, update))[0], _outputs(dump, update)[0])


def test_replay_on_the_npu_reproduces_the_simulated_output(tmp_path):
    with ptt.simulate_npu("force_fp16", "saturation"), ptt.dump(tmp_path / "t.h5"):
        train(make_mlp(scale=1e5))
    with open_dump(tmp_path / "t.h5") as dump:
        op = dump.op(0, "MLP/fc1/aten.addmm_0")
        inputs = _inputs(dump, op)
        simulated, overflowed = ptt.replay_op(op, inputs, "npu", "force_fp16", "saturation")
        np.testing.assert_array_equal(simulated[0], _outputs(dump, op)[0])
        assert overflowed and np.abs(simulated[0]).max() == 65504.0
        golden = ptt.replay(op, inputs, "golden")
        assert np.abs(golden[0]).max() > 65504.0


def test_records_without_arguments_are_not_replayable(tmp_path):
    from precision_tool.dump.records import OpRecord

    record = OpRecord(0, 0, "x", "aten.mm", "forward", "float32", False)
    with pytest.raises(ptt.NotReplayable):
        ptt.replay(record, [])
    record = OpRecord(0, 0, "x", "aten.no_such_op", "forward", "float32", False, attrs={"args": []})
    with pytest.raises(ptt.NotReplayable, match="not an op"):
        ptt.replay(record, [])


def test_inputs_the_kernel_refuses_make_the_op_not_replayable(tmp_path):
    """Golden's inputs of another shape than the call's (a region paired with golden's other op): the kernel's
    own error, as NotReplayable naming the op, for the diagnosis to note and go on."""
    with ptt.dump(tmp_path / "g.h5"):
        train(make_mlp())
    with open_dump(tmp_path / "g.h5") as dump:
        op = dump.op(0, "MLP/fc2/aten.addmm_0/aten.mm_1", "backward")
        wrong = [np.ones((3, 7), np.float32) for _ in op.inputs]
        for device in ("golden", "npu"):
            with pytest.raises(ptt.NotReplayable, match="MLP/fc2/aten.addmm_0/aten.mm_1: its kernel refuses"):
                ptt.replay(op, wrong, device=device)


def test_an_npu_replay_rounds_golden_inputs_into_the_recorded_formats(tmp_path):
    with ptt.simulate_npu("allow_mix_precision"), ptt.dump(tmp_path / "t.h5"):
        train(make_mlp())
    with ptt.dump(tmp_path / "g.h5"):
        train(make_mlp())
    with open_dump(tmp_path / "t.h5") as target, open_dump(tmp_path / "g.h5") as golden:
        relu = target.op(0, "MLP/act/aten.relu_0")
        assert relu.inputs[0].dtype == "float16" and relu.compute_dtype == "float16"
        golden_in = _inputs(golden, golden.op(0, "MLP/act/aten.relu_0"))
        replayed = ptt.replay(relu, golden_in, "npu", "allow_mix_precision")
        rounded = np.maximum(golden_in[0].astype(np.float16).astype(np.float32), 0)
        np.testing.assert_array_equal(replayed[0], rounded)


def test_replay_as_recorded_takes_the_numerics_from_the_dump_metadata(tmp_path):
    with ptt.simulate_npu(precision_mode_v2="mixed_float16"), ptt.dump(tmp_path / "t.h5"):
        train(make_mlp())
    with torch.autocast("cpu", dtype=torch.bfloat16), ptt.dump(tmp_path / "a.h5"):
        train(make_mlp())
    for path in ("t.h5", "a.h5"):
        with open_dump(tmp_path / path) as dump:
            op = dump.op(0, "MLP/fc1/aten.addmm_0")
            outputs, _ = ptt.replay_as_recorded(op, _inputs(dump, op), dump.metadata)
            np.testing.assert_array_equal(outputs[0], _outputs(dump, op)[0])
