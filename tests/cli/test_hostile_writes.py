"""Hostile write paths: every output is refused in one line (exit 2) or written whole, and no input is touched.

The cases the fault suite (`tests/faults/test_writes_*.py`) does not cover: the files of an input run
directory, checkpoints, empty, long, undecodable and unprintable names, folders that cannot be made, special
files, the shell's history, and SIGTERM. Signal cases run the CLI in a subprocess of this checkout.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.writes_helpers import assert_outcome, build, digests, no_leftovers

ROOT = Path(__file__).resolve().parents[2]
LONG = "n" * 300  # longer than any file system's 255-byte name


def _cli(*args, **options) -> subprocess.Popen:
    """``python -m precision_tool ARGS`` from this checkout (not an installed copy)."""
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **options}
    return subprocess.Popen([sys.executable, "-m", "precision_tool", *map(str, args)], env=env, text=True,
                            **options)


@pytest.fixture
def pair(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of two ranks each (rank0.h5, rank1.h5, run.json)."""
    from precision_tool.cli.main import main

    folder = tmp_path_factory.mktemp("runs")
    for name, device in (("golden", "golden"), ("target", "npu")):
        assert main(["collect", "mlp", "--steps", "1", "--ranks", "2", "--device", device,
                     "-o", str(folder / name)]) == 0
    return folder / "golden", folder / "target"


# -- outputs over inputs --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, victim", [
    (("compare", "{g}", "{t}", "-o", "{g}/rank0.h5"), "{g}/rank0.h5"),
    (("compare", "{g}", "{t}", "--format", "csv", "-o", "{t}/run.json"), "{t}/run.json"),
    (("compare", "{g}", "{t}", "--format", "json", "-o", "{t}/../target/rank1.h5"), "{t}/rank1.h5"),
    (("compare", "{g}", "{t}", "--plot", "{link}"), "{g}/rank1.h5"),
    (("check", "{g}", "{t}", "--junit", "{g}/run.json"), "{g}/run.json"),
], ids=["table-over-rank", "csv-over-manifest", "json-through-dotdot", "plot-hard-link", "junit-over-manifest"])
def test_an_output_that_is_a_file_of_an_input_run_is_refused(run_cli, runs, tmp_path, args, victim):
    golden, target = runs
    files = sorted([*golden.iterdir(), *target.iterdir()])
    link = tmp_path / "rank1.svg"
    os.link(golden / "rank1.h5", link)
    names = {"g": golden, "t": target, "link": link}
    before = digests(*files)
    result = run_cli(*(a.format(**names) for a in args))
    assert_outcome(result.status, result.stderr, 2, before, says="is an input of this command")
    assert os.path.basename(victim.format(**names)) in result.stderr
    assert sorted([*golden.iterdir(), *target.iterdir()]) == files


def test_the_shell_over_runs_never_writes_over_a_rank_it_did_not_load(run_cli, runs):
    golden, target = runs
    files = sorted([*golden.iterdir(), *target.iterdir()])
    before = digests(*files)
    result = run_cli("shell", "--golden", golden, "--target", target, "--rank", "0",
                     "-c", f"vcs -o {golden}/rank1.h5; vcs --format csv -o {target}/run.json")
    assert_outcome(result.status, result.stderr, 2, before, lines=4, says="is an input of this command")
    assert result.stderr.count("is an input of this command") == 2 and "rank1.h5" in result.stderr
    assert sorted([*golden.iterdir(), *target.iterdir()]) == files


def test_a_new_file_in_an_input_run_is_written(run_cli, runs):
    golden, target = runs
    out = target / "report.csv"
    try:
        result = run_cli("compare", golden, target, "--format", "csv", "-o", out)
        assert result.status == 0 and out.read_text().startswith("rank,")
    finally:
        out.unlink(missing_ok=True)


