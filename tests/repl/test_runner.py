"""Lines through the runner, in process, over in-memory dumps: the commands that only read dumps."""

import numpy as np
import pytest

from precision_tool.commands.results import Candidates, OpInfo, OpListing, TensorComparison, TensorView


def run(runner, line):
    [outcome] = runner.run_line(line)
    assert outcome.error is None, outcome.error
    return outcome.result


def error_of(runner, line):
    [outcome] = runner.run_line(line)
    assert outcome.error is not None
    return outcome.error


def test_ls_without_filter_counts_per_type(runner):
    listing = run(runner, "ls")
    assert isinstance(listing, OpListing) and listing.step == 0
    assert [(c.type, c.count) for c in listing.counts] == [("MatMul", 2), ("FusedMatMulRelu", 1)]


def test_ls_filters_are_substrings(runner):
    assert [op.name for op in run(runner, "ls -t Fused").ops] == ["fused/MatMulRelu"]
    assert [op.name for op in run(runner, "ls -f ReluFusion").ops] == ["fused/MatMulRelu"]
    assert [(op.name, op.direction) for op in run(runner, "ls -n fc2 -s 1").ops] == [
        ("fc2/MatMul", "forward"), ("fc2/MatMul", "backward")]


def test_ni_exact_substring_and_candidates(runner):
    info = run(runner, "ni fc2/MatMul")
    assert isinstance(info, OpInfo) and info.op.name == "fc2/MatMul" and info.op.step == 0
    assert run(runner, "ni fc2").op.name == "fc2/MatMul"
    found = run(runner, "ni MatMul")
    assert isinstance(found, Candidates) and found.names == ("fused/MatMulRelu", "fc2/MatMul")


def test_ni_shows_every_side_and_metrics_against_golden(runner):
    info = run(runner, "ni fc2 -s 1")
    assert set(info.sides) == {"target", "golden"}
    output = info.slots[-1]
    assert output.slot == "output_0" and set(output.records) == {"target", "golden"}
    assert output.metric.cosine < 0.98 and output.metric.max_abs_error == pytest.approx(10.0, rel=1e-4)


def test_ni_matches_a_fused_op_through_its_origins(runner):
    info = run(runner, "ni fused/MatMulRelu")
    assert info.slots[-1].counterparts == {"golden": "act/Relu:output_0"}
    assert info.slots[0].counterparts == {"golden": "fc1/MatMul:input_0"}
    assert info.slots[-1].metric.cosine == 1.0


def test_ni_backward(runner):
    info = run(runner, "ni fc2 -d backward")
    assert info.op.direction == "backward"


def test_ni_unknown_op_suggests_close_names(runner):
    assert error_of(runner, "ni fc9/MatMul") == (
        "no op in the target dump matches 'fc9/MatMul'; did you mean 'fc2/MatMul', 'fused/MatMulRelu'?")
    assert "was not recorded at step 7" in error_of(runner, "ni fc2 -s 7")


def test_pt_prints_stats_and_first_values(runner, session):
    view = run(runner, "pt fc2/MatMul:output_0 -p 5")
    assert isinstance(view, TensorView)
    assert view.label == "target:fc2/MatMul:output_0@0"
    assert view.shape == (4, 3) and view.total == 12 and view.shown == 5
    stored = session.dump("target").tensor(0, 1, "output_0")
    np.testing.assert_array_equal(view.values, stored.ravel()[:5])


def test_pt_golden_side_step_and_direction(runner):
    view = run(runner, "pt golden:fc2/MatMul:output_0@1#bwd")
    assert view.label == "golden:fc2/MatMul:output_0@1#backward"
    assert view.shape == (4, 8)


def test_pt_reads_a_npy_file_without_writing(runner, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(6, dtype=np.float32).reshape(2, 3))
    view = run(runner, f"pt {path} -p 3")
    assert view.values.tolist() == [0.0, 1.0, 2.0] and view.stats.max == 5.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_pt_missing_slot_lists_the_slots(runner):
    assert error_of(runner, "pt fc2/MatMul:output_4") == (
        "'fc2/MatMul' has no output_4 on the target side; slots: input_0, input_1, output_0")


def test_cp_defaults_to_target_against_golden(runner):
    result = run(runner, "cp fc2/MatMul:output_0")
    assert isinstance(result, TensorComparison)
    assert (result.left, result.right) == ("target:fc2/MatMul:output_0@0", "golden:fc2/MatMul:output_0@0")
    assert result.allclose is False and result.mismatched == 1 and result.error_ratio == pytest.approx(1 / 12)
    [mismatch] = result.mismatches
    assert mismatch.index == (0, 0) and mismatch.diff == pytest.approx(10.0, rel=1e-4)


