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

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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
        """Raise `Cancelled` when the work has been called off."""
        if self._event.is_set():
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
