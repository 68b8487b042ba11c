"""The file a dump is written to: ``NAME.partial`` beside it, locked, renamed onto NAME when closed.

While a run is recorded its dump is ``NAME.partial``, held with an
exclusive ``flock`` for the writer's life: a second writer of NAME finds
the lock and stops with one line, and HDF5 readers (which take a shared
lock) are refused rather than shown a file in mid-write. Closing renames it
onto NAME, complete or not (an interrupted run is marked incomplete inside),
so NAME holds the previous dump, untouched, until the new one is finished
(`collect`'s incomplete run does not replace a previous NAME, but stays
``NAME.partial``: `DumpWriter`'s ``keep_previous``).
A killed writer leaves ``NAME.partial``, readable up to its last committed
step; the next writer refuses to overwrite it without ``overwrite=True``.
A NAME that is a symbolic link is written through, as every output is
(`precision_tool.outputs.output_target`): ``.partial`` sits beside the file
it names, which the rename replaces; the link stays.

HDF5 writes through `GuardedFile` (h5py's file-object driver,
`precision_tool.dump.guarded`): the first failed write (a full disk, an I/O
error) is recorded and every later write dropped, and commits are atomic,
so the file stays as a kill at that moment would leave it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from precision_tool.dump.guarded import GuardedFile
from precision_tool.errors import InputError
from precision_tool.outputs import mode_for, output_target, problem

try:
    import fcntl
except ImportError:  # not POSIX: dumps are written unlocked
    fcntl = None

PARTIAL_SUFFIX = ".partial"
_HELD: set[str] = set()  # the .partial files this process writes now (their real paths)
ALREADY_OURS = "is already being written by this process (a dump to it is still open); give each dump its own file"


def partial_path(path) -> str:
    """Where the dump of ``path`` is written until it is closed (beside the file a link at ``path`` names):
    ``NAME.partial``, or where that name would pass the file system's limit on a name (255 bytes on most), the
    start of NAME with a hash of the whole (``NAME-START~1a2b3c4d.partial``): the same for every writer of NAME,
    so that its lock still tells them apart."""
    target = output_target(path)
    folder, name = os.path.split(target)
    encoded = name.encode(errors="surrogateescape")
    try:
        limit = os.pathconf(folder or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(encoded) + len(PARTIAL_SUFFIX) <= limit or len(encoded) > limit:  # (a NAME too long is refused)
        return f"{target}{PARTIAL_SUFFIX}"
    digest = hashlib.sha1(encoded).hexdigest()[:8]
    start = encoded[:max(limit - len(PARTIAL_SUFFIX) - len(digest) - 1, 1)].decode(errors="ignore")
    return os.path.join(folder, f"{start}~{digest}{PARTIAL_SUFFIX}")


class PartialFile:
    """``NAME.partial``, created and locked for one writer; `finish` renames it onto NAME."""

    def __init__(self, path, overwrite: bool):
        self.path = output_target(path)  # a link is kept: the file it names is replaced
        self.partial = partial_path(self.path)
        _check_target(self.path, overwrite)
        self._fd = _claim(self.path, self.partial)
        self._held = os.path.realpath(self.partial)
        _HELD.add(self._held)
        try:
            left = os.fstat(self._fd).st_size
            if left and not overwrite:
                raise InputError(self.partial, LEFT_BEHIND)
            _check_target(self.path, overwrite)  # a writer that held the lock may have finished meanwhile
            os.ftruncate(self._fd, 0)
            if hasattr(os, "fchmod"):  # a dump replaced keeps its permissions (a private one stays private)
                os.fchmod(self._fd, mode_for(self.path))
        except InputError:
            if not os.fstat(self._fd).st_size:
                _remove(self.partial)
            self._release()
            raise
        except OSError as exc:
            self._release()
            raise InputError(self.partial, f"cannot create the dump: {problem(exc)}") from None
        self.file = GuardedFile(self._fd)

    def finish(self, complete: bool = True) -> bool:
        """Rename the written file onto its name and release the lock; not ``complete``, where a previous file has
        the name, it stays ``NAME.partial`` (nothing is lost: the previous dump, and what this run finished).
        Whether it was renamed."""
        if not complete and os.path.lexists(self.path):
            self._release()
            return False
        try:
            os.replace(self.partial, self.path)
            return True
        except OSError as exc:
            raise InputError(self.path, f"cannot move the finished dump {self.partial} into place: "
                                        f"{problem(exc)}") from None
        finally:
            self._release()

    def abandon(self) -> None:
        """Remove the file (nothing of it is readable) and release the lock."""
        _remove(self.partial)
        self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases its flock
            self._fd = None
            _HELD.discard(self._held)


def check_target(path, overwrite: bool, only_dumps: bool = False) -> None:
    """InputError unless a dump can be written to ``path`` now (before any work is done). ``only_dumps`` (with
    ``overwrite``): an existing file is replaced only if it is an HDF5 file or empty, never a script or a
    checkpoint given by mistake."""
    path = output_target(path)
    _check_target(path, overwrite)
    if overwrite and only_dumps:
        _refuse_other_files(path)
    partial = partial_path(path)
    if os.path.realpath(partial) in _HELD:
        raise InputError(path, ALREADY_OURS)
    try:
        fd = os.open(partial, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    if fcntl is None:
        os.close(fd)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        left = os.fstat(fd).st_size
    except OSError:
        raise InputError(path, f"is being written by another process ({partial} is locked); "
                               "wait for it to finish, or write elsewhere") from None
    finally:
        os.close(fd)
    if left and not overwrite:
        raise InputError(partial, LEFT_BEHIND)


LEFT_BEHIND = ("a dump left by a run that did not finish (inspect can read it); "
               "move it away, or overwrite it with --force")


def _check_target(path: str, overwrite: bool) -> None:
    if not path:
        raise InputError("''", "is not a file name; give the dump file's name")
    if os.path.isdir(path):
        raise InputError(path, "is a directory; give the dump file's name")
    try:
        kind = os.stat(path).st_mode
    except OSError:
        kind = None  # nothing there (or a dangling link): created by the rename
    if kind is not None and not stat.S_ISREG(kind):  # a FIFO, a device: the rename would replace it
        raise InputError(path, "is not a regular file (a device, FIFO or socket); give the dump file's name")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise InputError(path, f"cannot create the dump: no directory {Path(path).parent}")
    if not overwrite and os.path.lexists(path):
        raise InputError(path, "already exists; choose another file name, or overwrite it with --force")


def _refuse_other_files(path: str) -> None:
    import h5py

    try:
        size = os.path.getsize(path)
    except OSError:
        return  # nothing there: created by the rename
    try:
        dump = h5py.is_hdf5(path)
    except OSError as exc:
        raise InputError(path, f"cannot be read to tell what it holds: {problem(exc)}") from None
    if size and not dump:
        raise InputError(path, "exists and is not a dump (not an HDF5 file); a dump replaces only a dump: move it "
                               "away or choose another file name")


def _claim(path: str, partial: str) -> int:
    """An open descriptor of ``partial``, created if needed, exclusively flock'ed by this process."""
    if os.path.realpath(partial) in _HELD:  # its own lock would be taken for another process's
        raise InputError(path, ALREADY_OURS)
    for _ in range(5):
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise InputError(path, f"cannot create the dump: {problem(exc)}") from None
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            held = exc.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN)
            reading = held and _only_read(fd)
            os.close(fd)
            if reading:  # HDF5 readers hold shared locks: a shell or an inspect of a left-behind .partial
                raise InputError(partial, "is open in another process that reads it (the shell, inspect?); "
                                          "close it there, or write elsewhere") from None
            if held:
                raise InputError(path, f"is being written by another process ({partial} is locked); "
                                       "wait for it to finish, or write elsewhere") from None
            raise InputError(path, f"cannot lock {partial}: {problem(exc)}") from None
        try:  # the lock holds only if ``partial`` still names the file locked: a finishing writer renames it
            if os.path.samestat(os.fstat(fd), os.stat(partial)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise InputError(path, f"cannot lock {partial}: other writers keep replacing it")


def _only_read(fd: int) -> bool:
    """Whether the processes holding ``fd``'s file locked hold shared (reading) locks only: a writer's is
    exclusive, and a shared lock can then not be had."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
