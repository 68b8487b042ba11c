"""Reading the small files users hand the tool (fusion switch, mix list, boost config): one error style."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from precision_tool.errors import InputError

SMALL_FILE_LIMIT = 64 << 20  # bytes: no config file a user writes by hand comes near; /dev/zero-like files do


def read_small_file(path, what: str = "", limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of regular file ``path``; InputError naming it when it is missing, not a regular file, larger
    than ``limit`` or unreadable.

    Opened without blocking and checked on the open descriptor: a FIFO would wait for a writer for ever, a
    device (``/dev/zero``) never end, and a name checked before it is opened can be swapped in between.
    """
    from precision_tool.outputs import missing, problem

    kind = f" ({what})" if what else ""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(path, f"{missing(path)}{kind}") from None
    except OSError as exc:
        raise InputError(path, f"cannot read{kind}: {problem(exc)}") from None
    with os.fdopen(descriptor, "rb") as stream:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(path, f"is a directory; give a file{kind}")
        if not stat.S_ISREG(mode):
            raise InputError(path, f"not a regular file{kind}")
        try:
            data = stream.read(limit + 1)
        except OSError as exc:
            raise InputError(path, f"cannot read{kind}: {problem(exc)}") from None
    if len(data) > limit:
        raise InputError(path, f"larger than {limit >> 20} MiB: too large{kind or ' for this input'}")
    return data


def read_json(path, what: str = "", expect_object: str | None = None):
    """The parsed JSON of ``path``; any problem is an InputError naming the file (and ``what`` it should be).

    ``expect_object``: the message when the document is not a JSON object (None: any document is accepted).
    """
    path = Path(path)
    try:
        data = json.loads(read_small_file(path, what).decode("utf-8-sig"))  # (a BOM: Windows editors write one)
    except UnicodeDecodeError:
        raise InputError(path, "not valid JSON: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except (ValueError, RecursionError) as exc:  # a number of thousands of digits, arrays nested 100,000 deep
        raise InputError(path, f"not valid JSON: {str(exc).split(';')[0]}") from None
    if expect_object is not None and not isinstance(data, dict):
        raise InputError(path, expect_object)
    return data
