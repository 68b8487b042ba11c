"""Pairing that names alone get wrong: the training loop's renumbered ops, a hand-written backward's incoming
gradient, an optimizer whose update ops differ."""

from __future__ import annotations

from precision_tool.analysis.pairing import align_loop_ops
from precision_tool.analysis.structure import rewritten_backward, rewritten_optimizer
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats


def tensor(slot: str, shape: tuple = (), mean: float = 0.5, dtype: str = "float32") -> TensorRecord:
    count = 1
    for n in shape:
        count *= n
    return TensorRecord(slot, dtype, shape, TensorStats(count, -1.0, 1.0, mean, 0.1, abs(mean) * count))


def op(index: int, name: str, op_type: str, direction: str = "forward", tensors=()) -> OpRecord:
    return OpRecord(0, index, name, op_type, direction, "float32", False, tuple(tensors))


def test_an_op_only_the_target_runs_outside_modules_does_not_shift_the_pairing_of_later_ones():
    # golden clips: reciprocal, mul (one tensor input); the target first scales the loss by a GradScaler's
    # scale (mul of two tensors) and unscales in float64, so clipping's ops are reciprocal_1 and mul_1
    golden = [op(0, "aten.div_0", "aten.div", tensors=[tensor("input_0"), tensor("output_0")]),
              op(1, "aten.reciprocal_0", "aten.reciprocal", tensors=[tensor("input_0"), tensor("output_0")]),
              op(2, "aten.mul_0", "aten.mul", tensors=[tensor("input_0"), tensor("output_0")]),
              op(3, "M/aten.mm_0", "aten.mm", tensors=[tensor("input_0", (2, 2)), tensor("output_0", (2, 2))])]
    target = [op(0, "aten.div_0", "aten.div", tensors=[tensor("input_0"), tensor("output_0")]),
              op(1, "aten.mul_0", "aten.mul", tensors=[tensor("input_0"), tensor("input_1"), tensor("output_0")]),
              op(2, "aten._to_copy_0", "aten._to_copy",
                 tensors=[tensor("input_0"), tensor("output_0", (), 1, "float64")]),
              op(3, "aten.reciprocal_0", "aten.reciprocal", tensors=[tensor("input_0"), tensor("output_0")]),
              op(4, "aten.reciprocal_1", "aten.reciprocal", tensors=[tensor("input_0"), tensor("output_0")]),
              op(5, "aten.mul_1", "aten.mul", tensors=[tensor("input_0"), tensor("output_0")]),
              op(6, "M/aten.mm_0", "aten.mm", tensors=[tensor("input_0", (2, 2)), tensor("output_0", (2, 2))])]
    changed = align_loop_ops(golden, target)
    assert {target[i].name: (p.name if p is not None else None) for i, p in
            ((i, changed[id(r)]) for i, r in enumerate(target) if id(r) in changed)} == {
        "aten.mul_0": None, "aten.reciprocal_0": None, "aten.reciprocal_1": "aten.reciprocal_0",
        "aten.mul_1": "aten.mul_0"}


def test_loop_ops_that_pair_by_name_are_left_alone():
    golden = [op(0, "aten.div_0", "aten.div", tensors=[tensor("input_0"), tensor("output_0")])]
    target = [op(0, "aten.div_0", "aten.div", tensors=[tensor("input_0", (), 0.7), tensor("output_0")])]
    assert align_loop_ops(golden, target) == {}


def test_a_handwritten_backward_reads_its_incoming_gradient_where_a_backward_op_outside_it_wrote_it():
    # golden: silu_backward(grad, x); the target: sigmoid(x) first (x has the gradient's size), then mul(grad, s)
    x, grad, s = tensor("input_0", (4,), 0.3), tensor("output_0", (4,), 0.2), tensor("output_0", (4,), 0.6)
    forward = [op(0, "M/act/aten.silu_0", "aten.silu", tensors=[x, tensor("output_0", (4,), 0.9)]),
               op(1, "M/act", "module.SiLU", tensors=[x])]
    up = op(2, "M/up/aten.mm_0/aten.mm_0", "aten.mm", "backward", [tensor("input_0", (4,), 0.8), grad])
    golden = forward + [up, op(3, "M/act/aten.silu_0/aten.silu_backward_0", "aten.silu_backward", "backward",
                               [grad.__class__("input_0", *_rest(grad)), x.__class__("input_1", *_rest(x)),
                                tensor("output_0", (4,), 0.1)])]
    target = forward + [up, op(3, "M/act/aten.silu_0/aten.sigmoid_0", "aten.sigmoid", "backward", [x, s]),
                        op(4, "M/act/aten.silu_0/aten.mul_0", "aten.mul", "backward",
                           [grad.__class__("input_0", *_rest(grad)), s.__class__("input_1", *_rest(s)),
                            tensor("output_0", (4,), 0.12)])]
    [rewrite] = rewritten_backward(golden, target)
    assert (rewrite.name, rewrite.target_first.name, rewrite.target_slot, rewrite.golden_slot) == (
        "M/act", "M/act/aten.silu_0/aten.mul_0", "input_0", "input_0")


def _rest(t: TensorRecord) -> tuple:
    return t.dtype, t.shape, t.stats


def test_an_optimizer_whose_update_ops_differ_is_one_group():
    def update(first: str, index: int) -> list[OpRecord]:
        return [op(index, f"optimizer/SGD/aten.{first}_0", f"aten.{first}", "optimizer", [tensor("output_0", (3,))]),
                op(index + 1, "optimizer/SGD/aten.add__0", "aten.add_", "optimizer", [tensor("output_0", (3,))])]

    assert rewritten_optimizer(update("mul_", 0), update("mul_", 0)) == []
    [rewrite] = rewritten_optimizer(update("mul_", 0), update("clone", 0))
    assert (rewrite.name, rewrite.direction, rewrite.golden_ops, rewrite.target_ops) == (
        "optimizer/SGD", "optimizer", ("aten.mul_", "aten.add_"), ("aten.add_",))
