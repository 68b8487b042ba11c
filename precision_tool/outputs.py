"""Writing output files safely: never over an input, and never half-written.

Every output (CSV, JSON, table, plot, JUnit XML, baseline) is written to a
hidden temporary file beside it (``.NAME.XXXXXXXX.tmp``: same directory, so
same filesystem) and renamed onto its name only once complete; a failed
write removes the temporary and leaves any previous file as it was. An
output that is the same file as an input of the command (compared by device
and inode, so links and other spellings count) is refused. Special files
(``/dev/stdout``, a FIFO) are written in place: they cannot be replaced.
Dumps have their own scheme (`precision_tool.dump.partial`).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from precision_tool.errors import ConfigError, InputError


def problem(exc: BaseException) -> str:
    """The reason of an OS error in words ("no space left on device"), never a bare errno number."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code > 0:
        text = os.strerror(code)
        return text[:1].lower() + text[1:]
    return str(exc) or type(exc).__name__


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one existing file (same device and inode)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_inputs(output, inputs) -> None:
    """InputError when ``output`` is one of ``inputs`` (None entries are skipped)."""
    if output is None:
        return
    for given in inputs:
        if given is not None and same_file(output, given):
            spelled = "" if str(given) == str(output) else f" ({given})"
            raise InputError(output, f"is an input of this command{spelled}; "
                                     "writing it would destroy that input: choose another output file")


def refuse_repeats(outputs: dict) -> None:
    """ConfigError when two options (``{option: path}``) name one output file."""
    seen: dict = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise ConfigError(f"{seen[key]} and {option} both write {path}; give them different files")
        seen[key] = option


def _mode_for(target: Path) -> int:
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
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    refuse_inputs(target, inputs)
    if target.is_dir():
        raise InputError(path, "is a directory; give a file name")
    if target.exists() and not target.is_file():  # /dev/stdout, a FIFO: write to it as it is
        try:
            yield target
        except OSError as exc:
            raise InputError(path, f"cannot write: {problem(exc)}") from None
        return
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
        os.close(handle)
        os.chmod(temporary, _mode_for(target))
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
