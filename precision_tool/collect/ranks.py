"""`collect --ranks N`: N simulated data-parallel ranks of one model, one dump each, in a run directory.

Every rank is a `Session` of its own (the same seed, so the same initial weights), run in a thread of its
own; rank r trains on rows ``[r*b, (r+1)*b)`` of step s's global batch (``b`` = global batch / N: the
global batch is the batch one rank would see in a single-rank run, so the N shards together are exactly
that batch). After the backward pass every rank's gradients meet at a barrier and each rank records, per
parameter, an op ``allreduce/<param>`` of type ``AllReduce`` (direction backward; input its own
gradient, output the mean over the ranks, summed in rank order in float32 and divided by N, so bitwise
the same on every rank); the overflow flag is all-reduced too (any rank's overflow skips the update
everywhere). The optimizer then applies identical updates on every rank.

``fault_rank`` plants a fault for trying the cross-rank check: that rank's all-reduce returns its own
gradient, as if it had skipped the collective, so its weights leave the others' from step 0 on.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from precision_tool.engine.hooks import BACKWARD
from precision_tool.errors import ConfigError, InputError

ALLREDUCE_TYPE = "AllReduce"
ALLREDUCE_PREFIX = "allreduce/"
BARRIER_TIMEOUT_S = 600.0  # a rank that never arrives is a bug: fail rather than hang


class RankBarrier:
    """A barrier whose `abort` breaks only the waits not yet released.

    ``threading.Barrier.abort`` also breaks a wait that the last arrival already released but whose thread has
    not woken yet: a rank that had reached the barrier would then lose its step. Here a wait returns once its
    generation is released, whatever happens after.
    """

    def __init__(self, parties: int, timeout: float = BARRIER_TIMEOUT_S):
        self.parties, self.timeout = parties, timeout
        self._arrived, self._generation, self._broken = 0, 0, False
        self._condition = threading.Condition()

    def wait(self) -> None:
        with self._condition:
            if self._broken:
                raise threading.BrokenBarrierError
            generation = self._generation
            self._arrived += 1
            if self._arrived == self.parties:
                self._arrived, self._generation = 0, generation + 1
                self._condition.notify_all()
                return
            released = self._condition.wait_for(lambda: self._generation != generation or self._broken,
                                                 self.timeout)
            if self._generation == generation:  # broken, or timed out, before everyone arrived
                self._broken = True
                self._condition.notify_all()
                raise threading.BrokenBarrierError if released else TimeoutError(
                    f"a rank did not reach the barrier within {self.timeout:g} s")

    def abort(self) -> None:
        with self._condition:
            self._broken = True
            self._condition.notify_all()


class RankGroup:
    """What the ranks of one run share: a barrier, and a slot per rank for what they exchange."""

    def __init__(self, world_size: int, global_batch_size: int, fault_rank: int | None = None):
        self.world_size = world_size
        self.global_batch_size = global_batch_size
        self.fault_rank = fault_rank
        self.barrier = RankBarrier(world_size)
        self.grads: list[dict | None] = [None] * world_size
        self.overflow = [False] * world_size

    def rank(self, rank: int) -> "RankLink":
        return RankLink(self, rank)

    def abort(self) -> None:
        self.barrier.abort()


@dataclass
class RankLink:
    """One rank's end of the group: ``Session.data_parallel`` of that rank's session."""

    group: RankGroup
    rank: int

    def metadata(self) -> dict:
        return {"rank": self.rank, "world_size": self.group.world_size,
                "global_batch_size": self.group.global_batch_size}

    def all_reduce(self, session, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The mean of every gradient over the ranks, each recorded as one ``allreduce/<param>`` op."""
        group = self.group
        group.grads[self.rank] = grads
        group.barrier.wait()
        everyone = list(group.grads)
        reduced = {}
        for name, grad in grads.items():
            mean = grad if self.rank == group.fault_rank else mean_over_ranks([g[name] for g in everyone])
            reduced[name] = session.executor.run_external(f"{ALLREDUCE_PREFIX}{name}", ALLREDUCE_TYPE, BACKWARD,
                                                          lambda _, out=mean: [out], [grad])[0]
        return reduced

    def any_overflow(self, overflow: bool) -> bool:
        """Whether any rank overflowed this step (every rank then skips, or applies, the same update)."""
        group = self.group
        group.overflow[self.rank] = bool(overflow)
        group.barrier.wait()
        return any(group.overflow)


def mean_over_ranks(arrays: list[np.ndarray]) -> np.ndarray:
    """Sum in rank order in float32, then divide by the number of ranks (what every rank computes)."""
    total = np.array(arrays[0], dtype=np.float32, copy=True)
    for array in arrays[1:]:
        total = total + np.asarray(array, dtype=np.float32)
    return total / np.float32(len(arrays))


class RankShard:
    """A rank's view of the run's `SyntheticData`: its rows of every training batch; held-out data whole."""

    def __init__(self, data, rank: int, world_size: int):
        self._data, self.rank, self.world_size = data, rank, world_size
        self.batch_size = data.batch_size // world_size

    def batch(self, step: int) -> dict[str, np.ndarray]:
        start = self.rank * self.batch_size
        return {name: value[start:start + self.batch_size] for name, value in self._data.batch(step).items()}

    def __getattr__(self, name):
        return getattr(self._data, name)


