"""`dump`: what a training step records, in each mode."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from precision_tool.errors import ConfigError  # noqa: E402
from .torch_helpers import make_mlp, train  # noqa: E402


def test_a_training_step_records_forward_backward_and_optimizer_ops(tmp_path):
    run = make_mlp()
    with ptt.dump(tmp_path / "g.h5"):
        train(run)
    with open_dump(tmp_path / "g.h5") as dump:
        assert dump.metadata["framework"] == "torch"
        assert dump.metadata["role"] == "golden"
        assert dump.metadata["device"] == "golden"
        assert dump.metadata["mode"] == "dump"
        ops = dump.ops(step=0)
        assert [s.step for s in dump.steps()] == [0]
    by_name = {(op.name, op.direction): op for op in ops}
    fc1 = by_name[("MLP/fc1/aten.addmm_0", "forward")]
    assert fc1.type == "aten.addmm" and fc1.compute_dtype == "float32"
    assert [(t.slot, t.shape, t.dtype) for t in fc1.tensors] == [
        ("input_0", (16,), "float32"), ("input_1", (5, 8), "float32"), ("input_2", (8, 16), "float32"),
        ("output_0", (5, 16), "float32")]
    grad_w = by_name[("MLP/fc2/aten.addmm_0/aten.mm_1", "backward")]
    assert grad_w.type == "aten.mm" and grad_w.outputs[0].shape == (4, 16)
    assert grad_w.attrs["forward_op"] == "MLP/fc2/aten.addmm_0"
    assert grad_w.attrs["autograd_node"] == "AddmmBackward0"
    assert {op.direction for op in ops} == {"forward", "backward", "optimizer"}
    assert [op.name for op in ops if op.direction == "optimizer"] == [f"optimizer/SGD/aten.add__{i}" for i in range(4)]
    assert [op.exec_index for op in ops] == sorted(op.exec_index for op in ops)


def test_recorded_tensors_hold_the_values_the_op_saw(tmp_path):
    run = make_mlp()
    model, _, x, _ = run
    expected = model.fc1(x).detach().numpy()
    with ptt.dump(tmp_path / "g.h5"):
        train(run)
    with open_dump(tmp_path / "g.h5") as dump:
        op = dump.op(0, "MLP/fc1/aten.addmm_0")
        np.testing.assert_array_equal(dump.tensor(0, op.exec_index, "input_1"), x.numpy())
        np.testing.assert_allclose(dump.tensor(0, op.exec_index, "output_0"), expected, rtol=1e-6)
        stats = op.tensor("output_0").stats
        assert stats.count == expected.size and stats.max == pytest.approx(float(expected.max()))


def test_in_place_ops_record_their_input_before_the_update(tmp_path):
    run = make_mlp()
    before = run[0].fc1.weight.detach().clone()
    with ptt.dump(tmp_path / "g.h5"):
        train(run)
    with open_dump(tmp_path / "g.h5") as dump:
        update = dump.op(0, "optimizer/SGD/aten.add__0", "optimizer")
        np.testing.assert_array_equal(dump.tensor(0, update.exec_index, "input_0"), before.numpy())
        np.testing.assert_array_equal(dump.tensor(0, update.exec_index, "output_0"), run[0].fc1.weight.detach().numpy())


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_an_in_place_op_records_the_statistics_of_its_result(tmp_path, mode):
    run = make_mlp()
    weight = run[0].fc1.weight.detach()
    before = weight.clone()
    with ptt.dump(tmp_path / "g.h5", mode=mode):
        train(run)
    with open_dump(tmp_path / "g.h5") as dump:
        update = dump.op(0, "optimizer/SGD/aten.add__0", "optimizer")
    stats = {t.slot: t.stats for t in update.tensors}
    assert stats["input_0"].max == float(before.max()) and stats["input_0"].min == float(before.min())
    assert stats["output_0"].max == float(weight.max()) and stats["output_0"].min == float(weight.min())
    assert stats["output_0"] != stats["input_0"]


def test_repeated_ops_share_one_arguments_record(tmp_path):
    run = make_mlp()
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        train(run, steps=2)
    with open_dump(tmp_path / "g.h5") as dump:
        first, second = (dump.op(step, "MLP/fc1/aten.addmm_0") for step in (0, 1))
        update = dump.op(1, "optimizer/SGD/aten.add__0", "optimizer")
    assert first.attrs == second.attrs == {"overload": "default", "kwargs": {}, "args": [
        {"tensor": 0, "dtype": "float32"}, {"tensor": 1, "dtype": "float32"}, {"tensor": 2, "dtype": "float32"}],
        "names": ["self", "mat1", "mat2"]}
    assert update.attrs["kwargs"] == {"alpha": -0.1}


def test_stats_mode_records_statistics_without_data(tmp_path):
    with ptt.dump(tmp_path / "s.h5", mode="stats"):
        train(make_mlp())
    with open_dump(tmp_path / "s.h5") as dump:
        op = dump.op(0, "MLP/act/aten.relu_0")
        assert dump.mode == "stats"
        assert not any(t.has_data for t in op.tensors)
        assert op.outputs[0].stats.min == 0.0 and op.outputs[0].stats.count == 5 * 16
        with pytest.raises(KeyError):
            dump.tensor(0, op.exec_index, "output_0")


def test_steps_end_at_optimizer_step_and_only_chosen_steps_are_written(tmp_path):
    with ptt.dump(tmp_path / "g.h5", mode="stats", steps=[1, 2]):
        train(make_mlp(), steps=4)
    with open_dump(tmp_path / "g.h5") as dump:
        assert [s.step for s in dump.steps()] == [1, 2]
        assert {op.step for op in dump.ops()} == {1, 2}
        assert [op.name for op in dump.ops(step=1)] == [op.name for op in dump.ops(step=2)]


def test_explicit_step_records_the_loss_and_takes_over_from_the_optimizer(tmp_path):
    run = make_mlp()
    with ptt.dump(tmp_path / "g.h5", mode="stats") as d:
        losses = []
        for _ in range(3):
            losses += train(run)
            d.step(losses[-1])
    with open_dump(tmp_path / "g.h5") as dump:
        steps = dump.steps()
    assert [s.step for s in steps] == [0, 1, 2]
    assert [s.loss for s in steps] == pytest.approx(losses)


@pytest.mark.parametrize("explicit", [True, False])
def test_a_loss_scalers_update_stays_in_the_step_its_optimizer_ended(tmp_path, explicit):
    """torch.amp.GradScaler's loop as its docs write it, ``ptt.step(loss, scale)`` after ``scaler.update()``
    (or no ``ptt.step`` at all): one step an iteration, the scale's update in it. Before, the update opened a
    step of its own after the first optimizer step, and every later step was numbered one off golden's."""
    model, optimizer, x, y = make_mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    losses, scales = [], []
    with ptt.dump(tmp_path / "t.h5", mode="stats"):
        for _ in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
            scales.append(scaler.get_scale())
            if explicit:
                ptt.step(loss, scales[-1])
    with open_dump(tmp_path / "t.h5") as dump:
        steps = dump.steps()
        assert [s.step for s in steps] == [0, 1, 2]
        for step in (0, 1, 2):
            types = [r.type for r in dump.ops(step=step)]
            assert types.count("aten._amp_update_scale_") == 1 and types[-1] == "aten._amp_update_scale_"
            assert any(r.direction == "backward" for r in dump.ops(step=step))
    if explicit:
        assert [s.loss for s in steps] == pytest.approx(losses)
        assert [s.loss_scale for s in steps] == scales


