"""Outputs through symbolic links, and the error log: every output replaces the file a link names, whole.

One behaviour for every output (`precision_tool.outputs.output_target`): a link at the output's name is kept, the
file it names (through a chain of links) is replaced atomically, and a dangling link gets its file created.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.writes_helpers import build, no_leftovers

ROOT = Path(__file__).resolve().parents[2]
OLD = b"the previous file\n"


@pytest.fixture
def pair(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


def _linked(tmp_path, name: str, *, chain: bool = False, dangling: bool = False) -> tuple[Path, Path]:
    """``tmp_path/out/NAME`` -> ``tmp_path/data/NAME`` (through a second link with ``chain``); the file named holds
    OLD unless ``dangling``."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    target = data / name
    if not dangling:
        target.write_bytes(OLD)
    link = out / name
    if chain:
        middle = out / f"middle-{name}"
        middle.symlink_to(target)
        link.symlink_to(middle.name)
    else:
        link.symlink_to(os.path.relpath(target, out))
    return link, target


def _assert_written_through(link: Path, target: Path, before_link: str) -> None:
    assert link.is_symlink() and os.readlink(link) == before_link, "the link was replaced"
    assert target.is_file() and not target.is_symlink()
    assert target.read_bytes() != OLD, "the file the link names was not replaced"
    assert no_leftovers(link.parent) == [] and no_leftovers(target.parent) == []


@pytest.mark.parametrize("args, name", [
    (("compare", "{g}", "{t}", "-o", "{o}"), "table.txt"),
    (("compare", "{g}", "{t}", "--format", "csv", "-o", "{o}"), "out.csv"),
    (("compare", "{g}", "{t}", "--format", "json", "-o", "{o}"), "out.json"),
    (("compare", "{g}", "{t}", "--plot", "{o}"), "plot.svg"),
    (("check", "{g}", "{t}", "--junit", "{o}"), "junit.xml"),
    (("baseline", "{g}", "{t}", "-o", "{o}"), "base.json"),
], ids=["table", "csv", "json", "plot", "junit", "baseline"])
@pytest.mark.parametrize("chain", [False, True], ids=["link", "chain"])
def test_an_output_that_is_a_link_replaces_the_file_it_names(run_cli, pair, tmp_path, args, name, chain):
    link, target = _linked(tmp_path, name, chain=chain)
    before = os.readlink(link)
    result = run_cli(*(a.format(g=pair[0], t=pair[1], o=link) for a in args))
    assert result.status in (0, 1), result.stderr
    _assert_written_through(link, target, before)


@pytest.mark.parametrize("chain", [False, True], ids=["link", "chain"])
def test_collect_force_over_a_link_replaces_the_dump_it_names_and_keeps_the_link(run_cli, tmp_path, chain):
    link, target = _linked(tmp_path, "golden.h5", chain=chain)
    before = os.readlink(link)
    result = run_cli("collect", "mlp", "--steps", "1", "--device", "golden", "-o", link, "--force")
    assert result.status == 0, result.stderr
    _assert_written_through(link, target, before)
    assert run_cli("inspect", link).status == 0


def test_collect_over_a_link_without_force_is_refused_and_keeps_both(run_cli, tmp_path):
    link, target = _linked(tmp_path, "golden.h5")
    result = run_cli("collect", "mlp", "--steps", "1", "-o", link)
    assert result.status == 2 and "already exists" in result.stderr and len(result.stderr.splitlines()) == 1
    assert link.is_symlink() and target.read_bytes() == OLD


def test_collect_through_a_dangling_link_creates_the_file_it_names(run_cli, tmp_path):
    link, target = _linked(tmp_path, "golden.h5", dangling=True)
    result = run_cli("collect", "mlp", "--steps", "1", "-o", link)
    assert result.status == 0, result.stderr
    assert link.is_symlink() and target.is_file() and run_cli("inspect", target).status == 0


