"""`simulate_npu`: formats chosen by the precision mode, rounding, overflow modes and the float status."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from precision_tool.engine.formats import BFLOAT16, FLOAT16  # noqa: E402
from precision_tool.errors import ConfigError  # noqa: E402
from precision_tool.torch.tensors import logical_dtype  # noqa: E402
from .torch_helpers import make_mlp, train  # noqa: E402


def _product_of_70000():
    return torch.tensor([[350.0, 0.0]]), torch.tensor([[200.0], [1.0]])


def test_force_fp16_saturation_clips_70000_to_65504_and_raises_the_status():
    a, b = _product_of_70000()
    with ptt.simulate_npu("force_fp16", "saturation") as sim:
        y = a @ b
    assert y.dtype == torch.float32 and float(y) == 65504.0
    assert sim.status and sim.status.first.name == "aten.mm_0" and sim.status.first.type == "aten.mm"
    assert [ref.name for ref in sim.overflow_ops] == ["aten.mm_0"]


def test_inf_nan_mode_overflows_to_inf():
    a, b = _product_of_70000()
    with ptt.simulate_npu("force_fp16", "inf_nan") as sim:
        y = a @ b
        z = torch.sqrt(torch.tensor([-1.0]))
    assert float(y) == float("inf") and torch.isnan(z).all()
    assert sim.status.count == 2


def test_saturation_turns_nan_into_zero():
    with ptt.simulate_npu("force_fp16", "saturation") as sim:
        z = torch.sqrt(torch.tensor([-1.0, 4.0]))
    assert z.tolist() == [0.0, 2.0] and sim.status


def test_outputs_are_rounded_to_the_compute_format_and_tagged():
    x = torch.tensor([1.0 + 2.0**-11 + 2.0**-20, 3.0])
    with ptt.simulate_npu("force_fp16"):
        y = x * 1.0
    expected, _ = FLOAT16.round(x.numpy() * 1.0)
    np.testing.assert_array_equal(y.numpy(), expected)
    assert y.tolist()[0] == 1.0 + 2.0**-10 and logical_dtype(y) == "float16"
    with ptt.simulate_npu("allow_mix_precision_bf16"):
        w = torch.tensor([[1.0 + 2.0**-9]]) @ torch.tensor([[1.0]])
    assert float(w) == 1.0 and logical_dtype(w) == BFLOAT16.name


def test_mixed_precision_keeps_black_list_ops_in_float32():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with ptt.simulate_npu("allow_mix_precision") as sim:
        h = x @ w  # white: float16
        s = torch.softmax(h, dim=-1)  # black: float32
        r = torch.relu(h)  # gray, follows its float16 input
        e = torch.relu(x)  # gray with a float32 input: stays float32
    assert [logical_dtype(t) for t in (h, s, r, e)] == ["float16", "float32", "float16", "float32"]
    assert not sim.status


def test_allow_fp32_to_fp16_lowers_only_matrix_ops():
    x = torch.tensor([[1.0 + 2.0**-12]])
    with ptt.simulate_npu("allow_fp32_to_fp16"):
        m = x @ torch.ones(1, 1)
        v = x * 1.0
    assert float(m) == 1.0 and float(v) == 1.0 + 2.0**-12


def test_autograd_works_and_backward_ops_are_simulated():
    x = torch.tensor([[300.0, 1.0]], requires_grad=True)
    w = torch.tensor([[200.0], [1.0]], requires_grad=True)
    with ptt.simulate_npu("force_fp16", "saturation") as sim:
        (x @ w).sum().backward()
    assert x.grad.tolist() == [[200.0, 1.0]] and w.grad.tolist() == [[300.0], [1.0]]
    assert not sim.status
    a = torch.tensor([1.0], requires_grad=True)
    b = torch.tensor([300.0])
    with ptt.simulate_npu("force_fp16", "saturation") as sim:
        (a * b).backward(torch.tensor([300.0]))  # forward 300, gradient 90000
    assert a.grad.tolist() == [65504.0]
    assert [(r.name, r.direction) for r in sim.overflow_ops] == [("aten.mul_0/aten.mul_0", "backward")]


def test_ops_already_in_half_precision_run_natively_beside_autocast():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16), ptt.simulate_npu("force_fp16") as sim:
        y = x @ w
        big = torch.full((2,), 1e38, dtype=torch.bfloat16) * 100
    assert y.dtype == torch.bfloat16  # autocast decided; the simulator kept its dtype
    assert torch.equal(y, (x.bfloat16() @ w.bfloat16()))
    assert big.dtype == torch.bfloat16 and torch.isfinite(big).all() and sim.status  # saturated, flagged


def test_simulate_inside_and_outside_dump_records_the_same_numbers(tmp_path):
    for order in ("sim-outside", "sim-inside"):
        run = make_mlp(scale=1e5)
        sim = ptt.simulate_npu("force_fp16")
        dump = ptt.dump(tmp_path / f"{order}.h5", mode="stats")
        first, second = (sim, dump) if order == "sim-outside" else (dump, sim)
        with first, second:
            train(run)
    with open_dump(tmp_path / "sim-outside.h5") as a, open_dump(tmp_path / "sim-inside.h5") as b:
        assert a.metadata["device"] == b.metadata["device"] == "npu"
        ops_a, ops_b = a.ops(), b.ops()
    assert [(o.name, o.overflow, o.compute_dtype) for o in ops_a] == [(o.name, o.overflow, o.compute_dtype) for o in ops_b]
    assert [o.outputs[0].stats for o in ops_a] == [o.outputs[0].stats for o in ops_b]
    assert ops_a[0].overflow and ops_a[0].outputs[0].dtype == "float16"


def test_the_loss_of_a_simulated_run_differs_only_by_rounding():
    golden = train(make_mlp(), steps=3)
    with ptt.simulate_npu("force_fp16"):
        target = train(make_mlp(), steps=3)
    assert target != golden and np.allclose(target, golden, rtol=1e-2)


@pytest.mark.parametrize("as_dict", [False, True])
def test_modify_mixlist_moves_aten_ops_between_lists(tmp_path, as_dict):
    """A JSON file, or the same object as a dict (it failed: "expected str, bytes or os.PathLike object")."""
    mixlist = tmp_path / "mix.json"
    mixlist.write_text('{"black-list": {"to-add": ["aten.mm"]}}')
    given = {"black-list": {"to-add": ["aten.mm"]}} if as_dict else mixlist
    with ptt.simulate_npu("allow_mix_precision", modify_mixlist=given):
        y = torch.tensor([[1.0 + 2.0**-12]]) @ torch.ones(1, 1)
    assert float(y) == 1.0 + 2.0**-12 and logical_dtype(y) == "float32"
    from precision_tool.errors import InputError

    with pytest.raises(InputError, match="modify_mixlist: unknown key 'black'; valid: white-list, black-list"):
        ptt.simulate_npu("allow_mix_precision", modify_mixlist={"black": {"to-add": ["aten.mm"]}})


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="precision_mode"):
        ptt.simulate_npu("fp8_everywhere")
    with pytest.raises(ConfigError, match="overflow mode"):
        ptt.simulate_npu("force_fp16", "wrap")


def test_a_parameter_rounded_once_a_step_is_rounded_again_after_every_kind_of_write():
    """Ops reading a parameter in float16 share one rounded copy a step (an LSTM reads each weight once a time
    step); a write through ``.data`` (a version counter of its own) or in place under no_grad (a new version)
    gives the next op the new values rounded, never the stale copy."""
    x = torch.tensor([[1.0]])
    w = torch.nn.Parameter(torch.tensor([[1.0 + 2.0**-11 + 2.0**-20]]))
    with ptt.simulate_npu("force_fp16") as sim:
        first, again = x @ w.t(), x @ w.t()
        assert float(first) == float(again) == 1.0 + 2.0**-10
        assert len(sim._parameters._entries) == 1  # the transposed weight, rounded once
        version = w._version
        w.data.mul_(3)  # simulated too: 3 * (1 + 2**-10) in float16 is 3 + 2**-8
        assert w._version == version  # not seen by w's version counter: the write drops the storage's copies
        assert float(x @ w.t()) == 3.0 + 2.0**-8
        with torch.no_grad():
            w.add_(1.0)  # a new version
        assert float(x @ w.t()) == 4.0 + 2.0**-8
    assert w.tolist() == [[4.0 + 2.0**-8]]


def test_a_constant_asked_for_as_infinite_raises_no_float_status():
    """An attention mask made by ``scalar_tensor(-inf)`` computes nothing that overflows; a value that overflows
    the format still raises the status."""
    with ptt.simulate_npu("allow_mix_precision") as sim:
        mask = torch.scalar_tensor(float("-inf"))
        torch.full((2,), float("inf"))
    assert float(mask) == float("-inf") and sim.overflow_ops == []
    with ptt.simulate_npu("force_fp16") as sim:
        torch.ones(3) * 1e5
    assert [ref.name for ref in sim.overflow_ops] == ["aten.mul_0"]


@pytest.mark.parametrize("precision_mode, overflow_mode, explicit", [
    ("allow_mix_precision", "inf_nan", False), ("force_fp16", "inf_nan", False), ("force_fp16", "inf_nan", True),
    ("force_fp16", "saturation", False), ("allow_mix_precision", "saturation", True)])
def test_a_grad_scaler_keeps_its_scale_in_float32_and_halves_it_on_float16_overflow(tmp_path, precision_mode,
                                                                                     overflow_mode, explicit):
    """GradScaler's default scale, 2**16, is beyond float16: its unscale, check and update are float32
    bookkeeping, as an NPU's loss-scale manager keeps them. A weight gradient of 2 x the scale overflows the
    float16 matmul of backward: the update is skipped and the scale halved, until it fits (at 2**14). In the
    saturation mode the gradient holds 65504, no inf: the check reads the float status, as torch_npu's does.
    The dump marks the skipped steps, whether ``ptt.step`` or the scaler's update ends them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    before = model.weight.detach().numpy().copy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.ones(2, 4)
    scales = []
    with ptt.simulate_npu(precision_mode, overflow_mode), ptt.dump(tmp_path / "run.h5"):
        for _ in range(3):
            optimizer.zero_grad()
            scaler.scale(model(x).sum()).backward()
            unchanged = np.array_equal(model.weight.detach().numpy(), before)  # (numpy's: no op in the dump)
            scaler.step(optimizer)
            scaler.update()
            if explicit:
                ptt.step(None, scaler.get_scale())
            scales.append((scaler.get_scale(), unchanged and np.array_equal(model.weight.detach().numpy(), before)))
    assert scales == [(32768.0, True), (16384.0, True), (16384.0, False)]
    assert np.array_equal(model.weight.detach().numpy(), before - np.float32(0.5 * 2.0))  # d(sum)/dW = 2: x is ones
    with open_dump(tmp_path / "run.h5") as dump:
        updates = [r for r in dump.ops() if r.type == "aten._amp_update_scale_"]
        assert [(r.step, r.compute_dtype, r.tensors[0].dtype, r.overflow) for r in updates] == [
            (0, "float32", "float32", False), (1, "float32", "float32", False), (2, "float32", "float32", False)]
        assert [(s.step, s.skipped) for s in dump.steps()] == [(0, True), (1, True), (2, False)]