def test_a_dump_without_steps_is_still_complete(tmp_path):
    with ptt.dump(tmp_path / "g.h5"):
        pass
    with open_dump(tmp_path / "g.h5") as dump:
        assert dump.complete and dump.steps() == []


def test_a_dump_opened_inside_one_to_the_same_file_says_this_process_writes_it(tmp_path):
    """Not "being written by another process": the writer is this process's own open dump."""
    from precision_tool.errors import InputError

    run = make_mlp()
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        train(run, steps=1)
        with pytest.raises(InputError, match="g.h5: is already being written by this process"):
            with ptt.dump(tmp_path / "g.h5", mode="stats"):
                pass
        train(run, steps=1)
    with open_dump(tmp_path / "g.h5") as dump:
        assert dump.complete and [s.step for s in dump.steps()] == [0, 1]


def test_a_dump_replaces_a_dump_or_an_empty_file_but_never_another_file(tmp_path):
    """Re-running a script replaces its last dump; a dump given a script's or a checkpoint's name by mistake
    refuses at the ``with`` and leaves that file as it was (it was replaced when the dump finished)."""
    from precision_tool.errors import InputError

    run = make_mlp()
    for name in ("g.h5", "g.h5", "empty.h5"):
        (tmp_path / "empty.h5").touch()
        with ptt.dump(tmp_path / name, mode="stats"):
            train(run, steps=1)
        with open_dump(tmp_path / name) as dump:
            assert dump.complete and [s.step for s in dump.steps()] == [0]
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    with pytest.raises(InputError, match=r"train.py: exists and is not a dump \(not an HDF5 file\)"):
        with ptt.dump(script, mode="stats"):
            train(run, steps=1)
    assert script.read_text() == "print('training')\n" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["empty.h5", "g.h5", "train.py"]


