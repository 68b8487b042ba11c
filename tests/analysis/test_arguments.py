"""Op arguments that differ between golden and target: what counts, what is left out."""

from precision_tool.analysis.arguments import argument_changes, scalar_arguments


def test_numbers_and_strings_are_compared_by_position_and_keyword():
    golden = {"overload": "default", "args": [{"tensor": 0, "dtype": "float32"}, [32], None, None, 1e-12],
              "kwargs": {}}
    target = {"overload": "default", "args": [{"tensor": 0, "dtype": "bfloat16"}, [32], None, None, 0.1],
              "kwargs": {"approximate": "tanh"}}
    assert argument_changes(golden, target) == ["args[4]: 1e-12 in golden, 0.1 in target",
                                                "kwargs.approximate: not given in golden, 'tanh' in target"]


def test_tensors_dtypes_flags_and_dtype_extremes_are_left_out():
    attrs = {"args": [{"tensor": 0, "dtype": "float16"}, -1, True, -3.4028234663852886e+38],
             "kwargs": {"dtype": {"dtype": "bfloat16"}, "memory_format": {"memory_format": "preserve_format"},
                        "half_to_float": True, "non_blocking": False}}
    assert scalar_arguments(attrs) == {"args[1]": -1}
    # torch.finfo(torch.bfloat16).min as a mask value under autocast is no change of the call
    assert argument_changes({"args": [-3.4028234663852886e+38]}, {"args": [-3.3895313892515355e+38]}) == []


def test_equal_calls_and_engine_attributes():
    assert argument_changes({"epsilon": 1e-5, "axis": -1}, {"epsilon": 1e-5, "axis": -1}) == []
    assert argument_changes({"epsilon": 1e-5}, {"epsilon": 1e-3}) == ["epsilon: 1e-05 in golden, 0.001 in target"]
    assert argument_changes(None, {}) == []


def test_a_torch_ops_flags_that_say_what_it_computes_are_compared_and_dtype_flags_are_not():
    from precision_tool.analysis.arguments import flag_paths

    tensors = [{"tensor": i, "dtype": "float32"} for i in range(5)]
    flags = [[5, "training"]]  # as the torch capture records native_batch_norm's schema
    training = {"overload": "default", "args": tensors + [True, 0.1, 1e-05], "kwargs": {}, "flags": flags}
    evaluating = {"overload": "default", "args": tensors + [False, 0.1, 1e-05], "kwargs": {}, "flags": flags}
    assert flag_paths("aten.native_batch_norm", training) == {"args[5]"}
    assert argument_changes(training, evaluating, "aten.native_batch_norm") == [
        "args[5] (training): True in golden, False in target"]  # named from the flags (dumps before 2026-11-27)
    names = ["input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"]
    other_eps = {**evaluating, "args": tensors + [True, 0.1, 1e-3], "names": names}
    assert argument_changes({**training, "names": names}, other_eps, "aten.native_batch_norm") == [
        "args[7] (eps): 1e-05 in golden, 0.001 in target"]  # every positional argument named (the capture's)
    assert argument_changes(training, evaluating) == []  # without the op's type (an engine op): no flags
    # softmax's half_to_float follows the target's dtype
    assert argument_changes({"overload": "default", "args": [{"tensor": 0}, -1, False], "kwargs": {},
                             "flags": [[2, "half_to_float"]]},
                            {"overload": "default", "args": [{"tensor": 0}, -1, True], "kwargs": {},
                             "flags": [[2, "half_to_float"]]}, "aten._softmax") == []
    # a dump written before the capture recorded flags: none are compared
    unrecorded = {key: value for key, value in training.items() if key != "flags"}
    assert flag_paths("aten.native_batch_norm", unrecorded) == frozenset()