def test_in_the_saturation_mode_an_overflow_before_the_loss_is_scaled_does_not_skip_the_update():
    """torch_npu's scaler clears the float status when it scales the loss: an op that overflowed earlier in the
    step (here a forward op outside the loss) leaves the update alone; the status still says it overflowed."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = model.weight.detach().numpy().copy()
    with ptt.simulate_npu("force_fp16", "saturation") as sim:
        peak = torch.full((2,), 300.0) * torch.full((2,), 300.0)  # 90000: saturates at 65504
        loss = model(torch.ones(2, 4)).sum()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    assert peak.tolist() == [65504.0, 65504.0] and sim.status and sim.status.first.type == "aten.mul"
    assert scaler.get_scale() == 1024.0
    assert np.array_equal(model.weight.detach().numpy(), before - np.float32(0.5 * 2.0))


def test_in_the_saturation_mode_an_overflow_in_any_micro_batch_skips_the_accumulated_update():
    """Gradient accumulation: the scaler scales each micro-batch's loss, but torch_npu's clears the status once an
    iteration (its first ``scale`` since the update), so the first micro-batch's overflow still counts."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 14)
    before = model.weight.detach().numpy().copy()
    with ptt.simulate_npu("force_fp16", "saturation") as sim:
        optimizer.zero_grad()
        for x in (torch.full((2, 4), 4.0), torch.full((2, 4), 0.5)):  # d(sum)/dW = 8, then 1: 2**17 overflows
            scaler.scale(model(x).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    assert sim.status and scaler.get_scale() == 2.0 ** 13
    assert np.array_equal(model.weight.detach().numpy(), before)


def test_a_sparse_gradient_is_simulated_in_its_stored_values(tmp_path):
    """An nn.Embedding(sparse=True) gradient under force_fp16: its stored values rounded to float16 where they lie
    (it used to fail reading the data pointer of a tensor without storage)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    with ptt.simulate_npu("force_fp16", "saturation"), ptt.dump(tmp_path / "t.h5", mode="stats"):
        (emb(torch.tensor([1, 2, 2, 3])) / 3.0).sum().backward()
    values = emb.weight.grad.coalesce().values()
    assert values.dtype == torch.float32 and values.numel() == 12
    assert torch.equal(values, values.half().float())  # on float16's grid
    assert not torch.equal(values, torch.full_like(values, 1 / 3))  # (1/3 itself is not)


def test_a_closure_optimizers_closure_is_the_model_each_step_an_iteration(tmp_path):
    """LBFGS calls the forward and backward in step(closure): they were named and run as the optimizer's update
    (float32 under force_fp16: nothing simulated), and every iteration fell in step 0."""
    from precision_tool.dump.reader import open_dump

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with ptt.simulate_npu("force_fp16", "saturation"), ptt.dump(tmp_path / "t.h5", mode="stats"):
        for _ in range(3):
            optimizer.step(closure)
    with open_dump(tmp_path / "t.h5") as dump:
        assert dump.steps_complete == 3
        ops = dump.ops(1)
    forward = [op for op in ops if op.direction == "forward" and not op.type.startswith("module.")]
    assert forward[0].name == "Sequential/0/aten.addmm_0" and forward[0].compute_dtype == "float16"
    assert any(op.direction == "backward" and op.name.startswith("Sequential/2/aten.addmm_0/") for op in ops)
    assert any(op.direction == "optimizer" for op in ops)  # (LBFGS's own update)