def test_a_dump_whose_file_fails_to_open_mid_step_is_not_left_attached(tmp_path):
    """Entered while a step is open, a dump opens its file at once; when that fails, the error reaches the
    ``with`` and the dump is not left attached (every later op would fail on it again)."""
    from precision_tool.errors import InputError

    run = make_mlp()
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        train(run, steps=1)
        run[0](run[2])  # a forward op: the next step is open
        inner = ptt.dump(tmp_path / "other.h5", mode="stats")

        def cannot_open():
            raise InputError(str(tmp_path / "other.h5"), "cannot create the dump: disk full")

        inner._open_writer = cannot_open
        with pytest.raises(InputError, match="disk full"):
            with inner:
                pass
        train(run, steps=1)
    with open_dump(tmp_path / "g.h5") as dump:
        assert dump.complete and [s.step for s in dump.steps()] == [0, 1]
    assert not (tmp_path / "other.h5").exists()


def test_an_interrupted_run_keeps_the_completed_steps(tmp_path):
    run = make_mlp()
    with pytest.raises(KeyboardInterrupt):
        with ptt.dump(tmp_path / "g.h5", mode="stats"):
            train(run, steps=2)
            run[0](run[2])
            raise KeyboardInterrupt
    with open_dump(tmp_path / "g.h5") as dump:
        assert not dump.complete
        assert [s.step for s in dump.steps()] == [0, 1]


def test_an_interruption_right_after_an_optimizer_step_keeps_that_step(tmp_path):
    """Ctrl-C while the next batch loads: the step the optimizer concluded is kept, though no op came after it."""
    run = make_mlp()
    with pytest.raises(KeyboardInterrupt):
        with ptt.dump(tmp_path / "g.h5", mode="stats"):
            train(run, steps=2)
            raise KeyboardInterrupt
    with open_dump(tmp_path / "g.h5") as dump:
        assert not dump.complete
        assert [s.step for s in dump.steps()] == [0, 1]
        assert [op.direction for op in dump.ops(step=1)][-1] == "optimizer"


def test_overflow_mode_records_only_overflowing_ops_first_the_culprit(tmp_path):
    run = make_mlp(scale=1e5)  # fc1 outputs exceed 65504
    with ptt.simulate_npu("force_fp16", "saturation"), ptt.dump(tmp_path / "o.h5", mode="overflow"):
        train(run)
    with open_dump(tmp_path / "o.h5") as dump:
        assert dump.role == "overflow"
        ops = dump.ops()
        first = ops[0]
        assert first.name == "MLP/fc1/aten.addmm_0" and first.overflow and not first.inherited_nonfinite
        assert first.compute_dtype == "float16"
        stats = first.outputs[0].stats
        assert stats.saturated > 0 and max(-stats.min, stats.max) == 65504.0
        assert all(op.overflow for op in ops) and all(t.has_data for t in first.tensors)


