"""Ctrl-C means stop: compare, check and diagnose exit 130, and the shell's vcs returns to the prompt, promptly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.faults.writes_helpers import assert_outcome, command, digests

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

WITHIN = 3.0  # seconds from SIGINT to exit (or to the prompt): a bound on "at once" that a loaded CI machine
#              still meets (typically 0.1-0.3 s here); exit 130 is what shows the interrupt was handled


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Golden and fp16 target transformer runs whose comparison takes several seconds."""
    folder = tmp_path_factory.mktemp("interrupt")
    paths = {"golden": folder / "golden.h5", "target": folder / "target.h5"}
    for args, path in ((("--device", "golden"), paths["golden"]),
                       (("--device", "npu", "--precision-mode", "force_fp16"), paths["target"])):
        subprocess.run(command("collect", "transformer", "--steps", "64", "-o", path, *args),
                       check=True, capture_output=True)
    return paths


def _interrupt(args, opened, after: float):
    """Start the CLI, send SIGINT ``after`` seconds once it has ``opened`` open (the work has begun, however fast
    the machine imports); (completed process, seconds from SIGINT to exit)."""
    proc = subprocess.Popen(command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1"})
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and not _has_open(proc.pid, opened):
        time.sleep(0.02)
    time.sleep(after)
    assert proc.poll() is None, "the command ended before it could be interrupted"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err), time.monotonic() - sent


def _has_open(pid: int, path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux; elsewhere: assume so)."""
    folder = f"/proc/{pid}/fd"
    if not os.path.isdir(folder):
        return sys.platform != "linux"
    try:
        return any(os.readlink(f"{folder}/{fd}") == os.path.realpath(path) for fd in os.listdir(folder))
    except OSError:  # a descriptor closed meanwhile
        return False


@pytest.mark.parametrize("args", [("compare",), ("compare", "--jobs", "1"), ("check",), ("diagnose",)],
                         ids=["compare", "compare-jobs1", "check", "diagnose"])
def test_sigint_exits_130_at_once(runs, args):
    inputs = [runs["golden"], runs["target"]]
    before = digests(*inputs)
    result, took = _interrupt((args[0], *inputs, *args[1:]), runs["target"], after=0.5)
    assert_outcome(result.returncode, result.stderr, 130, before, says="interrupted")
    assert took < WITHIN, f"{took:.2f} s from SIGINT to exit"


def test_ctrl_c_in_vcs_returns_to_the_prompt_at_once(runs):
    pexpect = pytest.importorskip("pexpect")
    before = digests(runs["golden"], runs["target"])
    child = pexpect.spawn(command("shell")[0], command("shell", runs["golden"], runs["target"])[1:],
                          encoding="utf-8", codec_errors="replace", timeout=60, dimensions=(40, 160),
                          env={**os.environ, "NO_COLOR": "1"})
    try:
        child.expect("PrecisionTool >")
        child.sendline("vcs")
        child.expect("comparing")  # its progress bar: the comparison is under way (a fixed wait raced it)
        time.sleep(0.2)
        sent = time.monotonic()
        child.sendintr()
        ended = child.expect(["interrupted", "ops at cosine <="])
        assert ended == 0, "vcs ended before Ctrl-C reached it: the runs compare too fast for this test"
        child.expect("PrecisionTool >")
        took = time.monotonic() - sent
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "Traceback" not in (child.before or "")
    assert took < WITHIN, f"{took:.2f} s from Ctrl-C to the prompt"
    assert digests(runs["golden"], runs["target"]) == before