def shard_batch_size(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise ConfigError(f"--ranks {world_size} does not divide the batch of {global_batch} rows; "
                          f"give --batch-size a multiple of {world_size}")
    return global_batch // world_size


def run_ranks(sessions: list, group: RankGroup, hooks_of_rank) -> list:
    """Run every rank's session in a thread of its own; the summaries in rank order, or the first error.

    ``hooks_of_rank(rank)`` -> the hooks (collectors) to close as incomplete when that rank fails. An error on
    one rank breaks the barrier for the others; the error raised is the first that is not that breakage
    (KeyboardInterrupt first: Ctrl-C stops every rank).
    """
    summaries: list = [None] * len(sessions)
    errors: list[BaseException | None] = [None] * len(sessions)

    def run(rank: int) -> None:
        try:
            summaries[rank] = sessions[rank].run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread below
            errors[rank] = exc
            group.abort()
            for hook in hooks_of_rank(rank):
                hook.close(complete=False)

    threads = [threading.Thread(target=run, args=(rank,), name=f"rank{rank}", daemon=True)
               for rank in range(len(sessions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [e for e in errors if e is not None]
    if failed:
        causes = [e for e in failed if not isinstance(e, threading.BrokenBarrierError)] or failed
        raise next((e for e in causes if isinstance(e, KeyboardInterrupt)), causes[0])
    return summaries


def collect_ranks(plan, hooks=()) -> tuple[list, list]:
    """`run_collect` of a plan with ``ranks``: every rank's dump under the run directory, then ``run.json``
    (`_conclude_run`); (collectors, run summaries) in rank order.

    ``hooks`` (progress, Ctrl-C) go to rank 0 only: it stops, or counts, for every rank.
    """
    from precision_tool.collect.collector import Collector
    from precision_tool.dump.runs import rank_path
    from precision_tool.session import Session

    req, world_size = plan.request, plan.request.ranks
    check_run_dir(req.output, world_size, req.overwrite)
    collectors = [Collector(rank_path(req.output, rank), plan.modes, steps=plan.selection.steps,
                            ops=plan.selection.ops, op_types=plan.selection.op_types,
                            backward=plan.selection.backward, command=req.command, overwrite=req.overwrite)
                  for rank in range(world_size)]
    sessions, group = [], None
    for rank, collector in enumerate(collectors):
        session = Session(plan.config, hooks=[collector, *(hooks if rank == 0 else ())])
        if group is None:
            group = RankGroup(world_size, session.batch_size, req.fault_rank)
        session.batch_size = shard_batch_size(session.batch_size, world_size)
        session.data = RankShard(session.data, rank, world_size)
        session.data_parallel = group.rank(rank)
        sessions.append(session)
    os.makedirs(req.output, exist_ok=True)
    try:
        summaries = run_ranks(sessions, group, lambda rank: [collectors[rank]])
    finally:
        _conclude_run(req, collectors)
    return collectors, summaries


def check_run_dir(output: str, world_size: int, overwrite: bool) -> None:
    """InputError unless a run of ``world_size`` ranks can be written to the directory ``output`` now, before any
    work: without ``overwrite`` it holds no run (no ``run.json``, no rank dump); with it, every rank dump could
    be replaced, as the collector will check (`check_target`)."""
    from precision_tool.dump.partial import check_target
    from precision_tool.dump.runs import MANIFEST, rank_files, rank_path, read_manifest
    from precision_tool.outputs import make_folder

    if os.path.lexists(output) and not os.path.isdir(output):  # a file, a dangling link: says why, naming it
        make_folder(output, "the run directory")
    manifest = os.path.join(output, MANIFEST)
    if not overwrite and (os.path.lexists(manifest) or rank_files(output)):
        raise InputError(output, "holds a run already (run.json, rank dumps); write elsewhere, or replace it with "
                                 "--force")
    if os.path.lexists(manifest):  # (--force) replaced only when it is a run's manifest, never a file of the user's
        try:
            read_manifest(output)
        except InputError as exc:
            raise InputError(manifest, f"{exc.problem}: not replaced, --force or not") from None
    for rank in range(world_size if os.path.isdir(output) else 0):
        check_target(rank_path(output, rank), overwrite)


def _conclude_run(req, collectors: list) -> None:
    """After the ranks stopped: where every rank's dump is in place (finished, or cut short where no earlier dump
    had its name), the run's ``run.json``, and no rank dump of an earlier, larger run left beside them; else the
    directory's earlier run stays whole (its dumps were kept, this run's are ``rank<R>.h5.partial``)."""
    from precision_tool.dump.partial import partial_path
    from precision_tool.dump.runs import rank_files, rank_path, write_manifest

    placed = [c.writer is not None and c.closed and os.path.realpath(c.writer.path) ==
              os.path.realpath(rank_path(req.output, rank)) for rank, c in enumerate(collectors)]
    if not all(placed):  # a rank dump this run put where none was (a world grown past the earlier run's) goes back
        if any(placed) and not all(p for p, c in zip(placed, collectors) if c.writer is not None):
            for rank, here in enumerate(placed):  # to NAME.partial, beside the others: the earlier run stays whole
                if here:
                    os.replace(rank_path(req.output, rank), partial_path(rank_path(req.output, rank)))
        return
    write_manifest(req.output, len(collectors), model=req.model, command=req.command)
    for rank, path in rank_files(req.output):
        if rank >= len(collectors):  # (only with --force: without it a directory holding a run is refused)
            os.remove(path)
