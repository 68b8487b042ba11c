"""The run directory: finding its rank dumps, its manifest, and the one-line errors for bad runs."""

from __future__ import annotations

import json

import pytest

from precision_tool.dump.runs import (check_world_sizes, find_run, is_run_dir, rank_file, read_manifest,
                                      write_manifest)
from precision_tool.errors import InputError


def test_a_manifest_and_rank_files_make_a_run(tmp_path):
    write_manifest(tmp_path, 2, model="mlp")
    for rank in range(2):
        (tmp_path / rank_file(rank)).write_bytes(b"")
    layout = find_run(tmp_path)
    assert (layout.world_size, [p.rsplit("/", 1)[1] for p in layout.paths]) == (2, ["rank0.h5", "rank1.h5"])
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest == {"format": "precision-tool-run", "version": 1, "world_size": 2,
                        "ranks": ["rank0.h5", "rank1.h5"], "model": "mlp"}
    assert is_run_dir(tmp_path) and not is_run_dir(tmp_path / "rank0.h5")


def test_without_a_manifest_the_rank_files_say_the_world_size(tmp_path):
    for rank in range(3):
        (tmp_path / rank_file(rank)).write_bytes(b"")
    assert find_run(tmp_path).world_size == 3


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "no rank dumps in this run directory"),
    (lambda d: (write_manifest(d, 3), (d / "rank0.h5").write_bytes(b""), (d / "rank2.h5").write_bytes(b"")),
     "missing rank 1 of a world of 3 (rank1.h5 not found)"),
    (lambda d: ((d / "rank1.h5").write_bytes(b""),), "missing rank 0 of a world of 2"),
    (lambda d: (write_manifest(d, 1), (d / "rank0.h5").write_bytes(b""), (d / "rank1.h5").write_bytes(b"")),
     "holds rank1.h5 but its run.json says world size 1"),
])
def test_bad_runs_are_one_line_naming_the_directory(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(InputError) as caught:
        find_run(tmp_path)
    assert str(caught.value) == f"{tmp_path}: {message}" or str(caught.value).startswith(f"{tmp_path}: {message}")


def test_a_manifest_of_another_kind_is_refused(tmp_path):
    (tmp_path / "run.json").write_text('{"format": "other"}')
    with pytest.raises(InputError, match="not a run manifest"):
        read_manifest(tmp_path)
    (tmp_path / "run.json").write_text('{"format": "precision-tool-run", "version": 1, "world_size": 0}')
    with pytest.raises(InputError, match="world_size must be a positive integer, got 0"):
        read_manifest(tmp_path)


def test_world_sizes_must_agree(tmp_path):
    for name, size in (("g", 2), ("t", 4)):
        write_manifest(tmp_path / name, size)
        for rank in range(size):
            (tmp_path / name / rank_file(rank)).write_bytes(b"")
    with pytest.raises(InputError, match=r"world size 4, but the golden run .*/g has 2: ranks pair one to one"):
        check_world_sizes(find_run(tmp_path / "g"), find_run(tmp_path / "t"))