def test_golden_overflow_mode_catches_non_finite_results(tmp_path):
    x = torch.tensor([1e30, 1.0])
    with ptt.dump(tmp_path / "o.h5", mode="overflow"):
        y = x * x
        z = y + 1
        w = x - 1
    with open_dump(tmp_path / "o.h5") as dump:
        ops = dump.ops()
    assert [op.name for op in ops] == ["aten.mul_0", "aten.add_0"]
    assert not ops[0].inherited_nonfinite and ops[1].inherited_nonfinite
    assert math.isinf(float(y[0])) and float(w[1]) == 0.0 and math.isinf(float(z[0]))


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="dump mode"):
        ptt.dump(tmp_path / "x.h5", mode="everything")
    with pytest.raises(ConfigError, match="role"):
        ptt.dump(tmp_path / "x.h5", role="reference")
    with pytest.raises(ConfigError, match=r"ptt.dump's path is NoneType None: give the HDF5 file to write"):
        ptt.dump(None)  # (a bare TypeError; bytes were an AttributeError at the first step)
    assert ptt.dump(bytes(tmp_path / "x.h5")).path == str(tmp_path / "x.h5")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_tensors_are_stored_bit_for_bit(tmp_path, dtype):
    """float16 and bfloat16 tensors go to the writer as they lie (bfloat16 as its bits): read back, the
    values are the tensor's, NaN, inf, signed zeros and subnormals included, and so are their statistics."""
    x = torch.tensor([1.5, -0.0, 0.0, float("nan"), float("inf"), -3e-41 if dtype == "bfloat16" else -3e-6,
                      *np.linspace(-4, 4, 60)]).to(getattr(torch, dtype))
    y = torch.linspace(-1, 1, 66).to(getattr(torch, dtype)).reshape(6, 11).t()  # a transposed input
    with ptt.dump(tmp_path / "h.h5"):
        out = x * 3
        z = y.reshape(-1) + 1
    with open_dump(tmp_path / "h.h5") as dump:
        ops = dump.ops(0)
        assert [op.type for op in ops] == ["aten.mul", "aten.clone", "aten._unsafe_view", "aten.add"]  # (the
        mul, add = ops[0], ops[3]  # reshape of a transpose copies)
        stored = [dump.tensor(0, mul.exec_index, "input_0"), dump.tensor(0, mul.exec_index, "output_0"),
                  dump.tensor(0, add.exec_index, "output_0"), dump.tensor(0, ops[1].exec_index, "input_0")]
        assert mul.outputs[0].dtype == dtype
        stats = mul.outputs[0].stats
    for values, tensor in zip(stored, (x, out, z, y)):
        assert values.dtype == np.float32 and values.shape == tuple(tensor.shape)
        np.testing.assert_array_equal(values.view(np.uint32), tensor.float().numpy().view(np.uint32))
    assert (stats.count, stats.nan, stats.inf) == (66, 1, 1)
    assert stats.max == float(out[~out.isinf() & ~out.isnan()].float().max())


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_a_write_through_data_gives_later_readers_new_statistics(tmp_path, mode):
    """``p.data.mul_(3)`` writes p's memory through an alias with a version counter of its own: p shows no
    new version, yet the ops reading p afterwards record the statistics of what they read."""
    x = torch.linspace(-1, 1, 100)
    w = torch.linspace(0, 2, 100).requires_grad_()
    with ptt.dump(tmp_path / "d.h5", mode=mode):
        x * 2
        x.data.mul_(3)
        x + 1
        loss = (w * w).sum()
        w.data.clamp_(max=0.5)  # a tensor saved for backward, changed under it
        loss.backward()
    with open_dump(tmp_path / "d.h5") as dump:
        ops = {op.name: op for op in dump.ops(0)}
        if mode == "dump":
            for op in ops.values():
                for t in op.tensors:
                    if t.has_data:
                        assert t.stats.max == float(dump.tensor(0, op.exec_index, t.slot).max())
    assert ops["aten.mul_0"].inputs[0].stats.max == 1.0
    assert ops["aten.add_0"].inputs[0].stats.max == 3.0
    backward = [op for op in ops.values() if op.direction == "backward" and op.type == "aten.mul"]
    assert backward and all(t.stats.max == 0.5 for op in backward for t in op.inputs[1:])


