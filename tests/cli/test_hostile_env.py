"""Hostile environments and inputs from a second sweep: one line and a documented status, nothing lost or changed.

Standard streams that are full, capped, closed or cannot encode; small JSON files that are FIFOs, devices or
nested past Python's limits; dumps whose tensors need an HDF5 filter that is not there, whose seed is not a
number, or whose attributes are megabytes long; empty folder names. Stream cases run the CLI in a subprocess
of this checkout, since they are about the process's own descriptors.
"""

from __future__ import annotations

import os
import shutil
import resource
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from precision_tool.cli.main import LINE_LIMIT
from tests.faults.writes_helpers import assert_outcome, build, digests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "dump"))
from dumpfakes import write_synthetic  # noqa: E402


def _run(*args, env=None, **options) -> subprocess.CompletedProcess:
    """``python -m precision_tool ARGS`` from this checkout, in a process of its own."""
    environment = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", "PYTHONPATH": str(ROOT), **(env or {})}
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "timeout": 120, **options}
    return subprocess.run([sys.executable, "-m", "precision_tool", *map(str, args)], env=environment, **options)


def _file_size_limit(max_bytes: int):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return limit


@pytest.fixture
def pair(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


# -- standard output --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
def test_a_full_stdout_is_the_users_disk_not_our_bug(pair, unbuffered):
    before = digests(*pair)
    with open("/dev/full", "w") as full:
        result = _run("compare", *pair, "--all", stdout=full, text=True, env={"PYTHONUNBUFFERED": unbuffered})
    assert_outcome(result.returncode, result.stderr, 2, before)
    assert result.stderr == "precision-tool: error: standard output: no space left on device\n"


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
def test_stdout_past_the_file_size_limit_is_never_cut_silently(pair, tmp_path, unbuffered):
    """Unbuffered, Python's text layer dropped what a short write left: exit 0 and a cut JSON document."""
    report = tmp_path / "report.json"
    with open(report, "w") as stream:
        result = _run("compare", *pair, "--all", "--format", "json", stdout=stream, text=True,
                      env={"PYTHONUNBUFFERED": unbuffered}, preexec_fn=_file_size_limit(1024))
    assert result.returncode == 2, result.stderr
    assert result.stderr == "precision-tool: error: standard output: file too large\n"
    assert report.stat().st_size == 1024


def test_characters_stdouts_encoding_lacks_are_replaced(pair):
    result = _run("compare", *pair, env={"PYTHONIOENCODING": "ascii"})
    utf8 = _run("compare", *pair)
    assert result.returncode == utf8.returncode == 0 and result.stderr == b"", result.stderr
    assert not utf8.stdout.isascii()  # the table has characters ASCII lacks ...
    assert result.stdout.isascii() and b"?" in result.stdout  # ... written as "?"
    assert result.stdout.count(b"\n") == utf8.stdout.count(b"\n")


@pytest.mark.parametrize("cmd", ["compare", "diagnose"])
def test_a_terminal_width_of_0_is_ignored(run_cli, pair, monkeypatch, cmd):
    """rich took COLUMNS=0 (a pty of unknown size) as a width of 0: compare and diagnose printed nothing, exit 0."""
    monkeypatch.delenv("COLUMNS", raising=False)
    expected = run_cli(cmd, *pair)
    monkeypatch.setenv("COLUMNS", "0")
    result = run_cli(cmd, *pair)
    assert result.status == expected.status == 0, result.stderr
    assert result.stdout == expected.stdout and len(expected.stdout.splitlines()) > 5


def _close(descriptor: int):
    return lambda: os.close(descriptor)


@pytest.mark.parametrize("args, status", [(("inspect", "{dir}/missing.h5"), 2), (("check", "{golden}", "{target}"), 1),
                                          (("diagnose", "{golden}", "{target}"), 0)],
                         ids=["bad-input", "check-fails", "ok"])
@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_an_unwritable_stderr_keeps_the_exit_status(pair, tmp_path, args, status, stderr):
    """stderr is where a failure is told: when it cannot be written, the command still ends with its own status.
    Before: closed, check's progress line (sys.stderr None) was an internal error; full (/dev/full), a bad
    input exited 1 from the message's own write error."""
    golden, target = pair
    args = [a.format(dir=tmp_path, golden=golden, target=target) for a in args]
    if stderr == "closed":
        result = _run(*args, stderr=None, stdout=subprocess.DEVNULL, preexec_fn=_close(2))
    else:
        with open("/dev/full", "w") as full:
            result = _run(*args, stderr=full, stdout=subprocess.DEVNULL)
    assert result.returncode == status


def test_the_shell_with_stdin_closed_reads_no_commands(pair):
    result = _run("shell", *pair, preexec_fn=_close(0), text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_piped_commands_that_are_not_text_fail_alone(pair):
    """A strict decoder (a UTF-8 locale outside Python's UTF-8 mode) made the whole shell an internal error."""
    result = _run("shell", *pair, input=b"ls\nni fc1\xff\nni fc1/Op\n", env={"PYTHONIOENCODING": "utf-8:strict"})
    errors = result.stderr.decode().splitlines()
    assert result.returncode == 2 and len(errors) == 2, result.stderr
    assert errors[1] == "precision-tool: error: 1 shell command failed"
    assert result.stdout.count(b"fc1/Op") >= 1  # the command after it ran


# -- small JSON files -------------------------------------------------------------------------------------------------
def _fifo(tmp_path):
    os.mkfifo(tmp_path / "mixlist.json")
    return tmp_path / "mixlist.json"


def _written(text):
    def make(tmp_path):
        (tmp_path / "mixlist.json").write_text(text)
        return tmp_path / "mixlist.json"
    return make


JSON_FILES = {  # name -> (make, what the line says); before: a hang, memory until killed, internal errors
    "a FIFO": (_fifo, "not a regular file"),
    "/dev/zero": (lambda tmp_path: Path("/dev/zero"), "not a regular file"),
    "arrays nested 100,000 deep": (_written("[" * 100_000 + "]" * 100_000), "not valid JSON: maximum recursion"),
    "a 5000-digit number": (_written('{"white-list": ' + "9" * 5000 + "}"), "not valid JSON: Exceeds the limit"),
}


@pytest.mark.parametrize("option", ["--modify-mixlist", "--boost-config"])
@pytest.mark.parametrize("name", list(JSON_FILES))
def test_a_hostile_json_file_is_one_line(tmp_path, option, name):
    make, says = JSON_FILES[name]
    path = make(tmp_path)
    extra = ("--boost-level", "O1") if option == "--boost-config" else ()
    result = _run("collect", "mlp", "--steps", "1", "-o", tmp_path / "out.h5", option, path, *extra, text=True,
                  timeout=60)
    assert_outcome(result.returncode, result.stderr, 2, {}, says=f"{path}: {says}")
    assert not (tmp_path / "out.h5").exists()


def test_a_json_file_with_a_byte_order_mark_is_read(run_cli, tmp_path):
    """Windows editors start UTF-8 files with a BOM: before, "not valid JSON: Unexpected UTF-8 BOM"."""
    switch = tmp_path / "fusion_switch.cfg"
    switch.write_bytes(b'\xef\xbb\xbf{"GraphFusion": {"LayerNormFusionPass": "off"}}')
    result = run_cli("collect", "sensor", "--steps", "1", "-o", tmp_path / "run.h5", "--fusion-switch", switch)
    assert result.status == 0, result.stderr
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert f.attrs["fusion_switch"] == '{"all_off":false,"off":["LayerNormFusionPass"]}'


# -- dumps ------------------------------------------------------------------------------------------------------------
UNKNOWN_FILTER = 300  # in the range HDF5 keeps for testing: registered by no library


def _filtered(path, dataset_path: str) -> None:
    """Rewrite ``dataset_path`` chunked behind a filter HDF5 does not have, its bytes unchanged."""
    with h5py.File(path, "r+") as f:
        data = f[dataset_path][()]
        attrs = dict(f[dataset_path].attrs)
        del f[dataset_path]
        dataset = f.create_dataset(dataset_path, shape=data.shape, dtype=data.dtype, chunks=data.shape or None,
                                   compression=UNKNOWN_FILTER, allow_unknown_filter=True)
        dataset.id.write_direct_chunk((0,) * data.ndim, data.tobytes())
        for key, value in attrs.items():
            dataset.attrs[key] = value


def _first(f, kind: str) -> str:
    """The first pack (kind "pack") or tensor dataset of its own ("dataset") in ``f``."""
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return next(name for name in names if ("/packs/" if kind == "pack" else "/ops/") in name)


@pytest.mark.parametrize("kind", ["pack", "dataset"])
@pytest.mark.parametrize("cmd", ["compare", "check", "diagnose"])
def test_a_tensor_behind_a_filter_hdf5_lacks_is_bad_input(run_cli, tmp_path, kind, cmd):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    pack_limit = 1 << 20 if kind == "pack" else -1
    write_synthetic(golden, steps=1, metadata={"role": "golden"}, pack_limit=pack_limit)
    write_synthetic(target, steps=1, pack_limit=pack_limit)
    with h5py.File(target, "r") as f:
        where = _first(f, kind)
    assert not h5py.h5z.filter_avail(UNKNOWN_FILTER)
    _filtered(target, where)
    before = digests(golden, target)
    result = run_cli(cmd, golden, target)
    assert_outcome(result.status, result.stderr, 2, before,
                   says=f"{target}: /{where}: unreadable (compressed with HDF5 filter {UNKNOWN_FILTER}, "
                        "which this HDF5 does not have)")


@pytest.mark.parametrize("seed", [np.nan, "zero", 1.5])
def test_a_seed_that_is_not_a_whole_number_is_bad_input(run_cli, tmp_path, seed):
    """diagnose replays ops seeded with it: before, int(nan) was an internal error."""
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    write_synthetic(golden, steps=1, metadata={"role": "golden"})
    write_synthetic(target, steps=1)
    with h5py.File(target, "r+") as f:
        f.attrs["seed"] = seed
    before = digests(golden, target)
    result = run_cli("diagnose", golden, target)
    assert_outcome(result.status, result.stderr, 2, before, says=f"{target}: / attribute seed: {seed!r} is not a "
                                                                 "whole number")


def test_a_megabyte_attribute_is_cut_in_the_error_line(run_cli, tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    write_synthetic(golden, steps=1, metadata={"role": "golden"})
    write_synthetic(target, steps=1, metadata={"model": "m" * 1_000_000})
    result = run_cli("diagnose", golden, target)
    assert_outcome(result.status, result.stderr, 2, {}, says="the dumps are of different models")
    line = result.stderr.rstrip("\n")
    assert line == (f"precision-tool: error: the dumps are of different models: golden 'synthetic' ({golden}), "
                    f"target '{'m' * 200}... (1000000 characters)' ({target})")


# -- folder names -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("demo", "--workdir", ""), ("zoom", "mlp", "--steps", "1", "-o", ""),
                                  ("replay", "nowhere", "--step", "0", "-o", ""),
                                  ("collect", "mlp", "--steps", "1", "-o", "x.h5", "--save-steps", "1",
                                   "--checkpoint-dir", "")], ids=["demo", "zoom", "replay", "collect"])
def test_an_empty_folder_name_is_refused_and_nothing_is_written(run_cli, tmp_path, monkeypatch, args):
    """An empty name is the current folder to pathlib: zoom -o "" wrote its stats dumps there, exit 0."""
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert_outcome(result.status, result.stderr, 2, {}, says="the folder name is empty")
    assert list(tmp_path.iterdir()) == []


# -- option values --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("compare", "{golden}", "{target}", "--steps", "0-100000000000"),
                                  ("shell", "{golden}", "{target}", "-c", "vcs --steps 5,0-100000000000"),
                                  ("collect", "mlp", "--steps", "1", "-o", "{dir}/out.h5",
                                   "--dump-steps", "0-100000000000")], ids=["compare", "shell", "collect"])
