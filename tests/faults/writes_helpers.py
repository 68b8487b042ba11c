"""What every write fault case checks: the exit status, one line without a traceback, inputs unchanged."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from precision_tool.compare.memory import MemoryDump

ENTRY_POINT = Path(sys.executable).with_name("precision-tool")
X = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)


def build(path, noise=0.0, role="target"):
    """A two-step dump of four ops (the target's error grows along them)."""
    dump = MemoryDump(role=role)
    rng = np.random.default_rng(1)
    for step in (0, 1):
        for i, name in enumerate(("embed", "fc1", "fc2", "head")):
            out = X * np.float32(i + 1) + np.float32(noise * i) * rng.standard_normal(X.shape).astype(np.float32)
            dump.add(f"{name}/Op", "Op", {"input_0": X, "output_0": out}, step=step,
                     dtypes={"output_0": "float16" if noise else "float32"})
    return dump.save(path)


def digests(*paths) -> dict:
    """sha256 of each path (None when it does not exist)."""
    out = {}
    for path in paths:
        path = Path(path)
        out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return out


def assert_outcome(status: int, stderr: str, expected: int, before: dict, *, lines: int = 1, says: str = ""):
    """The status, ``lines`` lines on stderr with no traceback, every input as it was."""
    assert status == expected, f"exit {status}, expected {expected}: {stderr}"
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    shown = [line for line in stderr.splitlines() if line.strip()]
    assert len(shown) == lines, stderr
    assert says.lower() in stderr.lower(), stderr
    assert digests(*before) == before, "an input changed"


def no_leftovers(directory) -> list[str]:
    """Temporary files an output write left behind in ``directory``."""
    return sorted(p.name for p in Path(directory).iterdir() if p.name.endswith((".tmp", ".partial")))


def command(*args) -> list[str]:
    """The console script's command line (``python -m precision_tool`` if it is not installed)."""
    head = [str(ENTRY_POINT)] if ENTRY_POINT.exists() else [sys.executable, "-m", "precision_tool"]
    return head + [str(a) for a in args]


def run_limited(*args, max_file_bytes: int, cwd=None) -> subprocess.CompletedProcess:
    """Run the CLI with files capped at ``max_file_bytes`` (writes past it fail with EFBIG, as on a full disk)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run(command(*args), capture_output=True, text=True, preexec_fn=limit, cwd=cwd,
                          env={**os.environ, "NO_COLOR": "1"}, timeout=120)