def test_an_ops_bool_arguments_are_recorded_with_its_call_for_the_analysis(tmp_path):
    bn = torch.nn.BatchNorm1d(4)
    with ptt.dump(tmp_path / "bn.h5", mode="stats"):
        bn(torch.arange(12.0).reshape(3, 4))
        torch.ones(3).softmax(0)
    with open_dump(tmp_path / "bn.h5") as dump:
        ops = {op.type: op for op in dump.ops(0)}
    assert ops["aten.native_batch_norm"].attrs["flags"] == [[5, "training"]]
    assert ops["aten.native_batch_norm"].attrs["args"][5] is True
    assert ops["aten._softmax"].attrs["flags"] == [[2, "half_to_float"]]


def test_inputs_an_op_writes_without_declaring_it_are_recorded_as_it_read_them(tmp_path):
    """native_batch_norm updates its running statistics though its schema does not say so: the recorded
    input_3/input_4 hold the values before the update, and their statistics agree with that data."""
    bn = torch.nn.BatchNorm1d(4)
    x = torch.arange(12.0).reshape(3, 4)
    with ptt.dump(tmp_path / "bn.h5"):
        bn(x)
    with open_dump(tmp_path / "bn.h5") as dump:
        op = next(op for op in dump.ops(0) if op.type == "aten.native_batch_norm")
        mean, var = (dump.tensor(0, op.exec_index, slot) for slot in ("input_3", "input_4"))
        stats = op.tensor("input_3").stats, op.tensor("input_4").stats
    assert mean.tolist() == [0.0] * 4 and var.tolist() == [1.0] * 4  # what the kernel read
    assert (stats[0].norm, stats[1].norm) == (0.0, 2.0)
    assert bn.running_mean.tolist() == pytest.approx([0.4, 0.5, 0.6, 0.7])  # and it did update them


def test_a_loss_scalers_update_ends_an_iteration_whose_optimizer_step_it_skipped(tmp_path):
    """A first scale so high that every gradient overflows: GradScaler skips optimizer.step() each iteration, so
    without ``ptt.step`` no step ever ended and the three iterations were recorded as one step 0. The scaler's
    update ends the iteration: one step each, the halved scale's update last in it, no optimizer ops."""
    model, optimizer, x, y = make_mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    with ptt.dump(tmp_path / "t.h5", mode="stats"):
        for _ in range(3):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    assert scaler.get_scale() == 2.0 ** 37  # every update skipped
    with open_dump(tmp_path / "t.h5") as dump:
        assert [s.step for s in dump.steps()] == [0, 1, 2]
        for step in (0, 1, 2):
            types = [r.type for r in dump.ops(step=step)]
            assert types.count("aten._amp_update_scale_") == 1 and types[-1] == "aten._amp_update_scale_"
            assert not dump.ops(step=step, direction="optimizer")


