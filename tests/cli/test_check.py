import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from precision_tool.compare.memory import MemoryDump

RNG = np.random.default_rng(31)
X = RNG.standard_normal((8, 16)).astype(np.float32)


def build(path, noise=(0.0, 0.0, 0.0), role="target"):
    """Three ops; ``noise[i]`` perturbs op i's output."""
    dump = MemoryDump(role=role)
    for i, scale in enumerate(noise):
        out = X + np.float32(scale) * RNG.standard_normal(X.shape).astype(np.float32)
        dump.add(f"layer{i}/MatMul", "MatMul", {"input_0": X, "output_0": out},
                 dtypes={"output_0": "float16" if scale else "float32"})
    return dump.save(path)


@pytest.fixture
def golden(tmp_path):
    return build(tmp_path / "golden.h5", role="golden")


def test_exit_0_when_every_tensor_passes(run_cli, golden, tmp_path):
    target = build(tmp_path / "t.h5", (0.0, 1e-4, 1e-4))
    result = run_cli("check", golden, target)
    assert result.status == 0, result.stdout + result.stderr
    assert "PASSED | 3 tensors checked" in result.stdout  # outputs; inputs are judged where they are written
    assert "PASSED | 6 tensors checked" in run_cli("check", golden, target, "--judge-inputs").stdout


def test_exit_1_prints_failing_ops_first_first(run_cli, golden, tmp_path):
    target = build(tmp_path / "t.h5", (0.0, 0.5, 1.0))
    result = run_cli("check", golden, target, "--min-cosine", "0.99")
    assert result.status == 1
    assert "FAILED" in result.stdout
    assert result.stdout.index("layer1/MatMul") < result.stdout.index("layer2/MatMul")
    assert "first failing op: step 0 #1 layer1/MatMul" in result.stdout
    assert "fp16/fp32" in result.stdout
    assert "check failed: 2 failures in 2 ops; first: step 0 #1 layer1/MatMul" in result.stderr


def test_max_abs_err_option(run_cli, golden, tmp_path):
    target = build(tmp_path / "t.h5", (0.0, 1e-3, 0.0))
    assert run_cli("check", golden, target, "--max-abs-err", "1").status == 0
    result = run_cli("check", golden, target, "--max-abs-err", "1e-6")
    assert result.status == 1 and "max_abs_err" in result.stdout


@pytest.mark.parametrize("args", [("--min-cosine", "1.5"), ("--max-abs-err", "-1"), ("--format", "xml")])
def test_exit_2_on_usage_errors(run_cli, golden, args):
    result = run_cli("check", golden, golden, *args)
    assert result.status == 2


def test_exit_2_on_input_errors(run_cli, golden, tmp_path):
    assert run_cli("check", golden, tmp_path / "nope.h5").status == 2
    other = MemoryDump()
    other.add("unrelated", "T", {"output_0": X})
    result = run_cli("check", golden, other.save(tmp_path / "other.h5"))
    assert result.status == 2 and "nothing to check" in result.stderr


def test_junit_is_xml_with_one_testcase_per_op(run_cli, golden, tmp_path):
    target, junit = build(tmp_path / "t.h5", (0.0, 0.0, 1.0)), tmp_path / "junit.xml"
    result = run_cli("check", golden, target, "--junit", junit)
    assert result.status == 1
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f"layer{i}/MatMul (forward)" for i in range(3)]
    failure = cases[2].find("failure")
    assert failure is not None and "output_0" in failure.get("message") and "cosine" in failure.get("message")
    assert suite.get("failures") == "1" and suite.get("tests") == "3"


def test_json_format(run_cli, golden, tmp_path):
    target = build(tmp_path / "t.h5", (0.0, 1.0, 0.0))
    result = run_cli("check", golden, target, "--format", "json")
    assert result.status == 1
    document = json.loads(result.stdout)
    assert document["passed"] is False
    assert document["failing_ops"] == [{"step": 0, "exec_index": 1, "op": "layer1/MatMul", "direction": "forward"}]
    assert document["failures"][0]["target_dtype"] == "float16"


def test_baseline_passes_on_its_own_dumps_and_fails_on_worse_ones(run_cli, golden, tmp_path):
    target = build(tmp_path / "t.h5", (0.0, 0.05, 0.5))  # layer2 already below 0.99
    baseline = tmp_path / "baseline.json"
    made = run_cli("baseline", golden, target, "-o", baseline)
    assert made.status == 0 and "baseline of 6 tensors in 3 ops" in made.stdout
    document = json.loads(baseline.read_text())
    assert document["golden"]["size"] > 0 and len(document["golden"]["sha256_head_tail"]) == 64
    assert run_cli("check", golden, target).status == 1  # fails the absolute threshold...
    assert run_cli("check", golden, target, "--baseline", baseline).status == 0  # ...but not its baseline

    worse = build(tmp_path / "worse.h5", (0.0, 0.5, 0.5))
    result = run_cli("check", golden, worse, "--baseline", baseline)
    assert result.status == 1
    assert "layer1/MatMul" in result.stdout and "dropped below baseline" in result.stdout


