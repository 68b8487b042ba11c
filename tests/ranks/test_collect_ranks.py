"""`collect --ranks N`: each rank its shard, gradients all-reduced (mean) in a recorded op, identical updates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from precision_tool.collect.ranks import mean_over_ranks
from precision_tool.dump.reader import open_dump
from tests.ranks.conftest import STEPS


def _dumps(run):
    return [open_dump(run / f"rank{rank}.h5") for rank in range(2)]


def _ops(dump, step, kind):
    return [op for op in dump.ops(step) if (op.type == "AllReduce" if kind == "allreduce" else op.direction == kind)]


def test_every_rank_dump_says_its_rank_and_world_size(runs):
    for rank, dump in enumerate(_dumps(runs["golden"])):
        with dump:
            meta = dump.metadata
            assert (meta["rank"], meta["world_size"], meta["batch_size"], meta["global_batch_size"]) == (rank, 2, 16, 32)
            assert len(dump.step_numbers()) == STEPS


def test_the_allreduce_output_is_the_mean_of_the_ranks_inputs_exactly(runs):
    d0, d1 = _dumps(runs["npu"])
    with d0, d1:
        for step in range(STEPS):
            ops0, ops1 = _ops(d0, step, "allreduce"), _ops(d1, step, "allreduce")
            assert [op.name for op in ops0] == [f"allreduce/{p}" for p in d0.metadata["parameters"]]
            for a, b in zip(ops0, ops1):
                assert a.direction == "backward" and a.exec_index == b.exec_index
                inputs = [d0.tensor(step, a.exec_index, "input_0"), d1.tensor(step, b.exec_index, "input_0")]
                assert not np.array_equal(*inputs)  # each rank its own shard
                expected = (inputs[0] + inputs[1]) / np.float32(2)
                assert np.array_equal(d0.tensor(step, a.exec_index, "output_0"), expected)
                assert np.array_equal(d1.tensor(step, b.exec_index, "output_0"), expected)


def test_every_rank_applies_the_same_update(runs):
    d0, d1 = _dumps(runs["npu"])
    with d0, d1:
        for step in range(STEPS):
            for a, b in zip(_ops(d0, step, "optimizer"), _ops(d1, step, "optimizer")):
                for slot in ("input_0", "output_0"):
                    assert np.array_equal(d0.tensor(step, a.exec_index, slot), d1.tensor(step, b.exec_index, slot))


def test_the_shards_are_the_rows_of_the_single_rank_batch(runs):
    from precision_tool.session.data import SyntheticData
    from precision_tool.session.models import load_model

    model = load_model("mlp", np.random.default_rng(0)).model
    whole = SyntheticData(model.data, 0, 32).batch(1)["x"]
    d0, d1 = _dumps(runs["golden"])
    with d0, d1:
        first = [next(op for op in d.ops(1) if op.direction == "forward") for d in (d0, d1)]
        x = [d.tensor(1, op.exec_index, "input_0") for d, op in zip((d0, d1), first)]
    assert np.array_equal(np.concatenate(x), whole)


def test_the_planted_fault_rank_keeps_its_own_gradient(runs):
    d0, d1 = _dumps(runs["fault"])
    with d0, d1:
        a, b = _ops(d0, 0, "allreduce")[0], _ops(d1, 0, "allreduce")[0]
        g0, g1 = d0.tensor(0, a.exec_index, "input_0"), d1.tensor(0, b.exec_index, "input_0")
        assert np.array_equal(d0.tensor(0, a.exec_index, "output_0"), (g0 + g1) / np.float32(2))
        assert np.array_equal(d1.tensor(0, b.exec_index, "output_0"), g1)


def test_mean_over_ranks_sums_in_rank_order_in_float32():
    a, b, c = (np.array([v], dtype=np.float32) for v in (1e8, 1.0, -1e8))
    assert mean_over_ranks([a, b, c])[0] == np.float32(0.0)  # (1e8 + 1) rounds to 1e8 in float32 first
    assert mean_over_ranks([a, c, b])[0] == np.float32(1.0) / np.float32(3)


def test_a_batch_the_ranks_do_not_divide_is_a_usage_error(tmp_path, run_cli):
    result = run_cli("collect", "mlp", "--ranks", "3", "--steps", "1", "-o", tmp_path / "run")
    assert result.status == 2
    assert result.stderr.strip() == ("precision-tool: error: --ranks 3 does not divide the batch of 32 rows; "
                                     "give --batch-size a multiple of 3")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (("--fault-rank", "1"), "--fault-rank needs --ranks"),
    (("--ranks", "2", "--fault-rank", "2"), "--fault-rank 2 is not a rank of 2"),
    (("--ranks", "2", "--checkpoint-dir", "ck"), "--checkpoint-dir is not supported with --ranks yet"),
])
def test_rank_options_are_checked_before_any_work(tmp_path, run_cli, args, message):
    result = run_cli("collect", "mlp", "--steps", "1", "-o", tmp_path / "run", *args)
    assert (result.status, result.stderr.strip()) == (2, f"precision-tool: error: {message}")


def test_an_existing_run_is_kept_without_force(tmp_path, run_cli):
    assert run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", tmp_path / "run").status == 0
    again = run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", tmp_path / "run")
    assert again.status == 2 and "rank0.h5" in again.stderr and "Traceback" not in again.stderr
    assert run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", tmp_path / "run", "--force").status == 0


class _StopAt:
    """A hook raising KeyboardInterrupt when a step begins, as StopOnInterrupt does after Ctrl-C."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, step) -> None:
        if step == self.step:
            raise KeyboardInterrupt