@pytest.mark.parametrize("level", ["op", "module"])
def test_a_step_ended_before_the_scalers_update_is_marked_skipped_where_the_scaler_found_inf(tmp_path, level):
    """``ptt.step(loss, scaler.get_scale())`` between ``scaler.step`` and ``scaler.update`` (to record the scale
    the step used): the update runs after the step's end, and the step whose optimizer step the scaler skipped
    was not marked skipped; a diagnosis of that step alone (zoom's region) then blamed the backward op that
    overflowed in a clean run. The flag the scaler's unscaling sets says it, whichever comes first."""
    model, optimizer, x, y = make_mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    with ptt.dump(tmp_path / "t.h5", mode="stats", level=level):
        for _ in range(2):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            ptt.step(loss, scaler.get_scale())
            scaler.update()
        scaler = torch.amp.GradScaler("cpu", init_scale=1.0)  # finite gradients: the optimizer steps
        optimizer.zero_grad()
        scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
        scaler.step(optimizer)
        ptt.step(None, 1.0)
        scaler.update()
    with open_dump(tmp_path / "t.h5") as dump:
        assert [(s.step, s.loss_scale, s.skipped) for s in dump.steps()][:3] == [
            (0, 2.0 ** 40, True), (1, 2.0 ** 39, True), (2, 1.0, False)]


def test_an_undeclared_write_makes_earlier_statistics_of_that_tensor_stale(tmp_path):
    """An op that read the running mean before native_batch_norm updated it (a model.to() inside the dump, an
    EMA) left its statistics in the capture's cache under a version the update does not change: the backward's
    input_3, the updated running mean, was recorded with the old statistics (norm 0) beside its new data, and
    every reader of the dump refused it as damaged."""
    bn = torch.nn.BatchNorm1d(4)
    x = torch.arange(12.0).reshape(3, 4).requires_grad_()
    with ptt.dump(tmp_path / "bn.h5"):
        bn.running_mean.mul(1.0)  # reads the running mean: its statistics (all zero) are cached
        bn(x).pow(2).sum().backward()
    with open_dump(tmp_path / "bn.h5") as dump:
        op = next(op for op in dump.ops(0) if op.type == "aten.native_batch_norm_backward")
        mean = dump.tensor(0, op.exec_index, "input_3")
        stats = op.tensor("input_3").stats
    assert mean.tolist() == pytest.approx([0.4, 0.5, 0.6, 0.7])
    assert stats.max == float(mean.max()) and stats.norm == pytest.approx(float(np.linalg.norm(mean)), rel=1e-6)


def test_an_autocast_run_records_the_dtypes_autocast_chose(tmp_path):
    with torch.autocast("cpu", dtype=torch.bfloat16), ptt.dump(tmp_path / "a.h5", mode="stats"):
        train(make_mlp())
    with open_dump(tmp_path / "a.h5") as dump:
        assert dump.role == "target" and dump.metadata["precision_mode"] == "autocast_bfloat16"
        fc1 = dump.op(0, "MLP/fc1/aten.addmm_0")
        softmax = dump.op(0, "aten._log_softmax_0")
    assert fc1.compute_dtype == "bfloat16" and fc1.outputs[0].dtype == "bfloat16"
    assert softmax.outputs[0].dtype == "float32"  # on autocast's fp32 list


def test_capture_hides_the_objects_alive_before_it_from_the_collector_and_restores_them(tmp_path):
    import gc

    run = make_mlp()
    assert gc.get_freeze_count() == 0
    with ptt.dump(tmp_path / "a.h5", mode="stats"):
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # torch, the model, the test's own objects
        train(run, steps=2)
    assert gc.get_freeze_count() == 0


def test_capture_leaves_a_process_that_froze_objects_itself_as_it_was(tmp_path):
    import gc

    run = make_mlp()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with ptt.dump(tmp_path / "a.h5", mode="stats"):
            train(run, steps=1)
        assert gc.get_freeze_count() > frozen // 2  # not unfrozen (objects freed meanwhile leave the count)
    finally:
        gc.unfreeze()



def _stored_at(dump, name: str, slot: str) -> tuple:
    """Where a tensor's values lie in a dump: (pack, offset), or the address of its dataset."""
    import h5py

    op = dump.op(0, name)
    location = dump.step_index(0).tensor_location(op.exec_index, slot)
    if location.pack != -1:
        return "packed", location.pack, location.offset
    with h5py.File(dump.path, "r") as f:
        group = dump.step_index(0).group_name(location)
        return "dataset", h5py.h5o.get_info(f[f"steps/000000/ops/{group}/{slot}"].id).addr


