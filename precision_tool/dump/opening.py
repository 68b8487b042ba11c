"""Opening a dump's HDF5 file read-only: what is wrong with a file that cannot be opened, and whether a writer holds it.

A file a live writer holds (its flock) is opened without locking, and reads what was committed; a file killed
inside a commit is read as it was at the last one (`precision_tool.dump.undo`).
"""

from __future__ import annotations

import os
from pathlib import Path

from precision_tool.dump.undo import rolled_back
from precision_tool.errors import InputError


def open_h5(path: str):
    """(the open h5py File, whether a writer still holds it): a missing, non-HDF5 or truncated file is an InputError."""
    import h5py

    if not str(path):  # (Path("") is the current directory)
        raise InputError("''", "an empty path: give a dump file")
    p = Path(path)
    if not p.exists():
        from precision_tool.outputs import missing

        raise InputError(path, missing(path))
    if p.is_dir():
        raise InputError(path, "is a directory, not a dump file")
    if not os.access(p, os.R_OK):
        raise InputError(path, "permission denied")
    try:
        if not h5py.is_hdf5(path):
            raise InputError(path, "not an HDF5 file")
        view = rolled_back(path)  # killed inside a commit: read as it was at the last one (`dump.undo`)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc}") from None
    try:
        if view is not None:
            return h5py.File(view, "r"), _locked(path)
        return h5py.File(path, "r"), False
    except OSError as exc:
        text = str(exc)
        if "lock" in text:  # a live writer holds the lock: read what it has committed
            try:
                return h5py.File(path, "r", locking=False), True
            except OSError as retry:
                text = str(retry)
        if "truncated" in text:
            raise InputError(path, f"truncated HDF5 file ({p.stat().st_size} bytes; {_eof_note(text)})") from None
        raise InputError(path, f"corrupt or unreadable HDF5 file ({text})") from None


def _eof_note(text: str) -> str:
    # h5py says: "truncated file: eof = 1234, sblock->base_addr = 0, stored_eof = 5678"
    if "stored_eof = " in text:
        stored = text.split("stored_eof = ", 1)[1].split(")")[0].split(",")[0].strip()
        return f"the file says it has {stored} bytes"
    return "cut short"


def locked_partial(path: str) -> bool:
    """Whether a writer holds ``PATH.partial``: a new run is being written that will replace this file."""
    from precision_tool.dump.partial import partial_path

    return _locked(partial_path(path))


def _locked(path: str) -> bool:
    """Whether a writer holds the lock of the file at ``path``."""
    try:
        import fcntl
    except ImportError:  # no flock: writers lock nothing either
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # and with it the shared lock, if it was taken