def test_an_interrupted_run_stops_every_rank_and_keeps_their_finished_steps(tmp_path):
    from precision_tool.collect.run import CollectRequest, plan_collect, run_collect

    plan = plan_collect(CollectRequest(model="mlp", output=str(tmp_path / "run"), steps=4, ranks=2))
    with pytest.raises(KeyboardInterrupt):
        run_collect(plan, hooks=[_StopAt(2)])
    for rank in range(2):
        with open_dump(tmp_path / "run" / f"rank{rank}.h5") as dump:
            assert (dump.complete, dump.step_numbers()) == (False, [0, 1])


def test_a_stats_run_is_checked_by_its_statistics(tmp_path, run_cli):
    assert run_cli("collect", "mlp", "--ranks", "2", "--steps", "2", "--mode", "stats", "-o", tmp_path / "s").status == 0
    assert run_cli("ranks", tmp_path / "s").status == 0
    faulty = run_cli("collect", "mlp", "--ranks", "2", "--steps", "2", "--mode", "stats", "--fault-rank", "0",
                     "-o", tmp_path / "f")
    assert faulty.status == 0
    result = run_cli("ranks", tmp_path / "f", "--format", "json")
    assert result.status == 1
    import json

    first = json.loads(result.stdout)["first"]
    assert (first["step"], first["op"], first["departing"], first["max_abs_diff"]) == \
        (0, "allreduce/fc1/weight", [0, 1], None)  # statistics alone cannot tell which of two ranks is wrong


def test_a_directory_holding_a_run_is_refused_before_anything_is_written(tmp_path, run_cli):
    run = tmp_path / "results"
    run.mkdir()
    (run / "run.json").write_text('{"my": "results"}')  # a file of the user's, named as a manifest is
    result = run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", run)
    assert (result.status, result.stderr) == (2, f"precision-tool: error: {run}: holds a run already (run.json, rank "
                                                 "dumps); write elsewhere, or replace it with --force\n")
    forced = run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", run, "--force")
    assert (forced.status, forced.stderr) == (2, f"precision-tool: error: {run / 'run.json'}: not a run manifest (no "
                                                 "\"format\": \"precision-tool-run\"): not replaced, --force or not\n")
    assert sorted(p.name for p in run.iterdir()) == ["run.json"] and (run / "run.json").read_text() == \
        '{"my": "results"}'


def test_force_over_a_larger_run_leaves_the_smaller_run_alone_readable(tmp_path, run_cli):
    run = tmp_path / "run"
    assert run_cli("collect", "mlp", "--ranks", "4", "--steps", "1", "-o", run).status == 0
    assert run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", run, "--force").status == 0
    assert sorted(p.name for p in run.iterdir()) == ["rank0.h5", "rank1.h5", "run.json"]
    assert json.loads((run / "run.json").read_text())["world_size"] == 2
    assert run_cli("ranks", run).status == 0


@pytest.mark.parametrize("ranks", [2, 4])  # (4: ranks 2 and 3 had no earlier dump to keep: theirs go back too)
def test_an_interrupted_run_over_a_finished_one_keeps_that_run_whole(tmp_path, run_cli, ranks):
    from precision_tool.collect.run import CollectRequest, plan_collect, run_collect

    run = tmp_path / "run"
    assert run_cli("collect", "mlp", "--ranks", "2", "--steps", "1", "-o", run).status == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    plan = plan_collect(CollectRequest(model="mlp", output=str(run), steps=4, ranks=ranks, overwrite=True))
    with pytest.raises(KeyboardInterrupt):
        run_collect(plan, hooks=[_StopAt(2)])
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.suffix != ".partial"} == before
    assert sorted(p.name for p in run.iterdir() if p.suffix == ".partial") == \
        [f"rank{r}.h5.partial" for r in range(ranks)]
    assert run_cli("ranks", run).status == 0