def test_values_read_again_are_stored_once_and_every_reader_reads_what_it_read(tmp_path):
    """A weight read at every time step of a recurrence is stored once a step; what changed in between (a new
    version, a write through ``.data``), or is the same memory seen in another order (the transpose of a
    square matrix), is stored again: every slot reads back the values its op read."""
    big = torch.linspace(-1, 1, 300 * 300).reshape(300, 300)  # 360 KB: a dataset of its own
    small = torch.linspace(0, 1, 64).reshape(8, 8)  # 256 bytes: packed
    ones = torch.ones(300)
    expected = {}  # (op name, slot) -> values (copied by numpy: not an op)
    with ptt.dump(tmp_path / "d.h5"):
        for i in range(3):
            big.mv(ones)
            small.sum()
            expected[f"aten.mv_{i}", "input_0"] = big.numpy().copy()
            expected[f"aten.sum_{i}", "input_0"] = small.numpy().copy()
        small.t().sum()
        expected["aten.sum_3", "input_0"] = small.numpy().T.copy()
        small.mul_(2)  # a new version
        small.sum()
        expected["aten.sum_4", "input_0"] = small.numpy().copy()
        big.data.add_(1)  # no new version of ``big``
        big.mv(ones)
        expected["aten.mv_3", "input_0"] = big.numpy().copy()
    with open_dump(tmp_path / "d.h5") as dump:
        for (name, slot), values in expected.items():
            np.testing.assert_array_equal(dump.tensor(0, dump.op(0, name).exec_index, slot), values)
        where = {key: _stored_at(dump, *key) for key in expected}
        where["aten.mul__0", "input_0"] = _stored_at(dump, "aten.mul__0", "input_0")
        where["aten.mul__0", "output_0"] = _stored_at(dump, "aten.mul__0", "output_0")
        where["aten.add__0", "output_0"] = _stored_at(dump, "aten.add__0", "output_0")
    assert where["aten.mv_0", "input_0"][0] == "dataset" and where["aten.sum_0", "input_0"][0] == "packed"
    for name in ("mv", "sum"):
        assert where[f"aten.{name}_0", "input_0"] == where[f"aten.{name}_1", "input_0"] \
            == where[f"aten.{name}_2", "input_0"]
    assert where["aten.mul__0", "input_0"] == where["aten.sum_0", "input_0"]  # the values before the write
    assert where["aten.sum_4", "input_0"] == where["aten.mul__0", "output_0"]  # its result, a new version
    distinct = [where[key] for key in (("aten.sum_0", "input_0"), ("aten.sum_3", "input_0"), ("aten.sum_4", "input_0"),
                                       ("aten.mv_0", "input_0"), ("aten.add__0", "output_0"))]
    assert len(set(distinct)) == len(distinct)


def test_a_module_record_refers_to_the_values_its_ops_stored(tmp_path):
    run = make_mlp()
    with ptt.dump(tmp_path / "g.h5"):
        train(run)
    with open_dump(tmp_path / "g.h5") as dump:
        module = dump.op(0, "MLP/fc1")
        assert module.type == "module.Linear"
        np.testing.assert_array_equal(dump.tensor(0, module.exec_index, "output_0"),
                                      dump.tensor(0, dump.op(0, "MLP/fc1/aten.addmm_0").exec_index, "output_0"))
        assert _stored_at(dump, "MLP/fc1", "output_0") == _stored_at(dump, "MLP/fc1/aten.addmm_0", "output_0")
        assert _stored_at(dump, "MLP/fc1", "input_0") == _stored_at(dump, "MLP/fc1/aten.addmm_0", "input_1")


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_complex_and_quantized_tensors_keep_statistics_only_and_the_dump_reads(tmp_path, run_cli):
    """A spectrogram front end (stft: complex values) and a quantized tensor in dump mode: no number format of a
    dump holds them, so their rows keep no values (they used to be written as complex64 data the reader
    refused: "a tensor with data of dtype 'complex64', not a number format")."""
    torch.manual_seed(0)
    fc = torch.nn.Linear(9, 2)
    with ptt.dump(tmp_path / "spec.h5", mode="dump"):
        wave = torch.randn(2, 64)
        spec = torch.stft(wave, n_fft=16, hop_length=4, window=torch.hann_window(16), return_complex=True)
        fc(spec.abs().pow(2).transpose(1, 2)).mean().backward()
        torch.quantize_per_tensor(wave, 0.1, 0, torch.qint8).dequantize()
    with open_dump(tmp_path / "spec.h5") as dump:
        tensors = [(op.type, t) for op in dump.ops(0) for t in op.tensors]
    odd = [(kind, t.dtype, t.has_data) for kind, t in tensors if t.dtype.startswith(("complex", "qint"))]
    assert ("aten._fft_r2c", "complex64", False) in odd and ("aten.quantize_per_tensor", "qint8", False) in odd
    assert all(not has_data for *_, has_data in odd)
    assert any(t.has_data for _, t in tensors)  # (the float tensors keep theirs)
    assert run_cli("inspect", tmp_path / "spec.h5").status == 0