@pytest.fixture
def checkpoints(run_cli, tmp_path):
    folder = tmp_path / "ck"
    assert run_cli("collect", "mlp", "--steps", "2", "--save-steps", "1", "--checkpoint-dir", folder,
                   "-o", tmp_path / "first.h5").status == 0
    return folder


@pytest.mark.parametrize("output", ["{ck}/ckpt-00000002.h5", "{ck}/../ck/ckpt-00000007.h5", "{link}"],
                         ids=["existing", "new-name-through-dotdot", "hard-link"])
def test_collect_never_writes_its_dump_over_a_checkpoint(run_cli, checkpoints, tmp_path, output):
    link = tmp_path / "resume.h5"
    os.link(checkpoints / "ckpt-00000001.h5", link)
    before = digests(*checkpoints.iterdir())
    out = output.format(ck=checkpoints, link=link)
    result = run_cli("collect", "mlp", "--steps", "3", "--save-steps", "1", "--checkpoint-dir", checkpoints,
                     "--if-load", "-o", out, "--force")
    assert_outcome(result.status, result.stderr, 2, before, says="checkpoint")
    assert out in result.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-00000001.h5", "ckpt-00000002.h5"]


def test_collect_refuses_a_dump_and_checkpoints_at_one_path(run_cli, tmp_path):
    result = run_cli("collect", "mlp", "--steps", "2", "--save-steps", "1", "--checkpoint-dir", tmp_path / "run",
                     "-o", tmp_path / "run")
    assert_outcome(result.status, result.stderr, 2, {}, says="-o and --checkpoint-dir both name")
    assert list(tmp_path.iterdir()) == []  # before: the whole run, then run.partial left beside run/


# -- names ------------------------------------------------------------------------------------------------------------
def test_an_empty_output_name_is_refused_before_any_work(run_cli, pair, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = digests(*pair)
    for args in (("compare", *pair, "--format", "csv", "-o", ""), ("baseline", *pair, "-o", ""),
                 ("collect", "mlp", "--steps", "1", "-o", "")):
        result = run_cli(*args)
        assert_outcome(result.status, result.stderr, 2, before, says="the output file name is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.h5", "target.h5"]  # no '.partial'


def test_a_name_of_250_bytes_is_written_and_one_too_long_is_one_line(run_cli, pair, tmp_path):
    before = digests(*pair)
    fits = tmp_path / ("y" * 250)
    result = run_cli("compare", *pair, "--format", "csv", "-o", fits)
    assert_outcome(result.status, result.stderr, 0, before, says="wrote")
    assert fits.read_text().startswith("status,")
    for args in (("compare", *pair, "--format", "csv", "-o", tmp_path / LONG),
                 ("compare", *pair, "--plot", tmp_path / f"{LONG}.svg"),
                 ("check", *pair, "--min-cosine", "-1", "--junit", tmp_path / LONG),
                 ("collect", "mlp", "--steps", "1", "-o", tmp_path / LONG),
                 ("collect", "mlp", "--steps", "1", "--ranks", "2", "-o", tmp_path / LONG),
                 ("zoom", "mlp", "--steps", "1", "-o", tmp_path / LONG),
                 ("demo", "--steps", "1", "--workdir", tmp_path / LONG)):
        result = run_cli(*args)
        assert_outcome(result.status, result.stderr, 2, before, says="file name too long")
        assert result.stdout == ""
    assert no_leftovers(tmp_path) == []


def test_unprintable_names_are_shown_escaped_on_one_line(run_cli, pair, tmp_path):
    before = digests(*pair)
    odd = tmp_path / "new\nline\x1b[31m.csv"
    result = run_cli("compare", *pair, "--format", "csv", "-o", odd)
    assert_outcome(result.status, result.stderr, 0, before, says="new\\nline\\x1b[31m.csv")
    assert odd.read_text().startswith("status,")
    result = run_cli("compare", *pair, "--format", "csv", "-o", tmp_path / "no\nfolder" / "x.csv")
    assert_outcome(result.status, result.stderr, 2, before, says="no\\nfolder/x.csv: cannot write: no such file")


@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes")
def test_collect_to_a_name_that_is_not_utf8(run_cli, tmp_path):
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xff.h5")
    result = run_cli("collect", "mlp", "--steps", "1", "-o", out)
    assert result.status == 0, result.stderr
    from precision_tool.dump.reader import open_dump

    with open_dump(out) as dump:
        assert dump.complete and "bad\\xff.h5" in dump.metadata["command"]
    assert no_leftovers(tmp_path) == []


# -- folders and special files ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, bad, says", [
    (("zoom", "mlp", "--steps", "1", "-o"), "{file}/sub", "cannot create the folder: not a directory"),
    (("zoom", "mlp", "--steps", "1", "-o"), "{dangling}", "a symbolic link to {target}, which does not exist"),
    (("demo", "--steps", "1", "--workdir"), "{file}/sub", "cannot create the demo's directory: not a directory"),
    (("demo", "--steps", "1", "--workdir"), "{dangling}", "a symbolic link to {target}, which does not exist"),
    (("collect", "mlp", "--steps", "1", "--ranks", "2", "-o"), "{file}/sub", "cannot create the run directory"),
    (("collect", "mlp", "--steps", "1", "--ranks", "2", "-o"), "{dangling}",
     "cannot create the run directory: it is a symbolic link to {target}, which does not exist"),
], ids=["zoom-under-a-file", "zoom-dangling-link", "demo-under-a-file", "demo-dangling-link",
        "collect-ranks-under-a-file", "collect-ranks-dangling-link"])
