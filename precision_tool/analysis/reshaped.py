"""Another part of the same tensor: an op that reads, whole, an output golden's run reads only part of.

Logits or labels not shifted before a loss (``logits[:, :-1]`` in golden, all of
them in the target), padding left in, a mask not applied: the op before agrees
with golden's, the op after reads a tensor of another size, and everything
after it differs. Views are not ops: no recorded op takes the slice golden takes,
so a scan that pairs ops sees a first op whose inputs and outputs both mismatch
(an error it cannot measure, "inherited") and goes past it.

Found from statistics: the target's input is, value for value, the whole output
of an earlier op of its step (same count, extremes, mean and norm); that op's
golden partner wrote as many values, near the target's; golden's op reads
fewer of them. Casts are left out: autocast adds and removes them, and their names
pair other calls.
"""

from __future__ import annotations

import math

import numpy as np

from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.structure import Consumers, fingerprint, is_copy, module_path
from precision_tool.defaults import SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord


def another_part(record: OpRecord, partner: OpRecord | None, writers: Consumers, golden_consumers: dict,
                 golden_of, dumps=None) -> Verdict | None:
    """kernel_bug at forward op ``record`` when an input of it is the whole output of an earlier op whose golden
    partner agrees, while ``partner`` (golden's op) reads fewer values there, or (with ``dumps``, golden's and the
    target's, holding values) as many in another order (`_reordered`); else None. ``writers``: the step's
    forward records of the target; ``golden_consumers``: golden's of each direction (the scan's)."""
    if partner is None or partner.type != record.type or record.direction != "forward" or record.is_module \
            or is_copy(record.type):  # (autocast adds and removes casts: their names pair other calls)
        return None
    theirs = {t.slot: t for t in partner.inputs}
    for tensor in record.inputs:
        golden = theirs.get(tensor.slot)
        if golden is None or not is_float(tensor.dtype) or not tensor.stats.count:
            continue
        if golden.stats.count == tensor.stats.count:
            verdict = _reordered(record, partner, tensor, golden, writers, golden_consumers["forward"], golden_of,
                                 dumps)
            if verdict is not None:
                return verdict
            continue
        writer, slot = _writer(record, tensor, writers)
        if writer is None:
            continue
        golden_writer = golden_of(writer)
        written = golden_writer.tensor(slot) if golden_writer is not None else None
        if written is None or written.stats.count != tensor.stats.count or golden.stats.count >= tensor.stats.count \
                or not _near(written, tensor):
            continue
        return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, (
            f"{record.name} ({record.type}) reads {tensor.slot} of shape {_shape(tensor)}, the whole output of "
            f"{writer.name}, where golden's reads {golden.stats.count} of its {written.stats.count} values "
            f"(shape {_shape(golden)})",
            f"{writer.name} agrees with golden's: between it and {record.name} the target takes another part of "
            "that output (a view or slice golden takes and the target does not: logits or labels not shifted, "
            "padding or a mask not applied)"),
            f"check the indexing between {writer.name} and {record.name}: golden reads shape {_shape(golden)} of "
            f"that output there", module=module_path(record.name) or None)
    return None


def _reordered(record: OpRecord, partner: OpRecord, tensor, golden, writers: Consumers, golden_writers: Consumers,
               golden_of, dumps) -> Verdict | None:
    """kernel_bug at ``record`` when its input ``tensor`` is the whole output of an earlier op that agrees with
    golden's, and holds the values golden's op reads there (``golden``), sorted, within SIGNIFICANT_ERROR, in
    another order, SIGNIFICANT_ERROR apart value for value: a view between them that golden's run takes otherwise
    (attention heads merged without their transpose). Views are no ops: nothing recorded shows the change but
    the order."""
    if dumps is None or not (tensor.has_data and golden.has_data) or not _near(golden, tensor):
        return None
    writer, slot = _writer(record, tensor, writers)
    golden_writer = golden_of(writer) if writer is not None else None
    written = golden_writer.tensor(slot) if golden_writer is not None else None
    if written is None or written.stats.count != tensor.stats.count or not _near(written, tensor):
        return None
    golden_dump, target_dump = dumps
    golden_read, _ = _writer(partner, golden, golden_writers)
    if golden_read is None or golden_read.exec_index == golden_writer.exec_index:
        return None  # golden's op reads that writer's output too: no copy golden makes in its own order (a clone
        # after a transpose) stands between them; the values are not read (they cost a diagnosis a second)
    mine = np.ravel(target_dump.tensor(record.step, record.exec_index, tensor.slot)).astype(np.float64)
    theirs = np.ravel(golden_dump.tensor(partner.step, partner.exec_index, golden.slot)).astype(np.float64)
    scale = float(np.linalg.norm(theirs))
    if mine.size != theirs.size or not scale or not np.all(np.isfinite(mine)):
        return None
    as_read = float(np.linalg.norm(mine - theirs)) / scale
    sorted_apart = float(np.linalg.norm(np.sort(mine) - np.sort(theirs))) / scale
    if as_read < SIGNIFICANT_ERROR or sorted_apart >= SIGNIFICANT_ERROR:
        return None
    # the writer's own values, as it wrote them, agree with golden's: the order changed after it (else the
    # error is the writer's, and sorting only pairs each value with a near one)
    own = np.ravel(target_dump.tensor(writer.step, writer.exec_index, slot)).astype(np.float64)
    golden_own = np.ravel(golden_dump.tensor(golden_writer.step, golden_writer.exec_index, slot)).astype(np.float64)
    if own.size != golden_own.size or not as_read > 8 * float(np.linalg.norm(own - golden_own)) / scale:
        return None
    module = module_path(writer.name) or module_path(record.name) or None
    return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, (
        f"{record.name} ({record.type}) reads {tensor.slot}, the output of {writer.name} (which agrees with "
        f"golden's), {as_read:.3g} from golden's value for value while the same values, sorted, are within "
        f"{sorted_apart:.3g}",
        f"between {writer.name} and {record.name} the target reads those values in another order: a view "
        "(transpose, permute, reshape) golden takes otherwise, such as attention heads merged without their "
        "transpose"),
        f"check the views {module or 'the code'} takes of {writer.name}'s output before {record.type} reads it: "
        f"golden's reads it as shape {_shape(golden)}, its elements in golden's order", module=module)


def _writer(record: OpRecord, tensor, writers: Consumers) -> tuple[OpRecord | None, str]:
    """The last op before ``record`` that wrote ``tensor``'s values whole (``writers``: the records of its step
    and direction), and the slot of that output."""
    writer = writers.producer(record, tensor.slot)
    if writer is None:
        return None, ""
    key = fingerprint(tensor)
    return writer, [t.slot for t in writer.outputs if t.stats.count and fingerprint(t) == key][-1]


def _near(golden, target) -> bool:
    """Whether two tensors' statistics agree within SIGNIFICANT_ERROR (norm and mean, relative to the norm)."""
    g, t = golden.stats, target.stats
    if not (math.isfinite(g.norm) and math.isfinite(t.norm)) or g.norm <= 0.0:
        return False
    mean_gap = abs(g.mean - t.mean) * math.sqrt(g.count) / g.norm
    return abs(g.norm - t.norm) / g.norm < SIGNIFICANT_ERROR and mean_gap < SIGNIFICANT_ERROR


def _shape(tensor) -> str:
    return "(" + ", ".join(str(n) for n in tensor.shape) + ")"
