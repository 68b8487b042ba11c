from precision_tool.compare.matching import fused_origin, match_ops
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats

STATS = TensorStats(4, 0.0, 1.0, 0.5, 0.5, 1.0)


def op(name, slots=("input_0", "output_0"), *, step=0, index=0, direction="forward", **fusion):
    tensors = tuple(TensorRecord(slot, "float32", (4,), STATS) for slot in slots)
    return OpRecord(step, index, name, fusion.pop("type", "T"), direction, "float32", False, tensors, **fusion)


def pairs_of(result):
    return [(p.target_op.name, p.target.slot, p.golden_op.name, p.golden.slot) for p in result.pairs]


FUSION = dict(pass_name="MatMulAddFusion", original_names=("fc/MatMul", "fc/Add"),
              original_types=("MatMul", "Add"), output_origins=(("fc/Add", 0),),
              input_origins=(("fc/MatMul", 0), ("fc/MatMul", 1), ("fc/Add", 1)))


def golden_fc(direction="forward"):
    if direction == "forward":
        return [op("fc/MatMul", ("input_0", "input_1", "output_0"), index=0),
                op("fc/Add", ("input_0", "input_1", "output_0"), index=1)]
    # backward: inputs are incoming gradients, outputs the gradients for the forward inputs
    return [op("fc/Add", ("input_0", "output_0", "output_1"), index=2, direction="backward"),
            op("fc/MatMul", ("input_0", "output_0", "output_1"), index=3, direction="backward")]


def test_same_names_pair_slot_by_slot():
    golden = [op("a", index=0), op("b", index=1)]
    target = [op("a", index=0), op("b", index=1)]
    result = match_ops(golden, target)
    assert pairs_of(result) == [("a", "input_0", "a", "input_0"), ("a", "output_0", "a", "output_0"),
                                ("b", "input_0", "b", "input_0"), ("b", "output_0", "b", "output_0")]
    assert not result.unmatched_golden and not result.unmatched_target and not result.covered_by_fusion


def test_fused_forward_op_pairs_through_its_origins():
    fused = op("fc/FusedMatMulAdd", ("input_0", "input_1", "input_2", "output_0"), index=0, **FUSION)
    result = match_ops(golden_fc(), [fused])
    assert pairs_of(result) == [
        ("fc/FusedMatMulAdd", "input_0", "fc/MatMul", "input_0"),
        ("fc/FusedMatMulAdd", "input_1", "fc/MatMul", "input_1"),
        ("fc/FusedMatMulAdd", "input_2", "fc/Add", "input_1"),
        ("fc/FusedMatMulAdd", "output_0", "fc/Add", "output_0"),
    ]
    assert all(p.via_fusion for p in result.pairs)
    assert [c.name for c in result.covered_by_fusion] == ["fc/MatMul", "fc/Add"]
    assert {c.pass_name for c in result.covered_by_fusion} == {"MatMulAddFusion"}
    assert not result.unmatched_golden and not result.unmatched_target


def test_fused_backward_op_pairs_gradients_with_the_original_input_gradients():
    fused = op("fc/FusedMatMulAdd", ("input_0", "output_0", "output_1", "output_2"), index=0,
               direction="backward", **FUSION)
    result = match_ops(golden_fc("backward"), [fused])
    assert pairs_of(result) == [
        ("fc/FusedMatMulAdd", "input_0", "fc/Add", "input_0"),  # gradient arriving at fused output 0
        ("fc/FusedMatMulAdd", "output_0", "fc/MatMul", "output_0"),  # gradient for fused input 0
        ("fc/FusedMatMulAdd", "output_1", "fc/MatMul", "output_1"),
        ("fc/FusedMatMulAdd", "output_2", "fc/Add", "output_1"),
    ]
    assert len(result.covered_by_fusion) == 2 and not result.unmatched_golden


def test_fused_op_whose_origin_is_missing_is_listed_unmatched():
    fused = op("fc/FusedMatMulAdd", ("input_0", "output_0"), index=0, **{**FUSION, "output_origins": (("gone", 0),)})
    result = match_ops(golden_fc(), [fused])
    assert [(u.name, u.slot) for u in result.unmatched_target] == [("fc/FusedMatMulAdd", "output_0")]
    assert "gone:output_0" in result.unmatched_target[0].reason


def test_leftovers_on_both_sides_are_listed_never_dropped():
    golden = [op("a", index=0), op("only_golden", index=1)]
    target = [op("a", ("input_0", "output_0", "output_1"), index=0), op("only_target", index=1)]
    result = match_ops(golden, target)
    assert [(u.side, u.name, u.slot) for u in result.unmatched_golden] == [("golden", "only_golden", "")]
    assert [(u.side, u.name, u.slot) for u in result.unmatched_target] == [
        ("target", "a", "output_1"), ("target", "only_target", "")]


def test_different_models_leave_everything_unmatched():
    result = match_ops([op("x", index=0), op("y", index=1)], [op("p", index=0)])
    assert not result.pairs
    assert len(result.unmatched_golden) == 2 and len(result.unmatched_target) == 1


def test_steps_directions_and_repeated_runs_are_kept_apart():
    golden = [op("a", step=0), op("a", step=1), op("a", step=0, index=1, direction="backward"),
              op("w", ("input_0", "output_0"), step=0, index=2, direction="optimizer"),
              op("shared", step=0, index=3), op("shared", step=0, index=4)]
    target = [op("a", step=1), op("a", step=0, index=1, direction="backward"),
              op("w", ("input_0", "output_0"), step=0, index=2, direction="optimizer"),
              op("shared", step=0, index=3), op("shared", step=0, index=4)]
    result = match_ops(golden, target)
    keys = {(p.target_op.step, p.target_op.direction, p.target_op.exec_index, p.golden_op.exec_index)
            for p in result.pairs}
    assert keys == {(1, "forward", 0, 0), (0, "backward", 1, 1), (0, "optimizer", 2, 2),
                    (0, "forward", 3, 3), (0, "forward", 4, 4)}
    assert [(u.step, u.name) for u in result.unmatched_golden] == [(0, "a")]


def test_a_fused_op_present_on_both_sides_matches_by_name():
    fused = op("fc/FusedMatMulAdd", ("input_0", "output_0"), **FUSION)
    result = match_ops([fused], [fused])
    assert pairs_of(result) == [("fc/FusedMatMulAdd", "input_0", "fc/FusedMatMulAdd", "input_0"),
                                ("fc/FusedMatMulAdd", "output_0", "fc/FusedMatMulAdd", "output_0")]
    assert not result.covered_by_fusion


def test_fused_origin_table():
    forward = op("f", ("input_0", "output_0"), **FUSION)
    backward = op("f", ("input_0", "output_2"), direction="backward", **FUSION)
    assert fused_origin(forward, forward.tensor("output_0")) == ("fc/Add", "output_0")
    assert fused_origin(forward, forward.tensor("input_0")) == ("fc/MatMul", "input_0")
    assert fused_origin(backward, backward.tensor("output_2")) == ("fc/Add", "output_1")
    assert fused_origin(backward, backward.tensor("input_0")) == ("fc/Add", "input_0")