def test_a_folder_that_cannot_be_made_is_one_line(run_cli, pair, tmp_path, args, bad, says):
    target = tmp_path / "missing" / "folder"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(target)
    before = digests(*pair)
    result = run_cli(*args, bad.format(file=pair[0], dangling=dangling))
    assert_outcome(result.status, result.stderr, 2, before, says=says.format(target=target))
    assert result.stdout == ""  # demo says nothing of a run that cannot start
    assert os.path.islink(dangling) and not (tmp_path / "missing").exists()


@pytest.fixture
def read_only(tmp_path):
    """A folder holding ``old.csv`` that cannot be written: a read-only tmpfs as root, else mode 0555."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        (folder / "old.csv").write_text("old\n")
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("root cannot mount a read-only tmpfs here")
    try:
        (folder / "old.csv").write_text("old\n")
        assert subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True).returncode == 0
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.parametrize("args", [
    ("compare", "{g}", "{t}", "--format", "csv", "-o", "{ro}/old.csv"),
    ("compare", "{g}", "{t}", "--plot", "{ro}/new.svg"),
    ("baseline", "{g}", "{t}", "-o", "{ro}/new.json"),
    ("collect", "mlp", "--steps", "1", "-o", "{ro}/new.h5"),
    ("collect", "mlp", "--steps", "1", "--ranks", "2", "-o", "{ro}/run"),
    ("zoom", "mlp", "--steps", "1", "-o", "{ro}/zoom"),
    ("demo", "--steps", "1", "--workdir", "{ro}/demo"),
], ids=["csv-over-old", "plot", "baseline", "collect", "collect-ranks", "zoom", "demo"])
def test_a_read_only_folder_is_one_line_and_keeps_what_it_holds(run_cli, pair, read_only, args):
    before = digests(*pair, read_only / "old.csv")
    result = run_cli(*(a.format(g=pair[0], t=pair[1], ro=read_only) for a in args))
    reason = "read-only file system" if os.geteuid() == 0 else "permission denied"
    if "old.csv" in args[-1]:
        reason = "is not writable"  # click's own check of -o: a file that is there but cannot be written
    assert_outcome(result.status, result.stderr, 2, before, says=reason)
    assert f"{read_only}/" in result.stderr
    assert sorted(p.name for p in read_only.iterdir()) == ["old.csv"]


def test_collect_never_renames_a_dump_over_a_fifo_or_a_device(run_cli, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    specials = [fifo]
    try:  # a copy of /dev/null (root only): never the real one, which a regression would replace
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        specials.append(tmp_path / "null")
    except (OSError, AttributeError):
        pass
    for out in specials:
        result = run_cli("collect", "mlp", "--steps", "1", "-o", out, "--force")
        assert_outcome(result.status, result.stderr, 2, {}, says="is not a regular file")
        assert not stat.S_ISREG(os.stat(out).st_mode)
    assert no_leftovers(tmp_path) == []


def test_an_interrupted_output_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    from precision_tool.outputs import replacing

    out = tmp_path / "out.csv"
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with replacing(out) as temporary:
            temporary.write_text("half")
            raise KeyboardInterrupt
    assert out.read_text() == "old\n" and no_leftovers(tmp_path) == []


def test_dev_stdout_is_written_to_what_stdout_is_never_replaced(pair, tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("an earlier line\n")
    with open(log, "a") as appended:  # `>> log.txt`
        proc = _cli("compare", *pair, "--all", "--format", "csv", "-o", "/dev/stdout", stdout=appended)
        _, err = proc.communicate(timeout=60)
    assert_outcome(proc.returncode, err, 0, digests(*pair), says="wrote /dev/stdout")
    text = log.read_text()
    assert text.startswith("an earlier line\nstatus,step,") and text.count("\n") > 10
    piped = _cli("compare", *pair, "--all", "--format", "csv", "-o", "/dev/fd/1")  # a pipe: no file has its name
    out, err = piped.communicate(timeout=60)
    assert piped.returncode == 0 and out == text[len("an earlier line\n"):], err
    assert no_leftovers(tmp_path) == []


def test_a_loop_of_links_as_output_is_one_line(run_cli, pair, tmp_path):
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    result = run_cli("compare", *pair, "--format", "csv", "-o", loop)
    assert_outcome(result.status, result.stderr, 2, digests(*pair), says="too many levels of symbolic links")
    assert os.path.islink(loop)


@pytest.mark.parametrize("code, says", [
    ("ENOSPC", "error: run/rank0.h5: no space left on device"),
    ("EMFILE", "error: run/rank0.h5: too many open files (this process may open {limit}; raise it with ulimit -n)"),
], ids=["full-disk", "open-files-limit"])
def test_a_file_system_refusal_reaching_the_boundary_is_one_line(run_cli, monkeypatch, tmp_path, code, says):
    import errno
    import resource

    monkeypatch.chdir(tmp_path)
    def refuse(*args, **kwargs):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), "run/rank0.h5")

    monkeypatch.setattr("precision_tool.cli.collect.run_with_progress", refuse)
    result = run_cli("collect", "mlp", "--steps", "1", "--ranks", "2", "-o", "run")
    says = says.format(limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    assert_outcome(result.status, result.stderr, 2, {}, says=says)


@pytest.mark.parametrize("script, says", [("raise SystemExit(3)", "exited with status 3 in the stats phase"),
                                          ("pass", "wrote no stats-golden.h5 in the stats phase"),
                                          # (Python stops itself with SIGINT: status -2, which it said)
                                          ("raise KeyboardInterrupt", "was interrupted (SIGINT) in the stats phase")],
                         ids=["script-fails", "script-writes-nothing", "script-interrupted"])
def test_zoom_force_keeps_the_previous_dumps_when_the_script_fails(run_cli, tmp_path, script, says):
    folder = tmp_path / "zoom"
    folder.mkdir()
    old = [build(folder / f"{phase}-{role}.h5", role=role) for phase in ("stats", "zoom")
           for role in ("golden", "target")]
    (tmp_path / "train.py").write_text(script + "\n")
    before = digests(*old)
    result = run_cli("zoom", "-o", folder, "--force", "--", sys.executable, tmp_path / "train.py")
    assert_outcome(result.status, result.stderr, 2, before, lines=2, says=says)  # "running ..." and the error


def test_an_internal_error_with_an_undecodable_name_is_still_one_line_and_logged(run_cli, pair, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("bad\udcff name\nsecond line")

    monkeypatch.setattr("precision_tool.commands.handlers.inspect", boom)
    result = run_cli("inspect", pair[0])
    assert_outcome(result.status, result.stderr, 3, digests(*pair), says="RuntimeError: bad\\xff name\\nsecond line")
    log = Path(os.environ["XDG_STATE_HOME"]) / "precision-tool" / "last-error.log"
    assert "bad\\udcff name" in log.read_text(encoding="utf-8")


# -- the shell ------------------------------------------------------------------------------------------------------
def test_the_shell_survives_every_bad_output(run_cli, pair, tmp_path):
    golden, _ = pair
    lines = [f"vcs -o {golden}", f"vcs --format csv -o {tmp_path}/none/x.csv", f"vcs -o {tmp_path / LONG}",
             f"vcs --plot {golden}/x.svg", f"check --junit {tmp_path}/./{os.path.basename(golden)}",
             f"vcs --format json -o {tmp_path}/ok.json"]
    before = digests(*pair)
    result = run_cli("shell", *pair, stdin="\n".join(lines) + "\n")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 5 and "internal" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "file name too long" in result.stderr
    assert result.status == 2 and (tmp_path / "ok.json").is_file()
    assert digests(*pair) == before


def test_a_history_on_a_device_is_kept_in_memory(tmp_path):
    from prompt_toolkit.history import InMemoryHistory

    from precision_tool.repl.app import create_history

    history = tmp_path / "history"
    history.symlink_to("/dev/zero")  # read for ever by a file history
    assert isinstance(create_history(history), InMemoryHistory)


def test_a_history_that_cannot_be_written_is_no_error(tmp_path):
    from precision_tool.repl.app import create_history

    path = tmp_path / "history"
    history = create_history(path)
    history.store_string("ls")
    path.unlink()
    path.mkdir()  # the next write fails (EISDIR), as on a full disk
    history.store_string("vcs")
    assert list(history.load_history_strings()) == []


# -- signals ----------------------------------------------------------------------------------------------------------
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and FIFOs")


@pytest.mark.parametrize("sig, word, args", [
    (signal.SIGTERM, "terminated", ("compare", "--format", "csv", "-o")),
    (signal.SIGINT, "interrupted", ("compare", "--format", "csv", "-o")),
    (signal.SIGINT, "interrupted", ("check", "--min-cosine", "-1", "--junit")),
], ids=["compare-sigterm", "compare-sigint", "check-junit-sigint"])
def test_a_signal_while_writing_to_a_fifo_exits_130(pair, tmp_path, sig, word, args):
    """The output is a FIFO no one reads: the comparison is done and the write blocks, until the signal."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    proc = _cli(args[0], *pair, *args[1:], fifo)
    time.sleep(0.5)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline and not _blocked_on(proc.pid, fifo):
        time.sleep(0.05)
    assert proc.poll() is None
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert_outcome(proc.returncode, err, 130, {}, says=f"precision-tool: {word}")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def _blocked_on(pid: int, path) -> bool:
    """Whether process ``pid`` waits for a reader of the FIFO it opens (Linux; elsewhere: assume so)."""
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True
    try:
        return (proc / "wchan").read_text() == "wait_for_partner" \
            or (proc / "syscall").read_text().split()[0] in ("2", "257")  # open, openat (x86-64)
    except (OSError, IndexError):
        return False