def test_cp_fused_op_against_its_original(runner):
    result = run(runner, "cp fused/MatMulRelu:output_0")
    assert result.right == "golden:act/Relu:output_0@0" and result.allclose


def test_cp_two_explicit_tensors_and_limits(runner):
    result = run(runner, "cp fc2/MatMul:output_0 golden:fc2/MatMul:output_0@1 -p 3 -al 0 -rl 0")
    assert result.mismatched == 12 and len(result.mismatches) == 3
    assert (result.atol, result.rtol) == (0.0, 0.0)


def test_cp_size_mismatch_is_reported_not_padded(runner):
    result = run(runner, "cp fc2/MatMul:output_0 fc2/MatMul:input_0")
    assert not result.comparable and result.notes == ["sizes differ: 12 vs 32 elements; not compared"]


def test_cp_two_npy_files(runner, tmp_path):
    np.save(tmp_path / "a.npy", np.array([1.0, 2.0, 3.0, 0.0]))
    np.save(tmp_path / "b.npy", np.array([1.0, 2.5, 3.0, 0.0]))
    result = run(runner, f"cp {tmp_path / 'a.npy'} {tmp_path / 'b.npy'} -p 5")
    assert result.mismatched == 1 and result.mismatches[0].index == (1,)
    assert result.mismatches[0].diff == -0.5


def test_cp_stats_only_tensor_is_an_error(session):
    from precision_tool.repl.runner import Runner

    session.dump("target").add(0, "stats/Only", "Add", {"output_0": np.ones(3)}, keep_data=False)
    session.dump("golden").add(0, "stats/Only", "Add", {"output_0": np.ones(3)})
    assert "kept statistics only" in error_of(Runner(session), "cp stats/Only:output_0")


def test_missing_role_names_the_option(runner):
    del runner.session.dumps["golden"]
    assert error_of(runner, "cp fc2/MatMul:output_0") == (
        "cp needs a golden dump; start the shell with --golden FILE or pass a golden dump among FILES")


def test_an_op_without_forward_is_found_in_its_own_direction(runner):
    runner.session.dump("target").add(0, "sgd/ApplyGradientDescent", "ApplyGradientDescent",
                                      {"input_0": np.ones(3), "output_0": np.ones(3)}, direction="optimizer")
    runner.session._indexes.clear()
    assert run(runner, "ni sgd").op.direction == "optimizer"
    assert run(runner, "pt sgd/ApplyGradientDescent").label == "target:sgd/ApplyGradientDescent:output_0@0#optimizer"
    assert "has no forward record in the target dump; it has optimizer" in error_of(runner, "ni sgd -d forward")


def test_ni_shows_the_arguments_and_how_golden_called_the_op():
    """The argument a port changed (a LayerNorm's epsilon) is the evidence `diagnose` gives: `ni` shows it."""
    from precision_tool.repl.runner import Runner
    from precision_tool.repl.session import ShellSession

    from .conftest import TextShell
    from .shell_fakes import FakeDump

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    dumps = {"golden": FakeDump("/data/golden.h5", "golden"), "target": FakeDump("/data/target.h5", "target")}
    for role, eps in (("golden", 1e-5), ("target", 0.01)):
        for name, epsilon in (("ln_1/aten.native_layer_norm_0", 1e-5), ("ln_2/aten.native_layer_norm_0", eps)):
            dumps[role].add(0, name, "aten.native_layer_norm", {"input_0": x, "output_0": x}, attrs={
                "overload": "default", "args": [{"tensor": 0, "dtype": "float32"}, [4], None, None, epsilon],
                "kwargs": {}})
    session = ShellSession(dumps)
    changed = run(Runner(session), "ni ln_2")
    assert changed.arguments == {"args[1][0]": 4, "args[4]": 0.01}
    assert changed.argument_changes == ["args[4]: 1e-05 in golden, 0.01 in target"]
    assert run(Runner(session), "ni ln_1").argument_changes == []
    out, _ = TextShell(Runner(session))("ni ln_2")
    assert "Arguments              args[1][0]=4, args[4]=0.01" in out
    assert "Arguments vs golden    args[4]: 1e-05 in golden, 0.01 in target" in out
    assert "Arguments vs golden    the same" in TextShell(Runner(session))("ni ln_1")[0]
