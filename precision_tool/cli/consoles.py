"""The rich consoles the front ends print through: a reader that leaves (``| head``) is a BrokenPipeError.

rich's own Console answers a broken pipe with ``SystemExit(1)``, and click turns an EPIPE raised inside a
command into exit 1 as well: both say "a regression was found". Here the pipe error reaches the error
boundary (`precision_tool.cli.main`) instead, which ends quietly with the command's own status.
"""

from __future__ import annotations

import errno
import os
from functools import lru_cache


def console(stderr: bool = False, **options):
    """A rich Console on stdout (or stderr) whose broken pipe raises BrokenPipeError."""
    return _console_class()(stderr=stderr, **{"highlight": False, **options})


@lru_cache(maxsize=None)
def _console_class():
    from rich.console import Console

    from precision_tool.outputs import abandon

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            abandon(self.file)  # what the stream still buffers goes nowhere, quietly, at exit
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return PipeConsole