def test_sigterm_stops_collect_at_a_step_boundary_and_keeps_the_dump(tmp_path):
    from precision_tool.dump.reader import open_dump

    path = tmp_path / "run.h5"
    proc = _cli("collect", "transformer", "--steps", "400", "-o", path)
    partial = Path(f"{path}.partial")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and _size(partial) < 3_000_000:  # a step is ~6 MB
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be signalled"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert_outcome(proc.returncode, err, 130, {}, says="precision-tool: terminated")
    assert no_leftovers(tmp_path) == []  # renamed into place, not left as run.h5.partial
    with open_dump(path) as dump:
        assert not dump.complete and dump.steps_complete >= 0


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def test_two_processes_writing_one_output_leave_one_whole_file(run_cli, pair, tmp_path):
    out = tmp_path / "out.csv"
    procs = [_cli("compare", *pair, "--all", "--format", "csv", "-o", out) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    reference = tmp_path / "reference.csv"
    assert run_cli("compare", *pair, "--all", "--format", "csv", "-o", reference).status == 0
    assert out.read_bytes() == reference.read_bytes() and no_leftovers(tmp_path) == []


def test_sigterm_ends_the_interactive_shell_with_130(pair, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "XDG_DATA_HOME": str(tmp_path / "data")}
    child = pexpect.spawn(sys.executable, ["-m", "precision_tool", "shell", *pair], env=env, encoding="utf-8",
                          codec_errors="replace", timeout=30, dimensions=(40, 160))
    try:
        child.expect("PrecisionTool >")
        child.kill(signal.SIGTERM)
        child.expect(pexpect.EOF)
        child.close()
    finally:
        child.close(force=True)
    assert child.exitstatus == 130 and "precision-tool: terminated" in child.before
    assert "Traceback" not in child.before


@pytest.mark.parametrize("raised, limit, says", [
    (MemoryError("Unable to allocate 3.20 GiB for an array with shape (858993459,) and data type float32"), None,
     "precision-tool: out of memory: Unable to allocate 3.20 GiB for an array with shape (858993459,) and data type "
     "float32 (rerun with --traceback to see where)"),
    (MemoryError(), 2 ** 31, "precision-tool: out of memory: an allocation failed; the process may use 2 GiB of "
                             "address space (ulimit -v) (rerun with --traceback to see where)"),
    # PyTorch's CPU allocator (torch 2.13; a replay in diagnose, a .pt tensor): before, an internal error
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 40000000000000 bytes. Error code 12 (Cannot allocate memory)"), None,
     "precision-tool: out of memory: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
     "40000000000000 bytes. Error code 12 (Cannot allocate memory) (rerun with --traceback to see where)"),
    (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 20.00 GiB"), None,
     "precision-tool: out of memory: CUDA out of memory. Tried to allocate 20.00 GiB (rerun with --traceback to "
     "see where)")],
    ids=["numpy", "ulimit", "torch-cpu", "torch-gpu"])
def test_running_out_of_memory_is_one_line_saying_what_ran_out_exit_3(run_cli, pair, monkeypatch, raised, limit, says):
    import resource

    def boom(*args, **kwargs):
        raise raised

    monkeypatch.setattr("precision_tool.commands.handlers.inspect", boom)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY if limit is None else limit,
                                                              resource.RLIM_INFINITY))
    result = run_cli("inspect", pair[0])
    assert (result.status, result.stderr) == (3, says + "\n")
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "precision-tool" / "last-error.log").exists()  # nothing to log
    result = run_cli("--traceback", "inspect", pair[0])
    assert result.status == 3 and "Traceback" in result.stderr and type(raised).__name__ in result.stderr


def test_a_runtime_error_that_is_not_about_memory_is_still_an_internal_error(run_cli, pair, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: something else went wrong")

    monkeypatch.setattr("precision_tool.commands.handlers.inspect", boom)
    result = run_cli("inspect", pair[0])
    assert result.status == 3 and result.stderr.startswith("precision-tool: internal error: RuntimeError: ")
