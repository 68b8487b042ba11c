"""Writing output files safely: never over an input, and never half-written.

Every output (CSV, JSON, table, plot, JUnit XML, baseline) is written to a
hidden temporary file beside it (``.NAME.XXXXXXXX.tmp``: same directory, so
same filesystem) and renamed onto its name only once complete; a failed
write removes the temporary and leaves any previous file as it was. An
output that is the same file as an input of the command (compared by device
and inode, so links and other spellings count) is refused. Special files
(a FIFO, a device) are written in place: they cannot be replaced.
``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N`` name an open descriptor:
the output is written to it once complete (a pipe; ``>> log`` appends),
never renamed over the file it may be.
An output that is a symbolic link is written through it (`output_target`): the file the link names, followed
to its end, is replaced atomically (its temporary beside that file, on its file system) and the link is kept;
a dangling link gets its file created. Dumps (`precision_tool.dump.partial`) do the same.
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from precision_tool.errors import ConfigError, InputError, printable


TEMPORARY_STEM = 200  # characters of the output's name in its temporary's: a 255-byte name must still be writable


def problem(exc: BaseException) -> str:
    """The reason of an OS error in words ("no space left on device"), never a bare errno number."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code > 0:
        text = os.strerror(code)
        return text[:1].lower() + text[1:]
    return str(exc) or type(exc).__name__


def missing(path) -> str:
    """Why ``path`` names no file, in words: a loop of symbolic links, a link to a file that does not exist, or
    none at all."""
    from precision_tool.errors import printable

    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "a loop of symbolic links (too many levels of symbolic links)"
        return f"a symbolic link to {printable(os.readlink(path))}, which does not exist"
    return "no such file"


# An OSError of these, naming a file, that reaches a front end is the file system refusing a path the user gave
# (a run directory under a file, a name too long, a full or read-only disk) or the environment's limits (too many
# open files: ulimit -n): one line and exit 2, not a bug report.
FILE_SYSTEM_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT", "EFBIG", "EIO", "ENAMETOOLONG", "ENOTDIR", "EISDIR", "EEXIST",
    "ELOOP", "EXDEV", "EMLINK", "ENXIO", "EMFILE", "ENFILE") if hasattr(errno, name))
_TOO_MANY_FILES = frozenset(getattr(errno, name) for name in ("EMFILE", "ENFILE") if hasattr(errno, name))


def file_system_error(exc: BaseException) -> str | None:
    """``"PATH: reason"`` when ``exc`` is the file system refusing a named file (see FILE_SYSTEM_ERRNOS), else None."""
    if isinstance(exc, OSError) and exc.errno in FILE_SYSTEM_ERRNOS and exc.filename not in (None, ""):
        return f"{printable(os.fsdecode(exc.filename))}: {problem(exc)}{_open_files_limit(exc)}"
    return None


def _open_files_limit(exc: OSError) -> str:
    """For "too many open files": the limit that was reached (``ulimit -n``), which is the user's to raise."""
    if exc.errno not in _TOO_MANY_FILES:
        return ""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return ""
    return f" (this process may open {soft}; raise it with ulimit -n)" if exc.errno == errno.EMFILE else ""


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one existing file (same device and inode)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_inputs(output, inputs) -> None:
    """InputError when ``output`` is one of ``inputs`` (None entries are skipped).

    An input that is a directory (a run of several ranks: rank0.h5, ..., run.json) counts by the files in it:
    an output that is one of them is refused too.
    """
    if output is None:
        return
    for given in inputs:
        if given is None:
            continue
        victim = given if same_file(output, given) else _inside(output, given)
        if victim is not None:
            spelled = "" if str(victim) == str(output) else f" ({printable(victim)})"
            raise InputError(output, f"is an input of this command{spelled}; "
                                     "writing it would destroy that input: choose another output file")


def _inside(output, directory):
    """The file of input directory ``directory`` that ``output`` is, else None."""
    if not os.path.isdir(directory) or not os.path.isfile(output):
        return None
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if same_file(output, entry.path):
                    return entry.path
    except OSError:
        pass
    return None


def refuse_repeats(outputs: dict) -> None:
    """ConfigError when two options (``{option: path}``) name one output file."""
    seen: dict = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise ConfigError(f"{seen[key]} and {option} both write {printable(path)}; give them different files")
        seen[key] = option


