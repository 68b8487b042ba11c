"""A Ctrl-C whose KeyboardInterrupt a finaliser swallows is still remembered, and not printed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, signal, weakref
    from precision_tool.compare.cancel import install_interrupt_handler, interrupted, raise_if_interrupted

    install_interrupt_handler()

    class Thing:
        pass

    def finaliser(_):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the callback: the exception is lost
        for _ in range(1000):
            pass

    thing = Thing()
    ref = weakref.ref(thing, finaliser)
    del thing
    print("lost and remembered" if interrupted() else "forgotten")
    try:
        raise_if_interrupted()
    except KeyboardInterrupt:
        print("raised")
""")


def test_an_interrupt_lost_in_a_finaliser_is_remembered_and_not_printed():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["lost and remembered", "raised"]
    assert "Exception ignored" not in done.stderr and "KeyboardInterrupt" not in done.stderr