def test_a_baseline_of_other_runs_is_an_input_error(run_cli, golden, tmp_path):
    """A baseline sharing no tensor with the comparison judged nothing, and the gate passed on the absolute
    criteria alone with a note; it is refused, naming the file (one that shares some still judges those)."""
    other = MemoryDump(role="golden")
    other.add("encoder/Softmax", "Softmax", {"input_0": X, "output_0": X})
    other_golden, other_target = other.save(tmp_path / "og.h5"), other.save(tmp_path / "ot.h5")
    baseline = tmp_path / "other.json"
    assert run_cli("baseline", other_golden, other_target, "-o", baseline).status == 0
    target = build(tmp_path / "t.h5", (0.0, 1e-4, 1e-4))
    result = run_cli("check", golden, target, "--baseline", baseline)
    assert (result.status, result.stdout) == (2, "")
    assert result.stderr == (f"precision-tool: error: {baseline}: shares no tensor with this comparison: its 2 "
                             "tensors name other ops or steps (a baseline of other runs?)\n")
    own = tmp_path / "own.json"
    assert run_cli("baseline", golden, target, "-o", own, "--steps", "0").status == 0
    assert run_cli("check", golden, target, "--baseline", own).status == 0


def test_bad_baseline_file_exits_2(run_cli, golden, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    result = run_cli("check", golden, golden, "--baseline", bad)
    assert result.status == 2 and "not a precision-tool baseline" in result.stderr


def test_baseline_needs_an_output_file(run_cli, golden):
    result = run_cli("baseline", golden, golden)
    assert result.status == 2 and "-o" in result.stderr


@pytest.mark.parametrize("precision_mode", ["force_fp16", "allow_mix_precision"])
def test_a_clean_low_precision_run_of_the_readme_flow_passes_check_by_default(run_cli, tmp_path, precision_mode):
    # the attention key-bias gradients are zero in exact arithmetic: near zero, shown but not judged
    golden, target = tmp_path / "golden.h5", tmp_path / "npu.h5"
    assert run_cli("collect", "transformer", "--device", "golden", "-o", str(golden), "--steps", "3").status == 0
    assert run_cli("collect", "transformer", "--device", "npu", "--precision-mode", precision_mode,
                   "-o", str(target), "--steps", "3").status == 0
    result = run_cli("check", str(golden), str(target))
    assert result.status == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout
    shown = run_cli("compare", str(golden), str(target), "--all", "--format", "json")
    skipped = [row for row in json.loads(shown.stdout)["rows"] if row["skip"]]
    assert skipped and all(row["skip"].startswith("near zero") for row in skipped)
    assert {row["op"] for row in skipped} >= {"blocks/0/attn/k/MatMulBiasAdd", "blocks/1/attn/k/MatMulBiasAdd"}


def test_a_selection_that_picks_nothing_is_named_with_the_steps_the_dump_holds(run_cli, golden, tmp_path):
    target = build(tmp_path / "t.h5", (0.0, 1e-4, 1e-4))
    result = run_cli("check", golden, target, "--steps", "3-5,9")
    assert (result.status, result.stdout) == (2, "")
    assert result.stderr == f"precision-tool: error: {golden}: no op in --steps 3-5,9 (it holds steps 0): nothing to check\n"


@pytest.mark.parametrize("options, selection", [(("--steps", "3-5,9"), "--steps 3-5,9 (it holds steps 0)"),
                                                (("--ops", "nowhere*"), "--ops 'nowhere*'"),
                                                (("--steps", "7", "--all"), "--steps 7 (it holds steps 0)")])
def test_compare_names_a_selection_that_picks_nothing(run_cli, golden, tmp_path, options, selection):
    # it exited 0 with "the golden dump has no op in the selected steps and names", as if the runs agreed
    target = build(tmp_path / "t.h5", (0.0, 1e-4, 1e-4))
    result = run_cli("compare", golden, target, *options)
    assert (result.status, result.stdout) == (2, "")
    assert result.stderr == f"precision-tool: error: {golden}: no op in {selection}: nothing to compare\n"
    result = run_cli("baseline", golden, target, "-o", tmp_path / "b.json", "--ops", "head/*")
    assert result.stderr == f"precision-tool: error: {golden}: no op in --ops 'head/*': nothing to save\n"
    other = MemoryDump(role="target")
    other.add("elsewhere/Add", "Add", {"output_0": X})
    result = run_cli("check", golden, other.save(tmp_path / "other.h5"))
    assert result.stderr.endswith(f"no tensor matches the golden dump {golden}: nothing to check\n")


def test_the_failing_tensors_are_said_to_be_in_execution_order(run_cli, golden, tmp_path):
    result = run_cli("check", golden, build(tmp_path / "t.h5", (0.0, 0.5, 1.0)))
    assert result.stdout.splitlines()[0] == "Failing tensors, in execution order:"  # was "first first"
    assert "in execution order (default 10; 0: all)" in " ".join(run_cli("compare", "-h").stdout.split())


def test_a_step_only_golden_holds_names_the_target(run_cli, tmp_path):
    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    for step in (0, 1):
        golden.add("layer0/MatMul", "MatMul", {"output_0": X}, step=step)
    target.add("layer0/MatMul", "MatMul", {"output_0": X}, step=0)
    golden, target = golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5")
    for command in ("compare", "check"):
        result = run_cli(command, golden, target, "--steps", "1")
        assert result.status == 2
        assert result.stderr == f"precision-tool: error: {target}: no op in --steps 1 (it holds steps 0): " \
                                f"nothing to {command}\n"
