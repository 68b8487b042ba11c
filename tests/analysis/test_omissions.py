"""What the target leaves out or declares: a leaf's rounding to the target's dtype, a run that declares float32."""

from types import SimpleNamespace

import numpy as np

from precision_tool.analysis.errors import rounding_error
from precision_tool.analysis.omissions import declares_float32


def test_rounding_error_of_a_subnormal_float16_value():
    # 1e-6 is subnormal in float16 (spacing 2**-24): it rounds to 17 * 2**-24, 1.3 % off, which a layer scale
    # initialised at 1e-6 carries in any float16 run
    value = np.float32(1e-6)
    expected = abs(17 * 2.0 ** -24 - float(value)) / float(value)
    assert abs(rounding_error(np.array([value]), "float16") - expected) <= 1e-12
    assert rounding_error(np.array([value]), "float32") == 0.0
    assert rounding_error(None, "float16") == 0.0


def test_rounding_error_of_values_float16_holds_is_zero():
    assert rounding_error(np.array([0.5, -2.0, 1024.0], dtype=np.float32), "float16") == 0.0


def _dump(**metadata):
    return SimpleNamespace(metadata=metadata)


def test_a_run_declares_float32_by_its_precision_mode():
    assert declares_float32(_dump(precision_mode="golden_float32", autocast=""))
    # force_fp32's Cube ops read float16 by design: its matmuls are not narrower than declared
    assert not declares_float32(_dump(precision_mode="force_fp32"))
    assert not declares_float32(_dump(precision_mode="cube_fp16in_fp32out"))
    assert declares_float32(_dump(precision_mode="must_keep_origin_dtype", origin_dtype="float32"))
    assert not declares_float32(_dump(precision_mode="must_keep_origin_dtype", origin_dtype="float16"))
    assert not declares_float32(_dump(precision_mode="autocast_bfloat16", autocast="bfloat16"))
    assert not declares_float32(_dump(precision_mode="allow_mix_precision"))
    assert not declares_float32(_dump())


def _tensor(slot: str, values) -> "TensorRecord":
    from precision_tool.dump.records import TensorRecord, TensorStats

    x = np.asarray(values, dtype=np.float64)
    return TensorRecord(slot, "float32", x.shape, TensorStats(x.size, float(x.min()), float(x.max()), float(x.mean()),
                                                              float(x.std()), float(np.linalg.norm(x))))


def test_a_value_a_module_call_returned_is_no_leaf_in_a_region_that_left_its_ops_out():
    # zoom's region of a clean bf16 MobileNetV2 recorded layer.13's call but not its ops: the padding after it
    # read "a value no op of step 0 wrote (a parameter, buffer or the data)", 0.27 from golden's
    from precision_tool.analysis.omissions import changed_leaf
    from precision_tool.analysis.structure import Consumers
    from precision_tool.dump.records import OpRecord

    hidden, activations = _tensor("input_0", [0.5, -1.0, 2.0, 0.25]), _tensor("output_0", [1.5, -0.5, 0.75, 3.0])
    call = OpRecord(0, 3, "net/layer.13", "module.Block", "forward", "float32", False, (hidden, activations))
    pad = OpRecord(0, 4, "net/layer.14/aten.constant_pad_nd_0", "aten.constant_pad_nd", "forward", "float32", False,
                   (_tensor("input_0", [1.5, -0.5, 0.75, 3.0]), _tensor("output_0", [1.5, -0.5, 0.75, 3.0, 0.0])))
    dump = SimpleNamespace(ops=lambda step, direction: [call, pad])
    assert changed_leaf(pad, pad, Consumers([pad]), [("input_0", 0.269)], dump) is None
    handed_back = OpRecord(0, 3, "net/drop", "module.Dropout", "forward", "float32", False,
                           (_tensor("input_0", [1.5, -0.5, 0.75, 3.0]), activations))
    dump = SimpleNamespace(ops=lambda step, direction: [handed_back, pad])  # (a Dropout of 0 computed nothing)
    verdict = changed_leaf(pad, pad, Consumers([pad]), [("input_0", 0.269)], dump)
    assert (verdict.cls, verdict.op) == ("kernel_bug", "net/layer.14/aten.constant_pad_nd_0")
