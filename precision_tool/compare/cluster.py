"""Scoring tensor pairs on a Dask cluster (``--scheduler ADDRESS``).

The client matches ops and plans the work as on one machine; the pairs then
go to the workers in batches of roughly equal size. A worker opens the two
dumps by path (they sit on storage every worker mounts at the same path),
keeps them open for the batches that follow, and scores its pairs with the
same `score_pair` the local path uses, reading pages in place. Rows come
back in the order of the pairs, so a report is identical to the local one.

Only this module imports ``distributed``, and only when a scheduler is given.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Callable

from precision_tool.errors import ConfigError, InputError, printable

BATCH_ELEMENTS = 1 << 24  # about 64 MB of float32 per side and batch
BATCHES_PER_WORKER = 4  # enough to even out uneven batches without drowning the scheduler
CONNECT_TIMEOUT_S = 20

_OPEN: dict[tuple[str, int, int], object] = {}  # on a worker: (path, mtime, size) -> an open dump
_OPEN_LOCK = threading.Lock()


def _open_on_worker(path: str):
    """The worker's open reader of ``path``, opened once per worker process (reopened if the file changed)."""
    from precision_tool.dump.reader import open_dump

    try:
        stat = os.stat(path)
    except OSError as exc:
        raise InputError(path, f"not readable on this worker ({exc.strerror}); the dumps must sit on storage "
                               "every worker mounts at the same path") from None
    key = (path, stat.st_mtime_ns, stat.st_size)
    with _OPEN_LOCK:
        dump = _OPEN.get(key)
        if dump is None:
            for old in [k for k in _OPEN if k[0] == path]:
                _OPEN.pop(old).close()
            dump = _OPEN[key] = open_dump(path)
        return dump


def _score_batch(score_pair: Callable, golden_path: str, target_path: str, batch: list,
                 chunk_elements: int) -> list:
    """Runs on a worker: the rows of ``batch``'s (pair, loss scale) items (``score_pair`` travels by name)."""
    golden, target = _open_on_worker(golden_path), _open_on_worker(target_path)
    lock = threading.Lock()  # one reader per dump file at a time, as on one machine
    return [score_pair(pair, golden, target, chunk_elements, lock, None, scale) for pair, scale in batch]


def _path(source, side: str) -> str:
    path = getattr(source, "path", None)
    if not path or not os.path.exists(str(path)):
        raise ConfigError(f"--scheduler needs the {side} dump as a file the workers can open; "
                          f"{path or 'an in-memory dump'} is not one")
    return os.path.abspath(str(path))


def batches(items: list, sizes: list[int], workers: int) -> list[list[int]]:
    """Indices of ``items`` in consecutive batches of about equal total size, at least one per item group."""
    if not items:
        return []
    total = sum(sizes)
    wanted = max(1, workers * BATCHES_PER_WORKER)
    limit = max(1, min(BATCH_ELEMENTS, math.ceil(total / wanted)))
    out, current, filled = [], [], 0
    for index, size in enumerate(sizes):
        current.append(index)
        filled += max(size, 1)
        if filled >= limit:
            out.append(current)
            current, filled = [], 0
    if current:
        out.append(current)
    return out


_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx", "inproc")  # distributed's transports


def check_address(address: str) -> str:
    """``address`` when it is a scheduler's address (``tcp://HOST:PORT``); else ConfigError, before Dask is asked:
    given one it cannot parse, its client fails, then waits 40 s to close and prints a traceback."""
    scheme, separator, rest = str(address).partition("://")
    if not separator:  # HOST:PORT, which Dask reads as tcp://HOST:PORT
        scheme, rest = "tcp", str(address)
    host, colon, port = rest.rpartition(":")
    if scheme not in _SCHEMES or not rest or scheme != "inproc" and not (
            colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"--scheduler {printable(address)!r} is not a Dask scheduler's address: give "
                          "tcp://HOST:PORT (scheme one of " + ", ".join(_SCHEMES) + ")")
    return address


def connect(address: str):
    """A ``distributed.Client`` for ``address``; a clear error when Dask is missing or nothing answers."""
    check_address(address)
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError("--scheduler needs dask.distributed: pip install 'precision-tool[cluster]'") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {printable(address)}: {exc}") from None


def score_on_cluster(address, score_pair: Callable, pairs: list, scales: list[float], golden, target,
                     chunk_elements: int, sizes: list[int], report: Callable[[object], None]) -> list:
    """The rows of ``pairs`` scored by ``score_pair`` on the cluster at ``address`` (or a ``distributed.Client``)."""
    from precision_tool.compare.cancel import raise_if_interrupted

    golden_path, target_path = _path(golden, "golden"), _path(target, "target")
    client = connect(address) if isinstance(address, str) else address
    try:
        workers = max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))
        plan = batches(pairs, sizes, workers)
        futures = [client.submit(_score_batch, score_pair, golden_path, target_path,
                                 [(pairs[i], scales[i]) for i in batch], chunk_elements, pure=False)
                   for batch in plan]
        index = {future.key: n for n, future in enumerate(futures)}
        rows: list = [None] * len(pairs)
        try:
            from distributed import as_completed

            for future in as_completed(futures, loop=client.loop):
                raise_if_interrupted()
                batch = plan[index[future.key]]
                for i, row in zip(batch, future.result()):
                    rows[i] = row
                    report(pairs[i])
        except BaseException:
            client.cancel(futures)
            raise
        return rows
    finally:
        if isinstance(address, str):
            client.close()
