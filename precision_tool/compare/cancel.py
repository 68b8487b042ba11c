"""Stopping long work at once on Ctrl-C: a stop flag, and a thread-pool map that cancels its queue.

Python delivers Ctrl-C (KeyboardInterrupt) to the main thread only. Worker
threads keep going, and a ``ThreadPoolExecutor`` left by an exception waits
for every queued job before it lets the exception through. `pool_map` does
what a user pressing Ctrl-C expects instead: when the consumer leaves its
``with`` block for any reason, it cancels the queued jobs, sets the `StopFlag` the running ones check
between pieces of work (`StopFlag.check` raises `Cancelled`), and waits only
for those, a chunk each.

Long work in the main thread (a replay, op by op) needs nothing: the
KeyboardInterrupt reaches it between two Python statements. Work in a worker
thread calls ``flag.check()`` between pieces.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


_INTERRUPTED = threading.Event()  # set by the console script's SIGINT handler: sticky, unlike the exception


def install_interrupt_handler() -> None:
    """Ctrl-C raises KeyboardInterrupt as usual and is also remembered.

    A KeyboardInterrupt that lands in a finaliser (a weakref callback, an
    h5py object being freed) is printed as "Exception ignored" and lost, and
    the command would run on to exit 0; remembered, the work stops at its next
    check (`raise_if_interrupted`, `StopFlag.check`) and the command exits 130.
    Such lost interrupts are not printed.
    """
    def handler(signum, frame):
        _INTERRUPTED.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    previous = sys.unraisablehook

    def unraisable(info):
        if not isinstance(info.exc_value, KeyboardInterrupt):
            previous(info)

    sys.unraisablehook = unraisable


def interrupted() -> bool:
    """Whether Ctrl-C was pressed since `clear_interrupt`."""
    return _INTERRUPTED.is_set()


def clear_interrupt() -> None:
    _INTERRUPTED.clear()


def raise_if_interrupted() -> None:
    """KeyboardInterrupt when Ctrl-C was pressed, even if its own exception was lost in a finaliser."""
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


class Cancelled(Exception):
    """Raised in a worker by `StopFlag.check` once its work has been called off."""


class StopFlag:
    """Set once to call work off; workers call `check` between pieces of work."""

    def __init__(self):
        self._event = threading.Event()

    def stop(self) -> None:
        self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise `Cancelled` when the work has been called off (or Ctrl-C was pressed)."""
        if self._event.is_set() or _INTERRUPTED.is_set():
            raise Cancelled()


@contextmanager
def pool_map(func: Callable[[T, StopFlag], R], items: Iterable[T], jobs: int,
             thread_name_prefix: str = "worker") -> Iterator[Iterator[R]]:
    """Run ``func(item, flag)`` for every item on ``jobs`` threads; yields an iterator of the results, in order.

    Leaving the ``with`` block before every result was taken (an exception,
    KeyboardInterrupt, a break) cancels the queued jobs at once and tells the
    running ones to stop (``flag``); only those are waited for.
    """
    flag = StopFlag()
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix=thread_name_prefix)
    futures = [pool.submit(func, item, flag) for item in items]
    try:
        yield (future.result() for future in futures)
    finally:
        flag.stop()  # a no-op for jobs that are done; the rest end at their next flag.check()
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
