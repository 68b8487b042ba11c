"""A dump whose objects are links, or whose values are stored in other files: refused before HDF5 opens anything.

HDF5 would follow an external link into any file (another dump: its values read as this one's, or mapped at
offsets of the wrong file; a FIFO: the open blocks for ever, through SIGTERM), a soft link to another step's
objects, and read a dataset whose values are in external raw files or a virtual dataset's sources.
`precision_tool.dump.links.member` refuses them all: one line naming the dump and the object, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.faults.writes_helpers import build

ROOT = Path(__file__).resolve().parents[2]
PACK = "steps/000000/packs/000000"


@pytest.fixture
def pair(tmp_path):
    return build(tmp_path / "golden.h5", role="golden"), build(tmp_path / "target.h5", noise=0.6)


def _replace(path, name, make):
    with h5py.File(path, "r+") as f:
        old = f[name]
        described = (old.shape, old.dtype, old[()]) if isinstance(old, h5py.Dataset) else None
        del f[name]
        make(f, name, described)


def _external(target_file, target_path):
    def make(f, name, described):
        f[name] = h5py.ExternalLink(str(target_file), target_path)
    return make


def _soft(target_path):
    def make(f, name, described):
        f[name] = h5py.SoftLink(target_path)
    return make


def _virtual(source_file):
    def make(f, name, described):
        shape, dtype, _ = described
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[:] = h5py.VirtualSource(str(source_file), name, shape=shape)
        f.create_virtual_dataset(name, layout)
    return make


def _raw_elsewhere(raw_file):
    def make(f, name, described):
        shape, dtype, values = described
        Path(raw_file).write_bytes(np.ascontiguousarray(values).tobytes())
        f.create_dataset(name, shape=shape, dtype=dtype, external=[(str(raw_file), 0, values.nbytes)])
    return make


def _expect(result, path, where, says):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.status == 2, result.stderr
    assert lines == [f"precision-tool: error: {path}: /{where}: {says}"], result.stderr


@pytest.mark.parametrize("name, damage, says", [
    (PACK, lambda g, d: _external(g, "/" + PACK),
     "a link to /steps/000000/packs/000000 in another file ({golden}), which a dump never holds: "
     "refused rather than followed"),
    ("steps/000001", lambda g, d: _external(g, "/steps/000001"),
     "a link to /steps/000001 in another file ({golden}), which a dump never holds: refused rather than followed"),
    (PACK, lambda g, d: _soft("/steps/000001/packs/000000"),
     "a soft link to /steps/000001/packs/000000, which a dump never holds: refused rather than followed"),
    (PACK, lambda g, d: _virtual(g),
     "a virtual dataset (its values are read from other files), which a dump never holds: refused rather than read"),
    ("steps/000000/index", lambda g, d: _raw_elsewhere(d / "index.raw"),
     "a dataset whose values are stored in another file ({folder}/index.raw), which a dump never holds: "
     "refused rather than read"),
], ids=["external-pack", "external-step", "soft-pack", "virtual-pack", "raw-elsewhere-index"])
@pytest.mark.parametrize("command", ["compare", "diagnose"])
def test_an_object_outside_the_dump_is_refused(run_cli, pair, tmp_path, name, damage, says, command):
    golden, target = pair
    _replace(target, name, damage(golden, tmp_path))
    result = run_cli(command, golden, target)
    _expect(result, target, name, says.format(golden=golden, folder=tmp_path))


def test_an_external_link_to_a_fifo_never_blocks(pair, tmp_path):
    golden, target = pair
    os.mkfifo(tmp_path / "fifo")
    _replace(target, "steps", _external(tmp_path / "fifo", "/steps"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    result = subprocess.run([sys.executable, "-m", "precision_tool", "inspect", str(target)], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"precision-tool: error: {target}: /steps: a link to /steps in another file ({tmp_path}/fifo), which a dump "
        "never holds: refused rather than followed"]
