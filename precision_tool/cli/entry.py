"""The console script's own module: nothing but this is imported before Ctrl-C can be turned into one line.

`precision_tool.cli.main` imports click and the command registry, some tens of milliseconds; a Ctrl-C in that
time printed Python's traceback of the import and ended the process by the signal, not with exit 130.
"""

import sys


def entry_point() -> None:
    try:
        from precision_tool.cli.main import entry_point as run
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("precision-tool: interrupted\n")
        sys.exit(130)  # (ExitStatus.INTERRUPTED, not imported: precision_tool.errors may be what was loading)
    run()