def test_a_dump_entered_again_is_refused_at_the_with(tmp_path):
    """The second ``with d:`` of one dump object failed at its first op, deep in the writer ("step 0 was already
    written"); it is refused where it is written, the first run's dump kept."""
    from precision_tool.errors import ConfigError

    recorder = ptt.dump(tmp_path / "epochs.h5", mode="stats")
    with recorder:
        train(make_mlp(), steps=1)
    kept = (tmp_path / "epochs.h5").read_bytes()
    with pytest.raises(ConfigError, match=r"this ptt.dump\('.*epochs.h5'\) recorded a run already: make a new "
                                          r"ptt.dump for each run"):
        with recorder:
            pass
    assert (tmp_path / "epochs.h5").read_bytes() == kept


def test_ops_on_the_meta_device_are_neither_recorded_nor_simulated(tmp_path):
    """A deferred init (FSDP's, accelerate's init_empty_weights) inside a dump: shapes without values, which the
    statistics used to try to read ("Cannot copy out of meta tensor"), under simulate_npu too."""
    with ptt.simulate_npu("force_fp16", "saturation"), ptt.dump(tmp_path / "m.h5", mode="stats"):
        with torch.device("meta"):
            model = torch.nn.Linear(8, 4)
        model = model.to_empty(device="cpu")
        model.reset_parameters()
        model(torch.randn(2, 8)).sum().backward()
    with open_dump(tmp_path / "m.h5") as dump:
        ops = [op.type for op in dump.ops(0)]
    assert "aten.addmm" in ops and "aten.empty" not in ops  # (no op of the init on the meta device)


@pytest.mark.parametrize("mode, level", [("dump", "op"), ("stats", "op"), ("stats", "module"), ("overflow", "op")])
def test_torch_func_transforms_run_inside_a_dump(tmp_path, mode, level):
    """Per-sample gradients (vmap of grad, as DP-SGD computes them) and a jvp: a module called on a transform's
    wrapped tensors failed reading their memory ("Cannot access data pointer of Tensor that doesn't have
    storage"), a jvp's zero tangent converting to numpy. Wrapped tensors make no module record; a zero tangent
    has the statistics of its zeros."""
    from torch.func import functional_call, grad, jvp, vmap

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    with ptt.dump(tmp_path / "f.h5", mode=mode, level=level):
        per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
        jvp(lambda t: (t.sin() * 2).sum(), (torch.randn(4),), (torch.ones(4),))
    assert per_sample["0.weight"].shape == (5, 16, 8)
    with open_dump(tmp_path / "f.h5") as dump:
        assert dump.complete and dump.steps_complete == 1
        ops = dump.ops(0)
    assert not any(op.type.startswith("module.") for op in ops)  # (every call's tensors were wrapped)
    if mode != "overflow" and level == "op":
        assert any(op.type in ("aten.addmm", "aten.mm") for op in ops)
