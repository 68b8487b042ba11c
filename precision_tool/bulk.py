"""Building tens of thousands of small objects without the cyclic garbage collector watching.

CPython's cyclic collector runs every few hundred allocations and, now and
then, walks every tracked object. Reading a dump's index and comparing it
build about ten records, rows and tuples per tensor pair, none of which form
reference cycles, so those walks find nothing: measured on a 20,000-op pair,
they were a third to a half of `compare`'s time (bench/bench_many.py).
`bulk_objects` pauses the collector for such a phase; it runs again after,
and collects whatever cycles other code made meanwhile.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def bulk_objects() -> Iterator[None]:
    """Pause cyclic garbage collection inside the block; nested blocks leave it paused.

    The switch is global: a thread that leaves its block while another is inside ends the pause early,
    which costs time, never correctness.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
