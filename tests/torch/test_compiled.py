"""Capturing a model that torch.compile compiled: every module call and op named as in the uncompiled run.

Before 2026-11-28: dynamo compiled the capture's own dispatch function as a frame of the user's program (one guard
per aten op, to its recompile limit of 8, warnings on every step); torch.compile's wrapper (``OptimizedModule``)
became the outermost module, so no op paired with golden's by name; a model compiled before the capture started ran
code that calls no module hook, so a module-level dump recorded its outermost call only, and a clean pair got a
kernel_bug there; aot_eager's graphs (``GraphModule``) were recorded as modules of their own; a model compiled with
``fullgraph=True`` stopped the training (torch raised that it compiled no frame, or met a graph break).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")
ptt = pytest.importorskip("precision_tool.torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from precision_tool.analysis import diagnose  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402

pytestmark = pytest.mark.torch


class Block(nn.Module):
    def __init__(self, width: int = 16, scale: float = 1.0):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.scale = scale  # a planted fault: the MLP's output scaled

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x)))) * self.scale


class TinyLM(nn.Module):
    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.emb, self.head = nn.Embedding(40, 16), nn.Linear(16, 40)
        self.blocks = nn.ModuleList([Block(), Block(scale=scale)])

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _train(path, level: str, mode: str, compiled: str | None = None, backend: str = "eager", warm: bool = True,
           scale: float = 1.0, fullgraph: bool = False):
    torch.manual_seed(0)
    model = TinyLM(scale)
    fresh = [p.detach().clone() for p in model.parameters()]
    if compiled == "root":
        model = torch.compile(model, backend=backend, fullgraph=fullgraph)
    elif compiled == "block":
        model.blocks[1] = torch.compile(model.blocks[1], backend=backend)
    ids = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1))
    if compiled and warm:  # compiled and run before the capture starts, then the weights put back
        model(ids).sum().backward()
        with torch.no_grad():
            for p, q in zip(model.parameters(), fresh):
                p.copy_(q)
                p.grad = None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with ptt.dump(path, mode, level=level):
        for _ in range(2):
            loss = F.cross_entropy(model(ids).reshape(-1, 40), ids.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


def _names(path):
    with open_dump(path) as dump:
        return [(r.name, r.direction) for r in dump.ops(step=0)]


def _verdict(golden, target):
    with open_dump(golden) as g, open_dump(target) as t:
        return diagnose(g, t).verdict


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("compiled, backend", [("root", "eager"), ("root", "aot_eager"), ("block", "eager")])
def test_a_model_compiled_before_the_capture_is_recorded_call_by_call(compiled, backend, tmp_path):
    _train(tmp_path / "golden.h5", "module", "stats")
    _train(tmp_path / "target.h5", "module", "stats", compiled, backend)
    names = _names(tmp_path / "golden.h5")
    assert len(names) == 20 and names[:3] == [("TinyLM/emb", "forward"), ("TinyLM/blocks.0/ln", "forward"),
                                             ("TinyLM/blocks.0/fc1", "forward")]
    assert _names(tmp_path / "target.h5") == names
    assert _verdict(tmp_path / "golden.h5", tmp_path / "target.h5").cls == "none"


def test_op_level_capture_names_a_compiled_model_s_ops_as_uncompiled_and_compiles_none_of_its_own(tmp_path):
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    from precision_tool.torch.session import Session

    from precision_tool.torch.naming import CompiledEagerWarning

    _train(tmp_path / "golden.h5", "op", "stats")
    with pytest.warns(CompiledEagerWarning, match="runs it eagerly"):
        _train(tmp_path / "target.h5", "op", "stats", "root", warm=False)
    assert _names(tmp_path / "target.h5") == _names(tmp_path / "golden.h5")
    assert _debug_get_cache_entry_list(Session.dispatch.__code__) == []
    assert _verdict(tmp_path / "golden.h5", tmp_path / "target.h5").cls == "none"


@pytest.mark.parametrize("level", ["op", "module"])
def test_a_model_compiled_with_fullgraph_runs_eagerly_while_captured(level, tmp_path):
    # under the capture's dispatch mode dynamo compiles no frame, and the module hooks would break the graph:
    # either way torch raised, stopping the training; the model's calls now run eagerly while captured
    from torch._dynamo import eval_frame

    _train(tmp_path / "golden.h5", level, "stats")
    _train(tmp_path / "target.h5", level, "stats", "root", fullgraph=True)
    assert eval_frame._stance.stance == "default"  # as before the capture
    assert _names(tmp_path / "target.h5") == _names(tmp_path / "golden.h5")
    assert _verdict(tmp_path / "golden.h5", tmp_path / "target.h5").cls == "none"


@pytest.mark.parametrize("level, mode, op", [
    ("op", "dump", "TinyLM/blocks.1/aten.mul_0"),
    ("module", "stats", "TinyLM/blocks.1"),
])
def test_a_fault_in_a_compiled_model_is_named(level, mode, op, tmp_path):
    _train(tmp_path / "golden.h5", level, mode)
    _train(tmp_path / "target.h5", level, mode, "root", scale=1.05)
    verdict = _verdict(tmp_path / "golden.h5", tmp_path / "target.h5")
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", op, 0, "forward")


def test_after_a_module_level_capture_a_compiled_model_is_compiled_again_without_the_hooks(tmp_path):
    # compiled during the capture, its graphs break where the hooks were; left so, it would run broken after it
    from torch._dynamo.utils import counters

    model = torch.compile(TinyLM(), backend="eager")
    ids = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1))
    with ptt.dump(tmp_path / "d.h5", "stats", level="module"):
        model(ids).sum().backward()
        ptt.step()
    assert counters["graph_break"]  # (the hooks)
    counters.clear()
    model(ids)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
