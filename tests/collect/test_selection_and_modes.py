import pytest

from precision_tool.collect.modes import parse_modes, primary_mode, records_data, records_every_op, role_for
from precision_tool.collect.selection import Selection, module_paths, narrows_ops, parse_op_types, parse_steps
from precision_tool.engine.graph import FusionInfo
from precision_tool.engine.hooks import OpEvent
from precision_tool.errors import ConfigError


def test_parse_steps():
    assert parse_steps("0,5-7") == {0, 5, 6, 7}
    assert parse_steps(" 3 , 1-1 ") == {1, 3}
    assert parse_steps(None) is None and parse_steps("") is None and parse_steps("all") is None
    assert parse_steps([2, 4]) == {2, 4}


@pytest.mark.parametrize("spec", ["x", "1-", "-3", "5-2", "1,,2", "1.5", "-1"])
def test_parse_steps_rejects(spec):
    with pytest.raises(ConfigError, match="bad step selection"):
        parse_steps(spec)


def test_parse_op_types():
    assert parse_op_types("MatMul, Softmax,") == {"MatMul", "Softmax"}
    assert parse_op_types(None) is None and parse_op_types("") is None


def _event(name="blk/MatMul", type="MatMul", direction="forward", fusion=None):
    return OpEvent(0, name, type, 0, direction, [], [], "float16", fusion)


def test_selection_by_name_type_and_direction():
    fused = FusionInfo("MatMulBiasAddFusionPass", ("blk/MatMul", "blk/BiasAdd"), ("MatMul", "BiasAdd"), (), ())
    event = _event("blk/MatMulBiasAdd", "MatMulBiasAdd", fusion=fused)
    assert Selection.build(ops="blk/*").wants_op(_event())
    assert not Selection.build(ops="other/*").wants_op(_event())
    assert Selection.build(ops="*BiasAdd").wants_op(event)  # an original name
    assert Selection.build(op_types="BiasAdd").wants_op(event)  # an original type
    assert not Selection.build(op_types="Softmax").wants_op(event)
    assert Selection.build(ops=["x", "blk/Mat*"]).wants_op(_event())
    assert not Selection.build(backward=False).wants_op(_event(direction="backward"))
    assert Selection.build(backward=False).wants_op(_event(direction="optimizer"))
    selection = Selection.build(steps="1-2")
    assert [selection.wants_step(s) for s in range(4)] == [False, True, True, False]
    assert Selection().everything and not selection.everything
    assert selection.describe() == {"steps": [1, 2], "ops": [], "modules": [], "op_types": None, "backward": True}


def test_module_paths_and_the_module_filter():
    assert module_paths("block1/conv1/Conv2D") == ["block1", "block1/conv1"]
    assert module_paths("Conv2D") == []
    fused = FusionInfo("LayerNormFusionPass", ("norm/Mean", "norm/Sub"), ("Mean", "Sub"), (), ())
    by_module = Selection.build(modules="block1")
    assert by_module.wants_op(_event("block1/conv1/Conv2D"))
    assert not by_module.wants_op(_event("block10/conv1/Conv2D"))  # a path, not a prefix of characters
    assert not by_module.wants_op(_event("head/block1/Conv2D"))
    assert Selection.build(modules="*/conv1").wants_op(_event("block1/conv1/Conv2D"))
    assert Selection.build(modules="norm").wants_op(_event("fused/LayerNormFused", fusion=fused))  # an original
    assert Selection.build(modules="Model/enc").wants_op(_event("Model/enc", "module.Enc"))  # a module record
    both = Selection.build(ops="head/MatMul", modules="block1")  # names add up
    assert both.wants_op(_event("head/MatMul")) and both.wants_op(_event("block1/x/Relu"))
    assert not both.wants_op(_event("head/Relu"))
    narrowed = Selection.build(modules="block1", op_types="Relu", backward=False)  # types and direction narrow
    assert narrowed.wants_op(_event("block1/Relu", "Relu"))
    assert not narrowed.wants_op(_event("block1/MatMul"))
    assert not narrowed.wants_op(_event("block1/Relu", "Relu", direction="backward"))
    assert not by_module.every_op and not by_module.everything and Selection().every_op
    assert by_module.describe()["modules"] == ["block1"]


def test_modes_and_their_combinations():
    assert parse_modes("dump") == ("dump",)
    assert parse_modes("overflow,stats") == parse_modes("stats, overflow") == ("stats", "overflow")
    assert parse_modes("fusion_off") == ("fusion-off",)
    assert parse_modes("fusion-off,dump") == ("fusion-off",)
    assert parse_modes(["overflow", "fusion-off", "stats"]) == ("stats", "overflow", "fusion-off")
    for bad, message in (("dump,stats", "cannot be combined"), ("dump,overflow", "cannot be combined"),
                         ("turbo", "unknown collection mode"), ("", "no collection mode")):
        with pytest.raises(ConfigError, match=message):
            parse_modes(bad)


def test_roles_primary_modes_and_what_is_recorded():
    assert role_for(("dump",), "golden") == "golden"
    assert role_for(("dump",), "npu") == "target"
    assert role_for(("stats",), "npu") == "target"
    assert role_for(("overflow",), "npu") == "overflow"
    assert role_for(("stats", "overflow"), "npu") == "target"
    assert role_for(("overflow", "fusion-off"), "npu") == "fusion-off"
    assert primary_mode(("stats", "overflow")) == "stats"
    assert primary_mode(("stats", "fusion-off")) == "fusion-off"
    assert records_data(("dump",)) and records_data(("fusion-off",))
    assert not records_data(("stats", "fusion-off")) and not records_data(("stats", "overflow"))
    assert not records_every_op(("overflow",)) and not records_every_op(("overflow", "fusion-off"))
    assert records_every_op(("stats", "overflow"))


def test_a_dump_narrowed_to_some_ops_says_so_in_its_metadata():
    assert narrows_ops({"selection": Selection.build(ops=["M/fc/*"]).describe()})
    assert narrows_ops({"selection": Selection.build(modules=["M/fc"]).describe()})
    assert narrows_ops({"selection": Selection.build(op_types=["aten.mm"]).describe()})
    assert not narrows_ops({"selection": Selection.build(steps=[1], backward=False).describe()})
    assert not narrows_ops({}) and not narrows_ops({"selection": "garbled"})
