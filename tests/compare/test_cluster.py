"""Scoring on a Dask cluster (--scheduler): the same report as the local path, from worker processes."""

import subprocess
import sys

import pytest

from precision_tool.collect import collect_to
from precision_tool.compare.comparator import CompareOptions, compare_dumps, compare_sources
from precision_tool.engine.device import golden, npu
from precision_tool.errors import ConfigError
from precision_tool.session import Session, SessionConfig

distributed = pytest.importorskip("distributed", reason="dask.distributed not installed: pip install -e '.[dev]'")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as local:
        yield local


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A golden run and an fp16 npu run with dynamic loss scaling (so gradients carry a scale to divide out)."""
    folder = tmp_path_factory.mktemp("cluster")
    paths = []
    for name, device, scale in (("golden", golden(), None), ("target", npu(precision_mode="force_fp16"),
                                                              "dynamic:1024,2,2")):
        path = folder / f"{name}.h5"
        with collect_to(path) as collector:
            Session(SessionConfig(model="cnn", steps=3, device=device, loss_scale=scale), [collector]).run()
        paths.append(path)
    return paths


def test_the_cluster_report_is_the_local_report(cluster, pair):
    local = compare_dumps(*pair)
    remote = compare_dumps(*pair, CompareOptions(scheduler=cluster.scheduler_address))
    assert len(remote.ops) == len(local.ops) > 100
    assert repr(remote) == repr(local)  # every row, metric and note, NaN included
    assert any(row.loss_scale != 1.0 for op in remote.ops for row in op.rows)


def test_a_client_can_be_passed_in_and_selections_apply(cluster, pair):
    options = {"steps": frozenset({1}), "ops": "*conv*"}
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        remote = compare_dumps(*pair, CompareOptions(scheduler=client, **options))
    local = compare_dumps(*pair, CompareOptions(**options))
    assert repr(remote) == repr(local) and {op.step for op in remote.ops} == {1}


def test_batches_split_the_pairs_evenly_and_in_order():
    from precision_tool.compare.cluster import batches

    assert batches([], [], 2) == []
    sizes = [10] * 16
    assert batches(list(range(16)), sizes, 2) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13],
                                                  [14, 15]]
    assert batches(list(range(3)), [100, 0, 0], 1) == [[0], [1, 2]]  # empty pairs still count as one element


def test_an_in_memory_dump_or_an_unreachable_scheduler_is_a_config_error(pair, monkeypatch):
    from precision_tool.compare import cluster as cluster_module
    from precision_tool.compare.memory import MemoryDump

    with pytest.raises(ConfigError, match="needs the golden dump as a file the workers can open"):
        compare_sources(MemoryDump("g"), MemoryDump("t"), CompareOptions(scheduler="tcp://127.0.0.1:1"))
    monkeypatch.setattr(cluster_module, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:1"):
        compare_dumps(*pair, CompareOptions(scheduler="tcp://127.0.0.1:1"))


def test_without_a_scheduler_nothing_of_dask_is_imported(pair):
    code = ("import sys\nfrom precision_tool.compare.comparator import compare_dumps\n"
            f"compare_dumps({str(pair[0])!r}, {str(pair[1])!r})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_compare_check_and_diagnose_take_scheduler_and_print_what_they_print_locally(cluster, pair, run_cli):
    address = cluster.scheduler_address
    for args in (("compare", "--format", "json", "-l", "0"), ("check", "--format", "json"),
                 ("diagnose", "--format", "json")):
        local = run_cli(args[0], *pair, *args[1:])
        remote = run_cli(args[0], *pair, *args[1:], "--scheduler", address)
        assert (remote.status, remote.stdout) == (local.status, local.stdout), args
        assert remote.stdout
    shell = run_cli("shell", "--golden", pair[0], "--target", pair[1], "-c",
                    f"vcs -l 0 --format json --scheduler {address}")
    assert shell.status == 0 and shell.stdout == run_cli("shell", "--golden", pair[0], "--target", pair[1], "-c",
                                                         "vcs -l 0 --format json").stdout


def test_an_unreachable_scheduler_is_one_line_with_exit_2(pair, run_cli, monkeypatch):
    from precision_tool.compare import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "CONNECT_TIMEOUT_S", 1)
    result = run_cli("compare", *pair, "--scheduler", "tcp://127.0.0.1:1")
    lines = result.stderr.strip().splitlines()
    assert result.status == 2 and len(lines) == 1
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in lines[0]


@pytest.mark.parametrize("address", ["bogus", "", "tcp://127.0.0.1:notaport", "tcp://:8786", "http://host:8786",
                                     "tcp://host:70000"])
def test_an_address_that_is_none_is_a_usage_error_before_any_work(pair, run_cli, address):
    result = run_cli("compare", *pair, "--scheduler", address)
    assert (result.status, result.stdout) == (2, "")  # (exit 3, then a 40 s wait and Dask's traceback before)
    assert result.stderr == (f"precision-tool: error: Invalid value for '--scheduler': {address!r} is not a Dask "
                             "scheduler's address: give tcp://HOST:PORT (scheme one of tcp, tls, ws, wss, ucx, "
                             "inproc) (see 'precision-tool compare --help')\n")


@pytest.mark.parametrize("address", ["tcp://10.0.0.7:8786", "10.0.0.7:8786", "tls://sched.example:443", "inproc://x"])
def test_scheduler_addresses_dask_reads_are_taken(address):
    from precision_tool.compare.cluster import check_address

    assert check_address(address) == address