def test_a_run_whose_rank_and_manifest_are_links_keeps_them(run_cli, tmp_path):
    run = tmp_path / "out"
    run.mkdir()
    links = {}
    for name in ("rank0.h5", "run.json"):
        links[name] = _linked(tmp_path, name)
    rank0, manifest = links["rank0.h5"], links["run.json"]
    manifest[1].write_text('{"format": "precision-tool-run", "version": 1, "world_size": 1}')  # (a run's: --force
    # never replaces a run.json of the user's, `test_collect_ranks`)
    result = run_cli("collect", "mlp", "--steps", "1", "--ranks", "2", "-o", run, "--force")
    assert result.status == 0, result.stderr
    for link, target in (rank0, manifest):
        _assert_written_through(link, target, os.readlink(link))
    assert sorted(p.name for p in run.iterdir()) == ["rank0.h5", "rank1.h5", "run.json"]
    assert run_cli("ranks", run).status == 0


def test_a_dump_being_written_through_a_link_is_seen_as_being_written(tmp_path):
    from precision_tool.dump.partial import check_target, partial_path
    from precision_tool.dump.writer import DumpWriter
    from precision_tool.errors import InputError

    link, target = _linked(tmp_path, "golden.h5")
    assert partial_path(link) == f"{target}.partial"
    writer = DumpWriter(link, {"role": "golden"})
    try:
        assert os.path.exists(f"{target}.partial")
        for spelling in (link, target):  # a second writer, through the link or not, finds the one file
            with pytest.raises(InputError, match="is already being written by this process"):
                check_target(spelling, overwrite=True)
            with pytest.raises(InputError, match="is already being written by this process"):
                DumpWriter(spelling, {"role": "golden"})
    finally:
        writer.close()
    assert link.is_symlink() and target.read_bytes() != OLD


# -- the error log ----------------------------------------------------------------------------------------------------
_FAILING = """
import sys
import precision_tool.commands.handlers as handlers

def boom(*args, **kwargs):
    raise RuntimeError("x" * 20000)

handlers.inspect = boom
from precision_tool.cli.main import main
sys.exit(main(["inspect", sys.argv[1]]))
"""


def _log(tmp_path) -> Path:
    return tmp_path / "state" / "precision-tool" / "last-error.log"


def _fail(tmp_path, dump, max_file_bytes=None) -> subprocess.CompletedProcess:
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state"), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", _FAILING, str(dump)], capture_output=True, text=True, env=env,
                          preexec_fn=limit if max_file_bytes else None, timeout=60)


def test_an_error_log_that_cannot_be_written_whole_keeps_the_previous_one(tmp_path, pair):
    log = _log(tmp_path)
    log.parent.mkdir(parents=True)
    log.write_bytes(OLD)
    result = _fail(tmp_path, pair[0], max_file_bytes=4096)  # the traceback is 20 KB: past the limit
    assert result.returncode == 3, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "traceback saved" not in result.stderr, result.stderr
    assert log.read_bytes() == OLD
    assert sorted(p.name for p in log.parent.iterdir()) == ["last-error.log"]


def test_the_error_log_is_written_whole_through_a_link(tmp_path, pair):
    log = _log(tmp_path)
    log.parent.mkdir(parents=True)
    kept = tmp_path / "logs" / "precision-tool.log"
    kept.parent.mkdir()
    kept.write_bytes(OLD)
    log.symlink_to(kept)
    result = _fail(tmp_path, pair[0])
    assert result.returncode == 3 and f"traceback saved to {log}" in result.stderr, result.stderr
    assert log.is_symlink() and kept.read_text().startswith("Traceback") and kept.read_text().rstrip().endswith(
        "RuntimeError: " + "x" * 20000)


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_an_input_link_that_names_no_file_says_why(run_cli, pair, tmp_path, kind):
    """A loop of links was "no such file", although the name it gives exists (a link)."""
    link = tmp_path / "l1.h5"
    if kind == "loop":
        (tmp_path / "l2.h5").symlink_to("l1.h5")
        link.symlink_to("l2.h5")
        says = "a loop of symbolic links (too many levels of symbolic links)"
    else:
        link.symlink_to("gone.h5")
        says = "a symbolic link to gone.h5, which does not exist"
    result = run_cli("compare", pair[0], link)
    assert result.status == 2 and result.stderr == f"precision-tool: error: {link}: {says}\n"
