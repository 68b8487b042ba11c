"""Module boundaries in torch dumps, custom autograd nodes named in their module, the autocast checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.torch.torch_helpers import make_mlp, train

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")
ptt = pytest.importorskip("precision_tool.torch")

from precision_tool.dump.reader import open_dump  # noqa: E402


def test_each_module_call_is_recorded_after_its_ops_with_its_inputs_and_outputs(tmp_path):
    run = make_mlp()
    with ptt.dump(tmp_path / "d.h5"):
        train(run)
    with open_dump(tmp_path / "d.h5") as dump:
        records = dump.ops(step=0, direction="forward")
        modules = [r for r in records if r.is_module]
        assert [(r.name, r.type) for r in modules] == [
            ("MLP/fc1", "module.Linear"), ("MLP/act", "module.ReLU"), ("MLP/fc2", "module.Linear"),
            ("MLP", "module.MLP")]
        fc1 = modules[0]
        addmm = next(r for r in records if r.name == "MLP/fc1/aten.addmm_0")
        assert addmm.exec_index < fc1.exec_index
        assert [t.shape for t in fc1.tensors] == [(5, 8), (5, 16)]
        model, _, x, _ = make_mlp()
        np.testing.assert_array_equal(dump.tensor(0, fc1.exec_index, "input_0"), x.numpy())
        np.testing.assert_array_equal(dump.tensor(0, fc1.exec_index, "output_0"),
                                      dump.tensor(0, addmm.exec_index, "output_0"))


def test_float_leaves_are_the_distinct_float_tensors_in_order():
    from precision_tool.torch.modules import float_leaves

    a, b, ids = torch.ones(2), torch.zeros(3, dtype=torch.float16), torch.arange(3)
    assert float_leaves(a)[0] is a and len(float_leaves(a)) == 1
    assert float_leaves(ids) == []
    found = float_leaves(((a, ids, [b, a]), {"mask": ids, "extra": {"x": b}}))
    assert [id(t) for t in found] == [id(a), id(b)]


def test_module_records_can_be_switched_off_and_overflow_mode_has_none(tmp_path):
    for path, kwargs in (("off.h5", {"modules": False}), ("ovf.h5", {"mode": "overflow"})):
        with ptt.dump(tmp_path / path, **kwargs):
            train(make_mlp())
        with open_dump(tmp_path / path) as dump:
            assert not any(r.is_module for r in dump.ops())


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_a_custom_autograd_function_names_its_backward_ops_in_its_module(tmp_path):
    run = make_mlp()
    model = run[0]
    relu = model.act.forward
    model.act.forward = lambda x: _Twice.apply(relu(x))
    with ptt.dump(tmp_path / "d.h5"):
        train(run)
    with open_dump(tmp_path / "d.h5") as dump:
        muls = [r.name for r in dump.ops(step=0, direction="backward") if r.type == "aten.mul"]
    assert len(muls) == 1 and muls[0].startswith("MLP/act/")


def test_an_optimizer_step_under_autocast_warns_once(tmp_path):
    model, optimizer, x, y = make_mlp()
    with warnings.catch_warnings(record=True) as caught, ptt.dump(tmp_path / "d.h5"):
        warnings.simplefilter("always")
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    assert [w.category.__name__ for w in caught] == ["AutocastOptimizerWarning"]


def test_a_dump_entered_outside_autocast_still_says_the_forward_ran_under_it(tmp_path):
    model, optimizer, x, y = make_mlp()
    with warnings.catch_warnings(record=True) as caught, ptt.dump(tmp_path / "d.h5"):
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert caught == []
    with open_dump(tmp_path / "d.h5") as dump:
        assert (dump.metadata["role"], dump.metadata["precision_mode"], dump.metadata["autocast"]) == \
            ("target", "autocast_bfloat16", "bfloat16")


def test_backward_module_records_hold_the_gradients_at_the_module_boundary(tmp_path):
    with ptt.dump(tmp_path / "d.h5"):
        train(make_mlp())
    model, _, x, y = make_mlp()
    hidden = model.fc1(x)
    activated = model.act(hidden)
    logits = model.fc2(activated)
    for tensor in (hidden, activated, logits):
        tensor.retain_grad()
    torch.nn.functional.cross_entropy(logits, y).backward()
    with open_dump(tmp_path / "d.h5") as dump:
        records = {r.name: r for r in dump.ops(step=0, direction="backward") if r.is_module}
        assert sorted(records) == ["MLP/act", "MLP/fc2"]  # the inputs of MLP and fc1 (x) take no gradient
        fc2, act = records["MLP/fc2"], records["MLP/act"]
        assert [t.slot for t in fc2.tensors] == ["input_0", "output_0"]
        np.testing.assert_allclose(dump.tensor(0, fc2.exec_index, "input_0"), logits.grad.numpy(), rtol=1e-6)
        np.testing.assert_allclose(dump.tensor(0, fc2.exec_index, "output_0"), activated.grad.numpy(), rtol=1e-6)
        np.testing.assert_allclose(dump.tensor(0, act.exec_index, "output_0"), hidden.grad.numpy(), rtol=1e-6)


def test_stats_mode_summarises_boundary_gradients_as_they_arrive_with_the_statistics_of_a_copy(tmp_path):
    """Statistics only: a module's boundary gradients are summarised when their hook fires, instead of copied
    and held until the record is complete; the records are those a copy gives (dump mode keeps copies),
    and a gradient written in place after it arrived does not change them."""
    from precision_tool.torch import modules

    seen = []
    summary = modules.GradientSummary

    def spy(grad):
        seen.append(grad)
        return summary(grad)

    modules.GradientSummary = spy
    try:
        for mode in ("stats", "dump"):
            with ptt.dump(tmp_path / f"{mode}.h5", mode=mode, level="module"):
                train(make_mlp(), steps=2)
    finally:
        modules.GradientSummary = summary
    # stats mode only, once per gradient: a step's boundaries are the outputs of MLP, fc2, act and fc1 and the
    # inputs of fc2 and act, three gradients (MLP's output is fc2's, fc2's input act's output, act's input fc1's)
    assert [tuple(grad.shape) for grad in seen] == [(5, 4), (5, 16), (5, 16)] * 2
    with open_dump(tmp_path / "stats.h5") as stats, open_dump(tmp_path / "dump.h5") as dump:
        rows = [row for row in _module_rows(stats) if row[3] == "backward"]
        assert len(rows) == 2 * 2
        assert rows == [row for row in _module_rows(dump) if row[3] == "backward"]


def _module_rows(dump) -> list[tuple]:
    return [(r.step, r.name, r.type, r.direction, tuple(t.slot for t in r.tensors),
             tuple(t.stats for t in r.tensors)) for r in dump.ops() if r.is_module]


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_module_level_records_the_module_calls_of_op_level_and_nothing_else(tmp_path, mode):
    for level in ("op", "module"):
        with ptt.dump(tmp_path / f"{level}.h5", mode=mode, level=level):
            losses = train(make_mlp(), steps=3)
    with open_dump(tmp_path / "op.h5") as op_level, open_dump(tmp_path / "module.h5") as module_level:
        assert all(r.is_module for r in module_level.ops())
        assert len(module_level.ops()) == 3 * 6  # 4 calls forward; backward those whose input takes a gradient
        assert _module_rows(module_level) == _module_rows(op_level)  # the same records, the same statistics
        assert [s.step for s in module_level.steps()] == [0, 1, 2]
        assert module_level.metadata["capture_level"] == "module"
        if mode == "dump":
            fc2 = module_level.op(2, "MLP/fc2")
            np.testing.assert_array_equal(module_level.tensor(2, fc2.exec_index, "output_0"),
                                          op_level.tensor(2, op_level.op(2, "MLP/fc2").exec_index, "output_0"))
    assert len(losses) == 3


def test_module_level_intercepts_no_op_and_refuses_what_it_cannot_record(tmp_path):
    with ptt.dump(tmp_path / "m.h5", mode="stats", level="module"):
        assert torch._C._len_torch_dispatch_stack() == 0  # no dispatch mode: aten ops run untouched
        with ptt.simulate_npu("allow_mix_precision"):
            assert torch._C._len_torch_dispatch_stack() == 1  # a simulator needs the ops
    for kwargs in ({"mode": "overflow"}, {"modules": False}):
        with pytest.raises(ValueError, match="level='module'"):
            ptt.dump(tmp_path / "x.h5", level="module", **kwargs)
    with pytest.raises(ValueError, match="capture level"):
        ptt.dump(tmp_path / "x.h5", level="aten")


def test_module_level_statistics_are_those_of_the_values_stored_after_a_write_through_data(tmp_path):
    from precision_tool.compare.comparator import compare_dumps

    run = make_mlp()
    original = run[0].fc2.forward

    def forward(x):  # computes, then scales its input in place where no op sees it (as tests/realmodels' data_write)
        out = original(x)
        x.data.mul_(2.0)
        return out

    run[0].fc2.forward = forward
    with ptt.dump(tmp_path / "m.h5", mode="dump", level="module"):
        train(run)
    with open_dump(tmp_path / "m.h5") as dump:
        act, fc2 = dump.op(0, "MLP/act"), dump.op(0, "MLP/fc2")
        written = dump.tensor(0, fc2.exec_index, "input_0")
        np.testing.assert_array_equal(written, 2 * dump.tensor(0, act.exec_index, "output_0"))
        row = next(t for t in fc2.tensors if t.slot == "input_0").stats
        assert row.norm == pytest.approx(float(np.linalg.norm(written.astype(np.float64))), rel=1e-6)
        assert row.max == written.max()
        assert compare_dumps(dump, dump).rows  # the dump's own reader takes it (it refused it as damaged)



class _Boundaries(torch.nn.Module):
    """One tensor bounding several module calls: ``a``'s output is ``relu``'s input, written in place by it
    (its output, the same object, new values), and then ``b``'s input, which a hook of the user's doubles."""

    def __init__(self, user_hook: bool):
        super().__init__()
        torch.manual_seed(1)
        self.pre, self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)
        self.relu = torch.nn.ReLU(inplace=True)
        self.user_hook = user_hook

    def forward(self, x):
        h = self.relu(self.a(self.pre(x)))
        if self.user_hook:
            h.register_hook(lambda grad: grad * 2)
        return self.b(h).square().sum()


@pytest.mark.parametrize("user_hook", [False, True])
def test_a_tensor_bounding_several_calls_gives_each_the_gradient_a_hook_of_its_own_would(tmp_path, user_hook):
    """The capture hooks a tensor once for all the module calls it bounds while the tensor is unchanged and
    no one else hooked it since; the records are those of one hook per call, as torch runs them: a hook
    after an in-place write sees the gradient of the new values, and one after the user's its result."""
    from precision_tool.torch import modules

    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))

    def run(path):
        model = _Boundaries(user_hook)
        with ptt.dump(path, mode="dump", level="module"):
            model(x).backward()
            ptt.step()
        with open_dump(path) as dump:
            return {r.name: {t.slot: dump.tensor(0, r.exec_index, t.slot) for t in r.tensors}
                    for r in dump.ops(step=0, direction="backward") if r.is_module}

    shared = run(tmp_path / "shared.h5")
    own = modules.ModuleGradients._hook
    modules.ModuleGradients._hook = lambda self, tensor, target: tensor.register_hook(self._arrived([target]))
    try:
        alone = run(tmp_path / "alone.h5")
    finally:
        modules.ModuleGradients._hook = own
    assert shared.keys() == alone.keys() == {"_Boundaries/a", "_Boundaries/relu", "_Boundaries/b"}
    for name, slots in alone.items():
        assert shared[name].keys() == slots.keys() == {"input_0", "output_0"}
        for slot, values in slots.items():
            np.testing.assert_array_equal(shared[name][slot], values, err_msg=f"{name} {slot}")
    b, relu, a = shared["_Boundaries/b"], shared["_Boundaries/relu"], shared["_Boundaries/a"]
    # h's hooks run in the order they were added: relu's, the user's (which doubles the gradient), then b's
    np.testing.assert_array_equal(b["output_0"], relu["input_0"] * (2 if user_hook else 1))
    # relu's input was hooked after its in-place write: it sees the gradient at its output, not what flows on
    np.testing.assert_array_equal(relu["output_0"], relu["input_0"])
    # a's output was hooked before it: what flows back through the ReLU, after every hook on the new values
    model = _Boundaries(user_hook)
    positive = (model.a(model.pre(x)) > 0).numpy()
    np.testing.assert_array_equal(a["input_0"], np.where(positive, b["output_0"], 0))
