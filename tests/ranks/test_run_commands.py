"""compare, check, diagnose and ranks over runs of several ranks, through the CLI."""

from __future__ import annotations

import json
import shutil

import pytest

from precision_tool.dump.runs import write_manifest


def test_ranks_of_a_clean_run_are_consistent(runs, run_cli):
    for name in ("golden", "npu"):
        result = run_cli("ranks", runs[name])
        assert result.status == 0, result.stderr
        assert "CONSISTENT | 2 ranks consistent: 90 tensors of 36 ops over 3 steps identical on every rank" \
            in " ".join(result.stdout.split())


def test_ranks_names_the_rank_that_departs_first_and_exits_1(runs, run_cli):
    result = run_cli("ranks", runs["fault"], "--format", "json")
    assert result.status == 1
    document = json.loads(result.stdout)
    assert (document["consistent"], document["world_size"]) == (False, 2)
    first = document["first"]
    assert (first["step"], first["op"], first["type"], first["slot"], first["departing"], first["agreeing"]) == \
        (0, "allreduce/fc1/weight", "AllReduce", "output_0", [1], [0])
    assert first["reason"] == "not the mean or sum of the ranks' inputs"
    assert result.stderr.startswith("precision-tool: error: ranks disagree: rank 1 first departs at step 0, "
                                    "allreduce/fc1/weight output_0")


def test_compare_of_two_runs_tables_every_rank_and_names_the_first_to_diverge(runs, run_cli):
    result = run_cli("compare", runs["golden"], runs["fault"], "--format", "json")
    assert result.status == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["world_size"], document["first_diverging_rank"], document["listed_rank"]) == (2, 1, 1)
    rank0, rank1 = document["ranks"]
    assert (rank1["first_step"], rank1["first_op"], rank1["first_direction"]) == (0, "allreduce/fc1/weight",
                                                                                  "backward")
    assert rank0["first_step"] == 1 and rank0["flagged"] < rank1["flagged"]  # rank 0 follows a step later
    assert document["listed"]["target"]["path"].endswith("rank1.h5")
    table = run_cli("compare", runs["golden"], runs["fault"])
    assert "rank 1 diverges first: step 0 #18 allreduce/fc1/weight (backward)" in table.stdout


def test_compare_of_a_run_with_itself_flags_nothing(runs, run_cli):
    result = run_cli("compare", runs["golden"], runs["golden"], "--format", "csv")
    assert result.status == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "rank,target,ops,flagged,first_step,first_exec_index,first_op,first_direction,min_cosine," \
                       "first_diverging"
    assert [line.split(",")[3] for line in lines[1:]] == ["0", "0"]


def test_check_of_two_runs_fails_naming_the_rank(runs, run_cli, tmp_path):
    assert run_cli("check", runs["golden"], runs["golden"]).status == 0
    result = run_cli("check", runs["golden"], runs["fault"], "--junit", tmp_path / "j.xml")
    assert result.status == 1
    assert result.stderr.splitlines()[1] == ("precision-tool: error: check failed on 2 of 2 ranks; rank 1 fails "
                                             "first: step 0 #18 allreduce/fc1/weight (backward)")
    junit = (tmp_path / "j.xml").read_text()
    assert 'name="precision-tool check rank0"' in junit and 'name="precision-tool check rank1"' in junit


def test_diagnose_of_two_runs_diagnoses_the_rank_that_diverges_first(runs, run_cli):
    result = run_cli("diagnose", runs["golden"], runs["fault"], "--format", "json")
    assert result.status == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["first_diverging_rank"], document["diagnosed_rank"]) == (1, 1)
    assert "verdict" in json.dumps(document["diagnosis"])
    table = run_cli("diagnose", runs["golden"], runs["fault"])
    assert "2 ranks: diagnosing rank 1 (it diverges first;" in table.stdout


def test_single_dump_pairs_are_unchanged(runs, run_cli):
    result = run_cli("compare", runs["golden"] / "rank0.h5", runs["npu"] / "rank0.h5", "--format", "json")
    assert result.status == 0 and "first_diverging_rank" not in json.loads(result.stdout)


def _copy_run(source, target, ranks=None, world_size=None):
    target.mkdir()
    for rank in ranks if ranks is not None else (0, 1):
        shutil.copy(source / f"rank{rank}.h5", target / f"rank{rank}.h5")
    if world_size is not None:
        write_manifest(target, world_size)


@pytest.mark.parametrize("command", ["compare", "check", "diagnose"])
def test_bad_runs_are_one_line_and_exit_2(runs, run_cli, tmp_path, command):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    missing = tmp_path / "missing"
    _copy_run(runs["npu"], missing, ranks=(0,), world_size=2)
    single = tmp_path / "single"
    _copy_run(runs["npu"], single, ranks=(0,))
    cases = [((runs["golden"], empty), f"{empty}/run.json: not a run manifest"),
             ((runs["golden"], missing), f"{missing}: missing rank 1 of a world of 2 (rank1.h5 not found)"),
             ((runs["golden"], single), f"{single}: world size 1, but the golden run {runs['golden']} has 2"),
             ((runs["golden"], runs["npu"] / "rank0.h5"), f"{runs['npu'] / 'rank0.h5'}: is one dump, but the golden")]
    for args, message in cases:
        result = run_cli(command, *args)
        assert result.status == 2, (args, result.stdout)
        assert result.stderr.startswith(f"precision-tool: error: {message}"), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_rank_dump_recorded_as_another_rank_is_refused(runs, run_cli, tmp_path):
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    shutil.copy(runs["npu"] / "rank1.h5", swapped / "rank0.h5")
    shutil.copy(runs["npu"] / "rank0.h5", swapped / "rank1.h5")
    result = run_cli("ranks", swapped)
    assert (result.status, result.stderr.strip()) == (
        2, f"precision-tool: error: {swapped}/rank0.h5: recorded as rank 1, but it is the run's rank0.h5")


def test_ranks_on_something_that_is_not_a_run(run_cli, tmp_path, runs):
    empty = tmp_path / "nothing"
    empty.mkdir()
    result = run_cli("ranks", empty)
    assert (result.status, result.stderr.strip()) == (
        2, f"precision-tool: error: {empty}: no rank dumps in this run directory (expected rank0.h5, rank1.h5, ...)")
    inspect = run_cli("inspect", runs["golden"])
    assert inspect.status == 2 and "is a run of several ranks" in inspect.stderr


def test_the_shell_loads_the_rank_that_diverges_first_or_the_one_asked(runs, run_cli):
    result = run_cli("shell", "--golden", runs["golden"], "--target", runs["fault"], "-c", "vcs -l 1")
    assert result.status == 0, result.stderr
    assert result.stderr.strip() == ("precision-tool shell: runs of 2 ranks: rank 1 loaded (it diverges first: "
                                     "step 0 #18 allreduce/fc1/weight); --rank R loads another")
    assert "Flagged ops (first 1 of 42)" in result.stdout
    asked = run_cli("shell", "--golden", runs["golden"], "--target", runs["fault"], "--rank", "0", "-c", "vcs -l 1")
    assert asked.status == 0 and "rank 0 loaded (as asked)" in asked.stderr and "first 1 of 3)" in asked.stdout
    bad = run_cli("shell", "--golden", runs["golden"], "--target", runs["fault"], "--rank", "2", "-c", "vcs")
    assert (bad.status, bad.stderr.strip()) == (2, "precision-tool: error: --rank 2 is not a rank of the runs' 2")