def test_a_step_range_wider_than_memory_is_refused(run_cli, pair, tmp_path, args):
    """A selection is a set of step numbers: before, each of these was killed by the kernel (exit 137)."""
    golden, target = pair
    before = digests(*pair)
    result = run_cli(*(a.format(golden=golden, target=target, dir=tmp_path) for a in args))
    assert_outcome(result.status, result.stderr, 2, before, lines=2 if args[0] == "shell" else 1,
                   says="names more than 1,000,000 steps; leave the option out to take every step")
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("option", ["-o", "--plot", "--junit"])
def test_an_output_name_ending_in_a_slash_never_replaces_the_file_without_it(run_cli, pair, tmp_path, option):
    """Path() drops the slash: `-o mine.csv/` replaced the user's mine.csv and exited 0."""
    golden, target = pair
    mine = tmp_path / {"-o": "mine.csv", "--plot": "mine.svg", "--junit": "mine.xml"}[option]
    mine.write_text("my notes\n")
    command = ("check", golden, target) if option == "--junit" else ("compare", golden, target, "--format", "csv")
    before = digests(golden, target, mine)
    result = run_cli(*command, option, f"{mine}/")
    assert_outcome(result.status, result.stderr, 2, before,
                   says=f"{mine}/: ends with '/', which names a folder; give a file name")


