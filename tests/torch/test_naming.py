"""Op names: module path, op type and a per-scope call index, the same in every run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from .torch_helpers import make_mlp, train  # noqa: E402


def _names(path, step=None) -> list[tuple[str, str]]:
    with open_dump(path) as dump:
        return [(op.name, op.direction) for op in dump.ops(step=step)]


def _encoder_run(seed: int = 0):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), x


def _train_encoder(run, steps: int = 2) -> None:
    model, optimizer, x = run
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_two_golden_runs_give_identical_name_sequences(tmp_path):
    for name in ("a", "b"):
        with ptt.dump(tmp_path / f"{name}.h5", mode="stats"):
            _train_encoder(_encoder_run())
    first = _names(tmp_path / "a.h5")
    assert first == _names(tmp_path / "b.h5")
    step_1 = _names(tmp_path / "a.h5", step=1)
    assert len(step_1) == len(set(step_1))  # unique within a step
    assert ("TransformerEncoder/layers.0/self_attn/aten.mm_0", "forward") in first
    assert ("TransformerEncoder/layers.1/linear2/aten.addmm_0", "forward") in first


def test_golden_and_simulated_runs_name_the_same_ops(tmp_path):
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        _train_encoder(_encoder_run())
    with ptt.simulate_npu("allow_mix_precision_bf16"), ptt.dump(tmp_path / "t.h5", mode="stats"):
        _train_encoder(_encoder_run())
    assert set(_names(tmp_path / "g.h5")) == set(_names(tmp_path / "t.h5"))
    with open_dump(tmp_path / "t.h5") as dump:
        assert dump.role == "target" and dump.metadata["device"] == "npu"
        assert dump.metadata["precision_mode"] == "allow_mix_precision_bf16"


def test_every_step_restarts_the_call_indices(tmp_path):
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        _train_encoder(_encoder_run(), steps=3)
    assert _names(tmp_path / "g.h5", step=1) == _names(tmp_path / "g.h5", step=2)


def test_an_extra_call_elsewhere_shifts_no_other_name(tmp_path):
    run = make_mlp()
    with ptt.dump(tmp_path / "a.h5", mode="stats"):
        train(run)
    run = make_mlp()
    with ptt.dump(tmp_path / "b.h5", mode="stats"):
        torch.sigmoid(run[2])  # an extra op before the step, outside any module
        train(run)
    extra = set(_names(tmp_path / "b.h5")) - set(_names(tmp_path / "a.h5"))
    assert extra == {("aten.sigmoid_0", "forward")}


def test_backward_ops_are_named_after_their_forward_op_and_parameters(tmp_path):
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        train(make_mlp())
    names = dict(_names(tmp_path / "g.h5", step=0))
    assert names["MLP/fc1/aten.addmm_0/aten.mm_0"] == "backward"
    assert names["MLP/act/aten.relu_0/aten.threshold_backward_0"] == "backward"
    assert names["aten._log_softmax_0/aten._log_softmax_backward_data_0"] == "backward"


def test_gradient_accumulation_is_named_after_the_parameter(tmp_path):
    model, _, x, _ = make_mlp()
    with ptt.dump(tmp_path / "g.h5", mode="stats"):
        for _ in range(2):  # no zero_grad: the second backward adds into .grad
            model(x).sum().backward()
    names = [n for n, _ in _names(tmp_path / "g.h5")]
    assert "MLP/fc1/weight/aten.add__0" in names


def test_a_module_called_twice_counts_its_calls():
    from precision_tool.torch.naming import Namer

    namer = Namer()
    linear = torch.nn.Linear(2, 2)
    names = []

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = linear

        def forward(self, x):
            names.append(namer.module_path)
            return self.inner(self.inner(x))

    class Probe(torch.nn.Module):
        def forward(self, x):
            names.append(namer.module_path)
            return x

    model = Twice()
    model.probe = Probe()
    namer.install()
    try:
        model(torch.ones(1, 2))
        model.probe(torch.ones(1))
        assert namer.name("aten.mm", None, None) == ("forward", "aten.mm_0")
    finally:
        namer.uninstall()
    assert names == ["Twice", "Probe"]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


class _Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.b, self.out, self.reentrant = _Block(), torch.nn.Linear(4, 1), reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.out(checkpoint(self.b, x, use_reentrant=self.reentrant)).sum()


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_module_recomputed_in_backward_keeps_its_path_and_names_its_backward_ops(tmp_path,
                                                                                               reentrant):
    """Activation checkpointing runs the block's forward again during backward: its ops are forward ops of
    the block's own path, named as in its first call, and the backward ops are named after forward ops, never
    after an autograd node's class (``AddmmBackward0/aten.mm_0``): the names a run without checkpointing
    gives them (reentrant: the recomputation's nodes run the backward; the first call, under no_grad, made
    none, and the checkpoint's own node names nothing). Non-reentrant checkpointing stops the recomputation
    with an exception once it has what the node needs: the module scope ends there too."""
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    x = torch.randn(2, 4, requires_grad=True)
    with ptt.dump(tmp_path / "d.h5", mode="stats", modules=False):
        model(x).backward()
    names = _names(tmp_path / "d.h5")
    recomputed = [name for name, direction in names[names.index(("aten.ones_like_0", "forward")) + 1:]
                  if direction == "forward"]
    backward = [name for name, direction in names if direction == "backward"]
    assert all(name.startswith("_Checkpointed/") for name in backward), backward
    if reentrant:
        assert recomputed == ["_Checkpointed/b/fc/aten.addmm_0", "_Checkpointed/b/act/aten.gelu_0"]
        assert "_Checkpointed/b/fc/aten.addmm_0/aten.mm_0" in backward
        assert "_Checkpointed/b/act/aten.gelu_0/aten.gelu_backward_0" in backward
    else:  # the gelu's input is all the node needs: the recomputation stops after the Linear
        assert recomputed == ["_Checkpointed/b/fc/aten.addmm_0"]
        assert "_Checkpointed/b/act/aten.gelu_0/aten.gelu_backward_0" in backward
        assert "_Checkpointed/b/fc/aten.addmm_0/aten.mm_0" in backward


def test_a_module_whose_forward_raises_leaves_its_scope():
    from precision_tool.torch.naming import Namer

    class Fails(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    namer = Namer()
    namer.install()
    try:
        with pytest.raises(ValueError):
            Fails()(torch.ones(1))
        assert namer.module_path == ""
    finally:
        namer.uninstall()
