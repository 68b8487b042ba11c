"""Exit statuses and the exceptions that map onto them.

Every layer raises these; only the front ends (cli/, repl/) turn them into a
message and an exit status. The core never prints and never exits.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """The documented exit statuses of every precision-tool command."""

    OK = 0
    REGRESSION = 1  # a check found a precision regression
    USAGE = 2  # bad option, bad config value or bad input file
    INTERNAL = 3  # a bug in precision-tool itself, or memory ran out (`memory_ran_out`)
    INTERRUPTED = 130


class PrecisionToolError(Exception):
    """Base of every error a user can cause; `str()` is the one line shown."""

    exit_status = ExitStatus.USAGE


class ConfigError(PrecisionToolError, ValueError):
    """A configuration value is unknown or out of range."""


class InputError(PrecisionToolError):
    """An input file is missing, unreadable or not what it claims to be."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{printable(self.path)}: {problem}")


def printable(text) -> str:
    """``text`` (a file name) safe to show on one line: control characters (a newline, an escape sequence that
    would recolour the terminal) and undecodable bytes are written as Python escapes ("a\\nb", "\\xff")."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


SHOWN_LIMIT = 200  # characters of a value read from a dump (a model name, a setting) that a line shows


def cut(text, limit: int = SHOWN_LIMIT) -> str:
    """``text``, or where it is longer than ``limit`` characters, its start and how long it is: a dump's strings
    are shown on one line whatever a file holds (a 20 MB model name)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by the file system encoding
        return f"\\x{code - 0xDC00:02x}"
    return repr(char)[1:-1] if code < 0x10000 else f"\\U{code:08x}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that every cleanup Ctrl-C gets runs (exit 130)."""


class NotFoundError(PrecisionToolError, KeyError):
    """What was asked for (a step, an op, a tensor, a node) is not there: the user's mistake, exit 2.

    A KeyError too, so that code looking something up may catch either; a
    bare KeyError from a bug is not one of these, and the front ends report
    it as the internal error it is.
    """

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


def choice_error(what: str, value, valid) -> ConfigError:
    """A ConfigError for a value outside a fixed set, listing the valid ones."""
    listed = ", ".join(str(v) for v in valid)
    return ConfigError(f"unknown {what} {value!r}; valid: {listed}")


# PyTorch's CPU allocator raises a plain RuntimeError: "[enforce fail at alloc_cpu.cpp:127] err == 0.
# DefaultCPUAllocator: can't allocate memory: you tried to allocate 40000000000000 bytes. Error code 12 (...)";
# older releases said "not enough memory". Its GPU one raises torch.OutOfMemoryError, a RuntimeError too.
_TORCH_ALLOCATOR = "DefaultCPUAllocator: "
_TORCH_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory")


def memory_ran_out(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: a MemoryError, or PyTorch's own (told by its type's name and its
    message: nothing here imports torch)."""
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return type(exc).__name__ == "OutOfMemoryError" or (
        _TORCH_ALLOCATOR in text and any(words in text for words in _TORCH_OUT_OF_MEMORY))


def out_of_memory(exc: BaseException) -> str:
    """The one line for running out of memory (`memory_ran_out`): what could not be allocated, and the
    process's address-space limit when one is set (``ulimit -v``), which is then what ran out."""
    text = str(exc)
    if _TORCH_ALLOCATOR in text:  # PyTorch's: what follows the C++ assertion ("[enforce fail at ...] err == 0.")
        text = text[text.index(_TORCH_ALLOCATOR):]
    what = " ".join(printable(text).split()) or "an allocation failed"
    limit = ""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limit = f"; the process may use {soft / 2 ** 30:.3g} GiB of address space (ulimit -v)"
    except (ImportError, OSError, ValueError):  # not POSIX
        pass
    return f"out of memory: {what}{limit}"