# -- checkpoints and model files --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """ckpt-00000001.h5 .. ckpt-00000003.h5 of a 3-step npu mlp run."""
    from precision_tool.cli.main import main

    folder = tmp_path_factory.mktemp("ckpt")
    assert main(["collect", "mlp", "--steps", "3", "--save-steps", "1", "--checkpoint-dir", str(folder / "ck"),
                 "-o", str(folder / "run.h5")]) == 0
    return folder / "ck"


def _attribute(key, value):
    return lambda f: f.attrs.__setitem__(key, value)


def _dataset(key, value):
    def change(f):
        del f[key]
        f[key] = value
    return change


def _device_list(f):
    import json

    config = json.loads(f.attrs["config"])
    config["device"] = [1]
    f.attrs["config"] = json.dumps(config)


CHECKPOINT_DAMAGES = {  # name -> (change, the line); before, each was an internal error (exit 3)
    "config nested 100,000 deep": (_attribute("config", "[" * 100_000 + "]" * 100_000),
                                   "attribute 'config' is missing or not JSON"),
    "config a list": (_attribute("config", "[1]"), "attribute 'config' is list, not a JSON object"),
    "device a list": (_device_list, "attribute 'config': its device is not a JSON object"),
    "step -5": (_attribute("step", -5), "attribute 'step': -5 is not a whole number >= 0"),
    "evaluations an object": (_attribute("evaluations", '{"a": 1}'),
                              "attribute 'evaluations' is dict, not a JSON list"),
    "optimizer state unknown": (_attribute("optimizer", '{"velocity": 5}'),
                                "its saved state cannot be restored (AttributeError"),
    "batch of another shape": (_dataset("inputs/x", np.zeros((2, 2), np.float32)),
                               "its saved batch 'x' is float32 (2, 2); the model takes float32 (N, 16)"),
    "labels past the classes": (_dataset("inputs/labels", np.full(32, 10**6)),
                                "its saved batch 'labels' holds values outside 0..3"),
}


