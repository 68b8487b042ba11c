"""`ptt.dump` under torch.distributed: a run directory of rank dumps, collectives recorded with their result.

Two real processes in a gloo CPU group train a tiny model (tests/torch/distributed_worker.py) with a manual
``all_reduce`` of the gradients, with DistributedDataParallel, and with one rank skewing its update.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch has no torch.distributed", allow_module_level=True)

from precision_tool.dump.reader import open_dump  # noqa: E402

WORKER = Path(__file__).with_name("distributed_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    workers = [subprocess.Popen([sys.executable, str(WORKER), str(out)], env={**env, "RANK": str(rank)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n".join(outputs)
    return out


def _collectives(run: Path, step: int):
    dumps = [open_dump(run / f"rank{rank}.h5") for rank in range(2)]
    pairs = zip(*([op for op in d.ops(step) if op.type == "c10d.allreduce_"] for d in dumps))
    return dumps, list(pairs)


@pytest.mark.parametrize("mode", ["manual", "ddp"])
def test_each_rank_writes_its_dump_with_rank_and_world_size(runs, mode):
    run = runs / mode
    assert sorted(p.name for p in run.iterdir()) == ["rank0.h5", "rank1.h5", "run.json"]
    manifest = json.loads((run / "run.json").read_text())
    assert (manifest["world_size"], manifest["ranks"], manifest["backend"]) == (2, ["rank0.h5", "rank1.h5"], "gloo")
    for rank in range(2):
        with open_dump(run / f"rank{rank}.h5") as dump:
            assert (dump.metadata["rank"], dump.metadata["world_size"]) == (rank, 2)
            assert len(dump.step_numbers()) == 2


@pytest.mark.parametrize("mode, per_step", [("manual", 4), ("ddp", 1)])  # DDP reduces one bucket
def test_the_recorded_allreduce_output_is_the_sum_over_ranks_of_the_inputs(runs, mode, per_step):
    for step in range(2):
        dumps, pairs = _collectives(runs / mode, step)
        assert len(pairs) == per_step
        for a, b in pairs:
            inputs = [d.tensor(step, op.exec_index, "input_0") for d, op in zip(dumps, (a, b))]
            assert not np.array_equal(*inputs)  # the ranks' own gradients, before the reduction
            for dump, op in zip(dumps, (a, b)):
                assert np.array_equal(dump.tensor(step, op.exec_index, "output_0"), inputs[0] + inputs[1])
        for dump in dumps:
            dump.close()


def test_ranks_finds_a_real_run_consistent_and_a_skewed_one_not(runs, run_cli):
    for mode in ("manual", "ddp"):
        result = run_cli("ranks", runs / mode)
        assert result.status == 0, result.stdout + result.stderr
    skewed = run_cli("ranks", runs / "skewed", "--format", "json")
    assert skewed.status == 1
    first = json.loads(skewed.stdout)["first"]
    # the all-reduce agrees (a sum); rank 1's update is the first thing that differs, at step 0
    assert (first["step"], first["direction"], first["departing"]) == (0, "optimizer", [0, 1])
