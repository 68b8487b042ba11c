"""The per-op format decision of every precision mode, on one small graph."""

import dataclasses
import json

import numpy as np
import pytest

from precision_tool.engine import functional as F
from precision_tool.engine.device import FusionSwitch, golden, npu
from precision_tool.engine.graph import GraphBuilder, Parameter
from precision_tool.engine.program import compile_graph
from precision_tool.errors import ConfigError, InputError


@pytest.fixture(scope="module")
def graph():
    w = Parameter(np.ones((4, 4), np.float32), "fc/weight")
    b = Parameter(np.zeros(4, np.float32), "fc/bias")
    with GraphBuilder() as g:
        x = g.input("x")
        labels = g.input("labels", is_float=False)
        with g.scope("fc"):
            h = F.bias_add(F.matmul(x, w), b)  # white, gray
        e = F.exp(h)  # black
        r = F.relu(h)  # gray after a low-precision matmul chain
        s = F.reshape(r, (4, 4))  # movement
        loss = F.softmax_cross_entropy(F.add(s, e), labels)  # gray, black
        g.output("loss", loss)
    return g.graph


def formats(graph, device):
    """Formats per node name, with fusion off so every original op keeps its name."""
    device = dataclasses.replace(device, fusion=FusionSwitch(all_off=True))
    program = compile_graph(graph, device)
    return {c.node.name: (c.precision.compute.name, c.precision.output.name) for c in program.nodes}


H, B, F32 = ("float16",) * 2, ("bfloat16",) * 2, ("float32",) * 2

EXPECTED = {
    # mode: MatMul, BiasAdd, Exp, Relu, Reshape, Add, SoftmaxCrossEntropy
    ("force_fp16", None): [H, H, H, H, H, H, H],
    (None, "fp16"): [H, H, H, H, H, H, H],
    ("allow_fp32_to_fp16", None): [H, F32, F32, F32, F32, F32, F32],
    (None, None): [H, F32, F32, F32, F32, F32, F32],  # the default mode
    ("must_keep_origin_dtype", None): [F32] * 7,
    (None, "origin"): [F32] * 7,
    ("force_fp32", None): [("float16", "float32"), F32, F32, F32, F32, F32, F32],
    ("cube_fp16in_fp32out", None): [("float16", "float32"), F32, F32, F32, F32, F32, F32],
    (None, "cube_fp16in_fp32out"): [("float16", "float32"), F32, F32, F32, F32, F32, F32],
    ("allow_mix_precision", None): [H, H, F32, H, H, H, F32],
    ("allow_mix_precision_fp16", None): [H, H, F32, H, H, H, F32],
    (None, "mixed_float16"): [H, H, F32, H, H, H, F32],
    ("allow_mix_precision_bf16", None): [B, B, F32, B, B, B, F32],
    (None, "mixed_bfloat16"): [B, B, F32, B, B, B, F32],
    ("allow_fp32_to_bf16", None): [B, F32, F32, F32, F32, F32, F32],
}
ORDER = ["fc/MatMul", "fc/BiasAdd", "Exp", "Relu", "Reshape", "Add", "SoftmaxCrossEntropy"]


@pytest.mark.parametrize("mode", EXPECTED, ids=lambda m: m[0] or m[1] or "default")
def test_every_precision_mode(graph, mode):
    got = formats(graph, npu(precision_mode=mode[0], precision_mode_v2=mode[1]))
    assert [got[name] for name in ORDER] == EXPECTED[mode]


def test_golden_keeps_float32_and_float64_everywhere(graph):
    assert set(formats(graph, golden()).values()) == {F32}
    assert set(formats(graph, golden(float64=True)).values()) == {("float64", "float64")}


def test_modify_mixlist_moves_ops_between_lists(graph, tmp_path):
    path = tmp_path / "mixlist.json"
    path.write_text(json.dumps({"white-list": {"to-add": ["Exp"]}, "black-list": {"to-add": ["Relu"]}}))
    got = formats(graph, npu(precision_mode="allow_mix_precision", modify_mixlist=path))
    assert got["Exp"] == H
    assert got["Relu"] == F32
    assert got["Reshape"] == F32  # follows its now-float32 input


def test_mixlist_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"white-list": {"to-add": ["NoSuchOp"]}}))
    with pytest.raises(InputError, match="bad.json: unknown op type 'NoSuchOp'"):
        npu(precision_mode="allow_mix_precision", modify_mixlist=path)
    with pytest.raises(InputError, match="missing.json: no such file"):
        npu(modify_mixlist=tmp_path / "missing.json")
    path.write_text(json.dumps({"black-list": {"to-add": "MatMul"}}))  # (read letter by letter: "unknown op type 'M'")
    with pytest.raises(InputError, match="bad.json: black-list.to-add must be a list of op type names, got 'MatMul'"):
        npu(precision_mode="allow_mix_precision", modify_mixlist=path)


def test_unknown_modes_list_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown precision_mode 'fp8'; valid: force_fp16, allow_fp32_to_fp16"):
        npu(precision_mode="fp8")
    with pytest.raises(ConfigError, match="unknown precision_mode_v2 'mixed_hif8'; valid: fp16, origin"):
        npu(precision_mode_v2="mixed_hif8")
    with pytest.raises(ConfigError, match="not both"):
        npu(precision_mode="force_fp16", precision_mode_v2="fp16")
    with pytest.raises(ConfigError, match="unknown overflow mode 'wrap'; valid: saturation, inf_nan"):
        npu(overflow_mode="wrap")


def test_hooks_see_inputs_in_the_format_the_kernel_computes_in(graph):
    from precision_tool.engine.executor import Executor
    from precision_tool.engine.hooks import HookList

    events = []

    class Record:
        def after_op(self, event):
            events.append(event)

    device = dataclasses.replace(npu(precision_mode="allow_fp32_to_fp16"), fusion=FusionSwitch(all_off=True))
    executor = Executor(compile_graph(graph, device), HookList([Record()]))
    executor.begin_step(0)
    executor.forward({"x": np.full((4, 4), 1 / 3, np.float32), "labels": np.arange(4)},
                     {"fc/weight": np.ones((4, 4), np.float32), "fc/bias": np.zeros(4, np.float32)})
    matmul = next(e for e in events if e.name == "fc/MatMul")
    assert matmul.input_dtypes == ["float16", "float16"]
    assert matmul.inputs[0][0, 0] == np.float32(np.float16(1 / 3))  # cast before the kernel saw it
    loss = next(e for e in events if e.name == "SoftmaxCrossEntropy")
    assert loss.input_dtypes == ["float32", "int64"]