# a resumed run trains on batches of its own: only a replay reads the saved one
CHECKPOINT_CASES = [(cmd, name) for name in CHECKPOINT_DAMAGES for cmd in ("replay", "resume")
                    if cmd == "replay" or not name.startswith(("batch", "labels"))]


@pytest.mark.parametrize("cmd, name", CHECKPOINT_CASES, ids=[f"{c}-{n.replace(' ', '_')}" for c, n in CHECKPOINT_CASES])
def test_a_damaged_checkpoint_is_one_line(run_cli, checkpoints, tmp_path, cmd, name):
    change, says = CHECKPOINT_DAMAGES[name]
    folder = tmp_path / "ck"
    shutil.copytree(checkpoints, folder)
    for path in folder.iterdir():
        with h5py.File(path, "r+") as f:
            change(f)
    before = digests(*folder.iterdir())
    args = (("replay", folder, "--step", "2", "-o", tmp_path / "out") if cmd == "replay" else
            ("collect", "mlp", "--steps", "3", "--checkpoint-dir", folder, "--if-load", "-o", tmp_path / "run.h5"))
    result = run_cli(*args)
    assert_outcome(result.status, result.stderr, 2, before, says=f"{folder}/ckpt-0000000")
    assert says in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "run.h5").exists()  # (replay left an empty out/)


@pytest.mark.parametrize("source, says", [
    ("import sys\nsys.exit(5)\n", "model.py: called exit(5) while being imported"),
    ("def make():\n    raise SystemExit(0)\n", "model.py: make() called exit(0) instead of returning a model")],
    ids=["import", "factory"])
def test_a_model_file_that_exits_is_one_line(run_cli, tmp_path, source, says):
    """Before: the process took the model's status (5, or 0 with no dump and nothing said)."""
    (tmp_path / "model.py").write_text(source)
    result = run_cli("collect", f"{tmp_path}/model.py:make", "--steps", "1", "-o", tmp_path / "run.h5")
    assert_outcome(result.status, result.stderr, 2, {}, says=says)
    assert not (tmp_path / "run.h5").exists()
