import pytest

from precision_tool.repl.tensors import TensorRef, TensorSyntaxError, parse_tensor


@pytest.mark.parametrize("text, expected", [
    ("fc1/MatMul:output_0", TensorRef(op="fc1/MatMul", slot="output_0")),
    ("fc1/MatMul", TensorRef(op="fc1/MatMul", slot="output_0")),
    ("golden:fc1/MatMul:input_1@2", TensorRef(op="fc1/MatMul", slot="input_1", side="golden", step=2)),
    ("fusion-off:a:output_3#bwd", TensorRef(op="a", slot="output_3", side="fusion-off", direction="backward")),
    ("x:y:output_0@7#optimizer", TensorRef(op="x:y", slot="output_0", step=7, direction="optimizer")),
    ("block1/attn/Softmax@3", TensorRef(op="block1/attn/Softmax", step=3)),
])
def test_grammar(text, expected):
    assert parse_tensor(text) == expected


def test_npy_path_is_a_file_reference():
    assert parse_tensor("./saved/x.npy") == TensorRef(path="./saved/x.npy")


def test_unknown_direction_names_the_valid_ones():
    with pytest.raises(TensorSyntaxError, match="unknown direction 'sideways'.*forward, fwd, backward"):
        parse_tensor("a:output_0#sideways")


def test_a_step_of_thousands_of_digits_is_a_syntax_error():
    """int() refuses strings of over 4,300 digits: it was an internal error (exit 3) in pt and cp."""
    with pytest.raises(TensorSyntaxError, match=r"step 9{20}\.\.\. \(5000 digits\) is beyond any step a dump holds"):
        parse_tensor("a@" + "9" * 5000)
    assert parse_tensor("a@" + "0" * 30 + "12").step == 12


def test_empty_op_is_rejected():
    with pytest.raises(TensorSyntaxError, match="cannot read tensor"):
        parse_tensor("golden:")


def test_label_spells_the_resolved_reference():
    ref = TensorRef(op="a/b", slot="input_0", side="golden", step=1, direction="backward")
    assert ref.label() == "golden:a/b:input_0@1#backward"
    assert TensorRef(op="a").label(side="target", step=0) == "target:a:output_0@0"