def make_folder(path, what: str = "the folder") -> Path:
    """Create folder ``path`` (and its parents) if missing; InputError naming it and why it cannot be made."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = problem(exc)
        if os.path.islink(path) and not os.path.exists(path):
            reason = f"it is {missing(path)}"
        raise InputError(path, f"cannot create {what}: {reason}") from None
    return Path(path)


def output_target(path) -> str:
    """The file an output written to ``path`` replaces: the file a symbolic link names (through a chain of
    links), else ``path`` itself. A link a user made (``golden.h5 -> /data/runs/golden.h5``) is kept."""
    text = os.fspath(path)
    return os.path.realpath(text) if os.path.islink(text) else text


def mode_for(target) -> int:
    """The permission bits a new output gets: the old file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextmanager
def replacing(path, inputs=()) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` when the block succeeds.

    OSError in the block or the rename becomes InputError naming ``path``
    and the reason in words; the temporary is removed on any failure.
    """
    if not str(path):
        raise ConfigError("the output file name is empty; give the file to write")
    descriptor = _descriptor(path)
    if descriptor is not None:  # /dev/stdout: what the shell opened (a pipe, `>> log`) is written to, not replaced
        yield from _through_descriptor(path, descriptor)
        return
    if str(path).endswith(("/", os.sep)):  # Path() would drop the slash and replace the file "NAME" instead
        raise InputError(path, "ends with '/', which names a folder; give a file name")
    target = Path(output_target(path))
    refuse_inputs(target, inputs)
    try:
        kind = os.stat(target).st_mode
    except FileNotFoundError:
        kind = None
    except OSError as exc:  # a name too long, a loop of links, a folder that cannot be searched
        if exc.errno != errno.ENOTDIR:
            raise InputError(path, f"cannot write: {problem(exc)}") from None
        kind = None  # a file where a folder should be: mkstemp below says so
    if kind is not None and stat.S_ISDIR(kind):
        raise InputError(path, "is a directory; give a file name")
    if kind is not None and not stat.S_ISREG(kind):  # /dev/stdout, a FIFO: write to it as it is
        try:
            yield target
        except OSError as exc:
            raise InputError(path, f"cannot write: {problem(exc)}") from None
        return
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name[:TEMPORARY_STEM]}.", suffix=".tmp",
                                             dir=target.parent or ".")
        os.close(handle)
        os.chmod(temporary, mode_for(target))
    except OSError as exc:
        raise InputError(path, f"cannot write: {problem(exc)}") from None
    try:
        yield Path(temporary)
        _sync(temporary)
        refuse_inputs(target, inputs)  # an input may have been moved there while we worked
        os.replace(temporary, target)
    except OSError as exc:
        _remove(temporary)
        raise InputError(path, f"cannot write: {problem(exc)}") from None
    except BaseException:
        _remove(temporary)
        raise


_DESCRIPTOR = re.compile(r"/dev/std(out|err)|/dev/fd/(\d+)|/proc/self/fd/(\d+)")


def _descriptor(path) -> int | None:
    """The open descriptor ``path`` names (/dev/stdout, /dev/fd/N), else None. Resolving it as a link would give
    a pipe's name that no file has, or the file ``>>`` appends to, which a rename would replace whole."""
    match = _DESCRIPTOR.fullmatch(os.path.normpath(str(path)))
    if match is None:
        return None
    stream, *numbers = match.groups()
    if stream is not None:
        return 1 if stream == "out" else 2
    return int(next(n for n in numbers if n is not None))


def _through_descriptor(path, descriptor: int) -> Iterator[Path]:
    """`replacing` for an open descriptor: the block writes a temporary file, copied to the descriptor after it."""
    import sys

    try:
        handle, temporary = tempfile.mkstemp(prefix=".precision-tool-output.", suffix=".tmp")
        os.close(handle)
    except OSError as exc:
        raise InputError(path, f"cannot write: no temporary file: {problem(exc)}") from None
    try:
        yield Path(temporary)
        for stream in (sys.stdout, sys.stderr):  # what was printed before comes first
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        with open(temporary, "rb") as source:
            for block in iter(lambda: source.read(1 << 20), b""):
                view = memoryview(block)
                while view:
                    view = view[os.write(descriptor, view):]
    except BrokenPipeError:
        raise  # the reader left (`| head`): the front end ends quietly
    except OSError as exc:
        raise InputError(path, f"cannot write: {problem(exc)}") from None
    finally:
        _remove(temporary)


def write_text(path, text: str, inputs=()) -> None:
    """Write ``text`` (UTF-8) to ``path`` through `replacing`."""
    with replacing(path, inputs) as temporary:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)


def _sync(path) -> None:
    # the data reaches the disk before the rename does: a power cut leaves the old file or the new one
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # filesystems that cannot sync have nothing to flush
            raise
    finally:
        os.close(fd)


def _remove(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class StandardOutput:
    """A command's ``sys.stdout`` (or stderr): every character it is given reaches the stream, or the write fails
    saying so.

    Three ways a plain stream loses output: a write that fails (a full disk, ``ulimit -f``) raises an OSError
    naming no file, which the error boundary would take for a bug; under ``PYTHONUNBUFFERED`` (common in
    containers) the text layer writes straight to the file and ignores a short write, so the rest of the output
    is dropped with exit 0; and a character the stream's encoding lacks (``PYTHONIOENCODING=ascii``, a C locale
    without UTF-8 mode) raises UnicodeEncodeError. Here a failed write is an OSError naming "standard output",
    a short write is completed, and an unencodable character is written as "?". Everything else is the stream's.
    """

    def __init__(self, stream, name: str = "standard output", drop_on_failure: bool = False):
        self._stream, self._name, self._drop = stream, name, drop_on_failure

    def write(self, text):
        if not isinstance(text, str):  # bytes: let the stream say it takes text (click probes with b"")
            return self._stream.write(text)
        try:
            raw = getattr(self._stream, "buffer", None)
            if isinstance(raw, io.RawIOBase):  # unbuffered: the text layer would drop what a short write left
                self._stream.flush()
                _write_all(raw, self._encode(text))
                return len(text)
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:  # nothing was written: the text layer encodes before it writes
                encoding = self._stream.encoding
                return self._stream.write(text.encode(encoding, "replace").decode(encoding))
        except BrokenPipeError:
            abandon(self._stream)  # what it still buffers is dropped quietly, not failed on again at exit
            raise  # the reader left (`| head`): the front end ends quietly
        except OSError as exc:
            return self._failed(exc, len(text))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            abandon(self._stream)
            raise
        except OSError as exc:
            return self._failed(exc, None)

    def _failed(self, exc: OSError, result):
        abandon(self._stream)
        if self._drop:  # stderr: a warning that cannot be shown must not stop the work (or change its status)
            return result
        raise _named(exc, self._name) from None

    def _encode(self, text: str) -> bytes:
        encoding = getattr(self._stream, "encoding", None) or "utf-8"
        try:
            return text.encode(encoding, getattr(self._stream, "errors", None) or "strict")
        except UnicodeEncodeError:
            return text.encode(encoding, "replace")

    def __getattr__(self, name):
        return getattr(self._stream, name)


def abandon(stream) -> None:
    """After a failed write to standard ``stream``: its descriptor now writes to /dev/null, so that what the stream
    still buffers is dropped once, quietly, instead of failing again when Python flushes it at exit (status 120)."""
    try:
        descriptor = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):  # a stream with no descriptor (a StringIO) buffers nothing
        return
    try:
        os.dup2(null, descriptor)
    except OSError:
        pass
    finally:
        os.close(null)


def _write_all(raw, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = raw.write(view)
        if written is None:  # a non-blocking descriptor that is full
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        view = view[written:]


def _named(exc: OSError, name: str) -> OSError:
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), name)


@contextmanager
def standard_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` are `StandardOutput` streams for the block (those that are not None);
    stderr's drops what it cannot write: it is where the failure would be told."""
    import sys

    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    for name, label in (("stdout", "standard output"), ("stderr", "standard error")):
        if streams[name] is not None and not isinstance(streams[name], StandardOutput):
            setattr(sys, name, StandardOutput(streams[name], label, drop_on_failure=name == "stderr"))
    try:
        yield
    finally:
        for name, stream in streams.items():
            if isinstance(getattr(sys, name), StandardOutput):
                setattr(sys, name, stream)
