"""Runs of several ranks: a directory holding one dump per rank (``rank0.h5``, ``rank1.h5``, ...) and ``run.json``.

``run.json`` is a small manifest: ``{"format": "precision-tool-run", "version": 1, "world_size": N,
"ranks": ["rank0.h5", ...]}`` (``ranks`` may be left out; given, it must name rank r's file at r). Every rank dump also carries ``rank`` and ``world_size`` in its root
metadata. A directory is a run when it holds ``run.json`` or a ``rank<R>.h5``; anything else that is a
directory is left to the msprobe adapter. Checking a run (`find_run`) needs no HDF5: the dumps are opened
by whoever reads them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from precision_tool.errors import InputError

MANIFEST = "run.json"
RUN_FORMAT = "precision-tool-run"
RUN_VERSION = 1
MANIFEST_LIMIT = 1 << 20  # bytes: a manifest is a few hundred
_RANK_FILE = re.compile(r"rank(\d+)\.h5$")


def rank_file(rank: int) -> str:
    """The file name of rank ``rank``'s dump inside a run directory."""
    return f"rank{int(rank)}.h5"


def rank_path(run_dir, rank: int) -> str:
    return os.path.join(os.fspath(run_dir), rank_file(rank))


@dataclass(frozen=True)
class RunLayout:
    """A run directory's ranks: ``paths[r]`` is rank r's dump."""

    path: str
    world_size: int
    paths: tuple[str, ...]

    @property
    def ranks(self) -> range:
        return range(self.world_size)


def is_run_dir(path) -> bool:
    """Whether ``path`` is a directory laid out as a run (a manifest, or a ``rank<R>.h5`` in it)."""
    text = os.fspath(path)
    if not os.path.isdir(text):
        return False
    if os.path.isfile(os.path.join(text, MANIFEST)):
        return True
    try:
        return any(_RANK_FILE.match(name) for name in os.listdir(text))
    except OSError:
        return False


def rank_files(run_dir) -> list[tuple[int, str]]:
    """(rank, path) of every rank dump (``rank<R>.h5``) in ``run_dir``, by name; none where it cannot be listed."""
    text = os.fspath(run_dir)
    try:
        names = sorted(os.listdir(text))
    except OSError:
        return []
    return [(int(m.group(1)), os.path.join(text, name)) for name in names if (m := _RANK_FILE.match(name))]


def find_run(path) -> RunLayout:
    """The run at ``path``; InputError (one line naming it) when it holds no rank dumps or lacks a rank."""
    text = os.fspath(path)
    if not os.path.isdir(text):
        raise InputError(text, "not a run directory (a directory of rank<R>.h5 dumps)")
    try:
        names = os.listdir(text)
    except OSError as exc:
        raise InputError(text, f"cannot read the run directory: {exc.strerror or exc}") from None
    found: dict[int, str] = {}
    for name in sorted(names):
        if m := _RANK_FILE.match(name):
            rank = int(m.group(1))
            if rank in found:
                raise InputError(text, f"holds both {found[rank]} and {name}: which one is rank {rank}?")
            found[rank] = name
    manifest = read_manifest(text) if MANIFEST in names else None
    if manifest is None and not found:
        raise InputError(text, "no rank dumps in this run directory (expected rank0.h5, rank1.h5, ...)")
    world_size = manifest["world_size"] if manifest is not None else max(found) + 1
    missing = _first_missing(found, world_size)
    if missing:
        listed = ", ".join(rank_file(r) for r in missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise InputError(text, f"missing rank {missing[0]} of a world of {world_size} ({listed} not found)")
    extra = sorted(r for r in found if r >= world_size)
    if extra:
        raise InputError(text, f"holds {rank_file(extra[0])} but its {MANIFEST} says world size {world_size}")
    return RunLayout(text, world_size, tuple(os.path.join(text, found[r]) for r in range(world_size)))


def _first_missing(found: dict, world_size: int, most: int = 5) -> list[int]:
    """The first ``most`` ranks below ``world_size`` without a dump: a loop of len(found) + most steps at most,
    whatever world size a manifest claims."""
    missing = []
    for rank in range(world_size):
        if rank not in found:
            missing.append(rank)
            if len(missing) == most:
                break
    return missing


def read_manifest(run_dir) -> dict:
    """``run.json`` of ``run_dir``, checked; InputError when it is not a manifest this version reads."""
    path = os.path.join(os.fspath(run_dir), MANIFEST)
    try:
        if not os.path.isfile(path):  # a FIFO would block the open, a device never end
            raise InputError(path, "not a regular file")
        if os.path.getsize(path) > MANIFEST_LIMIT:
            raise InputError(path, f"{os.path.getsize(path)} bytes: too large for a run manifest")
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(path, f"not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != RUN_FORMAT:
        raise InputError(path, f"not a run manifest (no \"format\": \"{RUN_FORMAT}\")")
    if manifest.get("version") != RUN_VERSION:
        raise InputError(path, f"run manifest version {manifest.get('version')!r}; this version reads {RUN_VERSION}")
    size = manifest.get("world_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise InputError(path, f"world_size must be a positive integer, got {size!r}")
    _check_rank_list(path, manifest.get("ranks"), size)
    return manifest


def _check_rank_list(path: str, ranks, world_size: int) -> None:
    """A manifest's ``ranks``, where given, names each rank's file in rank order (the reader finds them by
    name: a list naming others would be a run of other files than the manifest says)."""
    if ranks is None:
        return
    if not isinstance(ranks, list):
        raise InputError(path, f"ranks must be a list of the rank files, got {_short(ranks)}")
    if len(ranks) != world_size:
        raise InputError(path, f"ranks lists {len(ranks)} files, but world_size is {world_size}")
    for rank, name in enumerate(ranks):
        if name != rank_file(rank):
            raise InputError(path, f"ranks names {_short(name)} for rank {rank}, whose file is {rank_file(rank)}")


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def write_manifest(run_dir, world_size: int, **extra) -> str:
    """Write ``run.json`` through `precision_tool.outputs.write_text` (atomically, through a link) and return
    its path."""
    from precision_tool.outputs import write_text

    run_dir = os.fspath(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    manifest = {"format": RUN_FORMAT, "version": RUN_VERSION, "world_size": int(world_size),
                "ranks": [rank_file(r) for r in range(int(world_size))], **extra}
    path = os.path.join(run_dir, MANIFEST)
    write_text(path, json.dumps(manifest, indent=1) + "\n")
    return path


def check_world_sizes(golden: RunLayout, target: RunLayout) -> None:
    """Golden and target runs pair rank by rank: their world sizes must agree (InputError naming the target)."""
    if golden.world_size != target.world_size:
        raise InputError(target.path, f"world size {target.world_size}, but the golden run {golden.path} has "
                                      f"{golden.world_size}: ranks pair one to one")


def check_rank_metadata(path: str, metadata: dict, rank: int, world_size: int) -> None:
    """A rank dump whose own metadata names another rank or world size is refused (InputError)."""
    recorded_rank, recorded_size = metadata.get("rank"), metadata.get("world_size")
    for key, value in (("rank", recorded_rank), ("world_size", recorded_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputError(path, f"/ attribute {key}: {value!r} is not a whole number")
    if recorded_size is not None and int(recorded_size) != world_size:
        raise InputError(path, f"recorded with world size {recorded_size}, but its run has {world_size} ranks")
    if recorded_rank is not None and int(recorded_rank) != rank:
        raise InputError(path, f"recorded as rank {recorded_rank}, but it is the run's {rank_file(rank)}")
