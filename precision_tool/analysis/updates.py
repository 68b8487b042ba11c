"""An optimizer that runs other ops than golden's: does it compute golden's update?

PyTorch picks an optimizer's implementation by where it runs: a loop of
per-parameter ops on the CPU, ``_foreach_*`` ops over lists of tensors on
CUDA, one ``_fused_adamw_`` kernel where asked. A CPU golden run and a GPU
target run of the same script therefore update through different op
sequences (`structure.rewritten_modules` sees an optimizer "rewrite"), and
Adam's normalised update turns the target's small gradient noise into a
large error on the parameters it writes (where a gradient is near zero,
noise decides the sign of a step of full size): the written parameters
depart from golden's far more than the gradients read, with every op
computing right.

So the target's sequence is run again (`replay_group`), in float32 as it ran,
on golden's inputs: the gradients golden's backward wrote (found through the
op outside the group that wrote the target's, paired with golden's, through
the casts autocast adds and the views a gradient is read by; another kernel
for the same work is paired by module, direction and size), the parameters
golden's paired ops read, and for what has no counterpart (optimizer state at
the first step) the target's own values, the same as golden's there. Where
that reproduces golden's results (each result golden's optimizer hands on,
against the closest replayed result of its size, within 1 % of the update golden's made to it, or of the
value where it is no tensor updated in place), the target's
implementation computes golden's update and the departure is inherited from
the gradients; where it does not, with golden's inputs throughout, it
computes another update. A group that cannot be replayed (statistics only, an
op this PyTorch lacks) is judged as before.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from precision_tool.analysis.errors import split_error
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.analysis.structure import Consumers, fingerprint, group_results, is_copy, module_path
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FORMATS

_UNSCALING = frozenset({"aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_non_finite_check_and_unscale_"})


def replay_group(members: list[OpRecord], step_records: list[OpRecord], golden_of, target_dump,
                 golden_dump, golden_records: list[OpRecord] = (), widened: bool = False,
                 as_recorded: bool = False, own_state: bool = False,
                 in_float64: bool = False,
                 given: frozenset | None = None) -> tuple[dict[tuple, np.ndarray], bool] | None:
    """(the values the ops ``members`` (the target's group, in order) write when run again on golden's inputs, by
    the fingerprint of the tensor each wrote in the target; whether every input from outside was golden's), or
    None where one cannot be replayed. Inputs no op of the step wrote (parameters, optimizer state) are golden's
    where a paired op outside the group reads them too (a parameter the forward read), else the target's: the
    same as golden's at the run's first step, where both start from the same state. ``widened``: casts to a
    narrower dtype pass their input on as it is, so that the ops after them compute in golden's precision;
    ``as_recorded``: each op runs with the numerics the target recorded (a simulated device's lowered
    precision), else in plain PyTorch; ``own_state``: an input no op of the step wrote and no optimizer op reads
    (state the group carries from its last call, not a parameter) is the target's own; ``in_float64``: in plain
    PyTorch in float64, whatever dtypes the target computed in (golden's function as exact arithmetic gives it);
    ``given``: the fingerprints of what the group was handed from outside (a module call's inputs): an input
    neither among them nor written whole by an op (a slice of a tensor the group made), held in the target's
    own narrower format, is not golden's (`_rounded_narrower`)."""
    if target_dump.metadata.get("framework") != "torch" or not all(
            t.has_data for record in members for t in record.tensors if t.stats.count):
        return None
    try:
        from precision_tool.torch import NotReplayable, replay, replay_as_recorded
    except ImportError:
        return None
    inside = {id(r) for r in members}
    outside = [r for r in step_records if not r.is_module and id(r) not in inside]
    writers = Consumers(outside)
    readers: dict[tuple, list] = {}
    for record in outside:
        for tensor in record.inputs:
            if tensor.stats.count:
                readers.setdefault(fingerprint(tensor), []).append((record, tensor.slot))
    written: dict[tuple, np.ndarray] = {}
    exact = True
    pair = _Pairing(golden_of, golden_records)
    for record in members:
        inputs = []
        scaling = _loss_scaling_slots(record)
        for tensor in record.inputs:
            if tensor.slot in scaling:  # the target's loss scaling, as the target's gradients carry it
                inputs.append(target_dump.tensor(record.step, record.exec_index, tensor.slot))
                continue
            key = fingerprint(tensor) if tensor.stats.count else None
            if key is not None and key in written and np.size(written[key][0]) == tensor.stats.count:
                array, writer, slot = written[key]
                laid = as_read(array, target_dump.tensor(writer.step, writer.exec_index, slot),
                               target_dump.tensor(record.step, record.exec_index, tensor.slot)) \
                    if tensor.has_data and writer.tensor(slot).has_data else None
                # read through a view (a weight cast, then transposed) as the target read it; equal statistics
                # of another shape where no view tells (zeros)
                inputs.append(np.reshape(array, tensor.shape) if laid is None else laid)
                continue
            value = _golden_value(record, tensor, writers, readers.get(key, ()), pair, target_dump, golden_dump)
            sliced = _from_a_slice(record, tensor, written, target_dump) if value is None and key is not None \
                and tensor.has_data and writers.producer(record, tensor.slot) is None else None
            if sliced is not None:
                inputs.append(sliced)
                continue
            rounded = _golden_leaf(record, tensor, pair, target_dump, golden_dump) if value is None and \
                key is not None and tensor.has_data and writers.producer(record, tensor.slot) is None else None
            if rounded is not None:  # golden's parameter, as the target rounded it (nothing else reads it here)
                inputs.append(rounded)
                continue
            if own_state and value is not None and writers.producer(record, tensor.slot) is None and \
                    not any(r.direction == "optimizer" for r, _ in readers.get(key, ())):
                value = target_dump.tensor(record.step, record.exec_index, tensor.slot)  # what it carried
                exact = exact and not (given is not None and key not in given and _rounded_narrower(record, tensor,
                                                                                                     pair))
            if value is None:  # no golden counterpart: the target's own value, golden's too where no op of the
                leaf = key is None or writers.producer(record, tensor.slot) is None  # first step wrote it
                exact = exact and (not is_float(tensor.dtype) or tensor.stats.count == 0 or  # (empty: no values)
                                   (leaf and record.step == 0 and not (given is not None and key not in given
                                                                       and _rounded_narrower(record, tensor, pair))))
                value = target_dump.tensor(record.step, record.exec_index, tensor.slot) if tensor.has_data else None
            inputs.append(value)
        narrowing = widened and is_copy(record.type) and len(record.outputs) == 1 and inputs and \
            inputs[0] is not None and _narrower(record.outputs[0].dtype, record.inputs[0].dtype)
        try:
            outputs = [np.asarray(inputs[0])] if narrowing else \
                replay_as_recorded(record, inputs, target_dump.metadata)[0] if as_recorded else \
                replay(record, inputs, device="golden", exact=in_float64)
        except (NotReplayable, RuntimeError, ValueError, TypeError):
            return None
        for tensor, array in zip(record.outputs, outputs):
            if tensor.stats.count:
                written[fingerprint(tensor)] = (array, record, tensor.slot)
    return {key: array for key, (array, _, _) in written.items()}, exact


def _golden_leaf(record: OpRecord, tensor, pair: "_Pairing", target_dump, golden_dump) -> np.ndarray | None:
    """Golden's value of an input no op of the step wrote and no paired op reads (a LayerNorm's weight, which a
    dump of the module alone records only where the target's own ops read it): the one float input of golden's
    ops of that module and direction, of as many values, that the target's value is, rounded to its format bit
    for bit (a simulated float16 run's copy of golden's float32 weight); None without exactly one."""
    if not is_float(tensor.dtype) or not tensor.stats.count:
        return None
    own = np.asarray(target_dump.tensor(record.step, record.exec_index, tensor.slot), dtype=np.float32)
    fmt = FORMATS.get(tensor.dtype)
    found = []
    for golden in pair.same_module(record):
        for candidate in golden.inputs:
            if candidate.stats.count != tensor.stats.count or not candidate.has_data or not is_float(candidate.dtype):
                continue
            value = np.asarray(golden_dump.tensor(golden.step, golden.exec_index, candidate.slot))
            rounded = np.asarray(value, dtype=np.float32)
            if fmt is not None and tensor.dtype not in ("float32", "float64"):
                rounded = fmt.round(rounded)[0]
            if np.array_equal(rounded.reshape(own.shape), own):
                found.append(value.reshape(own.shape))
    return found[0] if len(found) == 1 or found and all(np.array_equal(f, found[0]) for f in found) else None


def _loss_scaling_slots(record: OpRecord) -> set[str]:
    """The input slots of a fused optimizer kernel's ``grad_scale`` and ``found_inf`` (a GradScaler hands them to
    an optimizer that unscales inside): the target's own, whatever op of golden's an op that made them pairs
    with by name."""
    kwargs = (record.attrs or {}).get("kwargs") or {}
    return {f"input_{value['tensor']}" for name, value in kwargs.items()
            if name in ("grad_scale", "found_inf") and isinstance(value, dict) and "tensor" in value}


def _from_a_slice(record: OpRecord, tensor, written: dict, target_dump) -> np.ndarray | None:
    """What the replay wrote at the part of a group's earlier output that ``record`` reads as its input ``tensor``
    through a view no op records (an LSTM cell's time step of the input projection of every step), or None: one
    index of one axis, or a run of them, where the target's values are those it read."""
    stats, read = tensor.stats, None
    for array, writer, slot in reversed(list(written.values())):
        whole = writer.tensor(slot)
        if whole.dtype != tensor.dtype or not whole.has_data or whole.stats.count <= stats.count or \
                whole.stats.count % stats.count or whole.stats.min > stats.min or whole.stats.max < stats.max:
            continue
        if read is None:
            read = target_dump.tensor(record.step, record.exec_index, tensor.slot)
        values = target_dump.tensor(writer.step, writer.exec_index, slot)
        index = _slice_index(values, read)
        if index is not None and np.size(array) == values.size:
            return np.reshape(array, values.shape)[index]
    return None


def _slice_index(whole: np.ndarray, part: np.ndarray) -> tuple | None:
    """The index (one position of one axis, or a run of positions) at which ``whole`` holds ``part``, or None."""
    for axis in range(whole.ndim):
        rest, before = whole.shape[:axis] + whole.shape[axis + 1:], (slice(None),) * axis
        if rest == part.shape:
            found = [k for k in range(whole.shape[axis]) if np.array_equal(np.take(whole, k, axis=axis), part)]
        elif part.ndim == whole.ndim and part.shape[axis] < whole.shape[axis] and \
                rest == part.shape[:axis] + part.shape[axis + 1:]:
            n = part.shape[axis]
            found = [slice(k, k + n) for k in range(whole.shape[axis] - n + 1)
                     if np.array_equal(whole[before + (slice(k, k + n),)], part)]
        else:
            continue
        if found:
            return before + (found[0],)
    return None


class _Pairing:
    """Golden's partner of a target op: the scan's pairing, or for an op it leaves unpaired (another kernel for
    the same work: cudnn_batch_norm_backward where golden ran native_batch_norm_backward) the one golden op of
    the same module and direction with an output of the same size in the same slot."""

    def __init__(self, golden_of, golden_records):
        self.golden_of = golden_of
        self._by_module: dict[tuple, list[OpRecord]] = {}
        for record in golden_records:
            if not record.is_module:
                self._by_module.setdefault((record.direction, module_path(record.name)), []).append(record)
        # golden's widest float format where it holds no value in 16 bits (a float32 run), else None
        self.golden_float32 = bool(golden_records) and not any(
            t.dtype in ("float16", "bfloat16") for r in golden_records for t in r.tensors)

    def same_module(self, record: OpRecord) -> list[OpRecord]:
        """Golden's ops of ``record``'s module and direction."""
        return self._by_module.get((record.direction, module_path(record.name)), [])

    def __call__(self, record: OpRecord, slot: str | None = None) -> OpRecord | None:
        partner = self.golden_of(record)
        if partner is not None or slot is None:
            return partner
        size = record.tensor(slot).stats.count
        found = [g for g in self._by_module.get((record.direction, module_path(record.name)), ())
                 if any(t.slot == slot and t.stats.count == size for t in g.outputs)]
        return found[0] if len(found) == 1 else None


def _golden_value(record: OpRecord, tensor, writers: Consumers, readers, golden_of, target_dump, golden_dump):
    """Golden's value of an input the group reads from outside: what the golden partner of the op that wrote it
    (through casts golden does not run) wrote in the same slot, or where no op of the step wrote it, what the
    golden partner of an op that reads it too read; None where there is no such partner."""
    if not is_float(tensor.dtype) or not tensor.stats.count:
        return None
    writer, key = writers.producer(record, tensor.slot), fingerprint(tensor)
    read, scale = (record, tensor.slot), None  # where the value is read as the group reads it (before an
    # unscaling), and what golden's is to be multiplied by there: the loss scale over golden's, times each
    # unscaling's factor (1 where a GradScaler only checked the gradients, its fused optimizer unscaling them)
    if writer is None:  # a parameter, or state kept from the last step
        return _read_alike(record, tensor, readers, golden_of, target_dump, golden_dump)
    for _ in range(4):  # through the casts golden does not run (autocast's float32 copy of a weight gradient)
        if writer is None or golden_of(writer) is not None:  # and a GradScaler's unscaling of the gradients in
            break  # place, where golden runs none: golden's gradient is the unscaled one
        if writer.type in _UNSCALING:
            slot = next((t.slot for t in writer.outputs if t.stats.count and fingerprint(t) == key), None)
            source = writer.tensor(slot.replace("output_", "input_")) if slot is not None else None
            read = (writer, source.slot) if source is not None else read  # (the same layout, scaled)
            factor = float(np.asarray(target_dump.tensor(writer.step, writer.exec_index, writer.inputs[-1].slot)))
            scale = (loss_scale_ratios(golden_dump, target_dump).get(record.step, 1.0) if scale is None else
                     scale) * factor
        elif is_copy(writer.type):
            source = next((t for t in writer.inputs if t.stats.count and is_float(t.dtype)), None)
        else:
            break
        if source is None:
            break
        writer, key = writers.producer(writer, source.slot), fingerprint(source)
    if writer is None:  # a parameter autocast cast (a convolution's weight in bf16, saved for its backward)
        return _read_alike(record, tensor, readers, golden_of, target_dump, golden_dump)
    slot = next((t.slot for t in writer.outputs if t.stats.count and fingerprint(t) == key), None)
    partner = golden_of(writer, slot) if slot is not None else None
    if partner is None:
        return None
    value = _partner_value(partner, slot, tensor, golden_dump)
    if value is None:
        return None
    value = value if scale is None or scale == 1.0 else (np.asarray(value, np.float64) * scale).astype(value.dtype)
    # read through a view (a weight gradient mm wrote transposed): the view that turns the target's written
    # tensor into the one the group read turns golden's into its counterpart
    return as_read(value, target_dump.tensor(writer.step, writer.exec_index, slot),
                   target_dump.tensor(read[0].step, read[0].exec_index, read[1]))


def _read_alike(record: OpRecord, tensor, readers, golden_of, target_dump, golden_dump) -> np.ndarray | None:
    """Golden's value of an input no op of the step wrote: what the golden partner of an op that reads it too
    read (``readers``: (op, slot) pairs outside the group), as ``record`` reads it; None without one."""
    for reader, slot in readers:
        partner = golden_of(reader)
        value = _partner_value(partner, slot, tensor, golden_dump) if partner is not None else None
        if value is not None:
            value = as_read(value, target_dump.tensor(reader.step, reader.exec_index, slot),
                            target_dump.tensor(record.step, record.exec_index, tensor.slot))
        if value is not None:
            return value
    return None


def as_read(value: np.ndarray, written: np.ndarray, read: np.ndarray) -> np.ndarray | None:
    """``value`` (shaped as ``written``) through the view that makes ``written`` into ``read``: none, a transpose
    (a square matrix's too, told by the values), a reshape, or a reshape and a permutation of up to 4 axes; None
    where none does."""
    written, read = np.asarray(written), np.asarray(read)
    if written.shape == read.shape and np.array_equal(written, read, equal_nan=True):
        return value
    if written.ndim == 2 and written.T.shape == read.shape and np.array_equal(written.T, read, equal_nan=True):
        return np.ascontiguousarray(np.asarray(value).T)  # (kernels such as _fused_sgd_ read memory in order)
    if written.size == read.size and np.array_equal(written.reshape(read.shape), read, equal_nan=True):
        return np.reshape(value, read.shape)
    if written.size == read.size and 2 < read.ndim <= 4:  # a reshape, then a permutation of the axes (attention
        for order in itertools.permutations(range(read.ndim)):  # heads split off and moved before the sequence)
            laid = [read.shape[i] for i in np.argsort(order)]
            if np.array_equal(written.reshape(laid).transpose(order), read, equal_nan=True):
                return np.ascontiguousarray(np.reshape(value, laid).transpose(order))
    return None


def permuted(values, shape: tuple):
    """``values`` (as many as ``shape`` holds) laid out in ``shape``, with its axes in each other order. Up to 4
    axes."""
    if len(shape) > 4:
        return
    for order in itertools.permutations(range(len(shape))):
        if order != tuple(range(len(shape))):
            yield values.reshape(shape).transpose(order)


def _partner_value(partner: OpRecord, slot: str, tensor, golden_dump):
    """Golden's tensor in ``slot`` of ``partner`` (as recorded); None where it has another size or no data."""
    try:
        golden = partner.tensor(slot)
    except KeyError:
        return None
    if not golden.has_data or golden.stats.count != tensor.stats.count:
        return None
    return golden_dump.tensor(partner.step, partner.exec_index, slot)


def introduced_by_group(members: list[OpRecord], golden_members: list[OpRecord], step_records: list[OpRecord],
                        golden_of, target_dump, golden_dump, golden_records: list[OpRecord] = ()) \
        -> tuple[float, bool] | None:
    """(the largest relative error, among the results golden's group hands on, between golden's value and the
    closest value of that size the target's group writes when replayed on golden's inputs (`replay_group`);
    whether every input was golden's), or None where the target's group cannot be replayed or golden's hands
    nothing on."""
    replayed_group = replay_group(members, step_records, golden_of, target_dump, golden_dump, golden_records)
    if replayed_group is None:
        return None
    written, exact = replayed_group
    replayed: dict[int, list[np.ndarray]] = {}
    for record, tensor in group_results(members):
        array = written.get(fingerprint(tensor))
        if array is not None:
            replayed.setdefault(tensor.stats.count, []).append(np.asarray(array))
    worst = None
    writers = Consumers(golden_members)
    for record, tensor in group_results(golden_members):
        if not tensor.has_data or tensor.stats.norm == 0 or tensor.stats.count == 1:  # (single values: the step
            continue  # counters, which a fused kernel keeps inside)
        golden = golden_dump.tensor(record.step, record.exec_index, tensor.slot)
        candidates = [a for a in replayed.get(tensor.stats.count, ()) if a.size == np.size(golden)]
        if not candidates:
            return math.inf, exact  # golden's optimizer writes something of a size the target's does not
        before = value_before(record, writers, golden_dump)
        error = min(_update_error(a.reshape(np.shape(golden)), golden, before, tensor.dtype) for a in candidates)
        worst = error if worst is None else max(worst, error)
    return None if worst is None else (worst, exact)


def value_before(record: OpRecord, writers: Consumers, dump) -> np.ndarray | None:
    """What the tensor that the in-place op ``record`` wrote held before its group's first in-place op on it
    wrote it (a parameter before its update), by following ``input_0`` back through the group's in-place ops
    (``writers``); None where ``record`` is no single-tensor in-place op (``_foreach_*``, fused kernels, or an op
    that writes a new tensor)."""
    for _ in range(64):
        if not record.type.endswith("_") or "_foreach_" in record.type or "_fused_" in record.type:
            return None
        earlier = writers.producer(record, "input_0")
        if earlier is None:
            try:
                return dump.tensor(record.step, record.exec_index, "input_0")
            except KeyError:
                return None
        record = earlier
    return None


def _update_error(replayed: np.ndarray, golden: np.ndarray, before: np.ndarray | None, dtype: str) -> float:
    """The replayed result's error against golden's, relative to golden's update (``golden - before``) where the
    result is a tensor updated in place: an update is a small step on a large parameter, and a rule that changes
    the step by 10 % (a weight decay golden does not apply) moves the parameter by 1e-4 of itself; relative to
    the tensor where there is no ``before`` or no update."""
    if before is not None and np.size(before) == np.size(golden):
        step = np.subtract(golden, np.reshape(before, np.shape(golden)), dtype=np.float64)
        if np.all(np.isfinite(step)) and np.any(step):
            return split_error(replayed - np.reshape(before, np.shape(golden)).astype(np.float64), step,
                               "float64").error
    return split_error(replayed, golden, dtype).error


def module_on_golden_inputs(members: list[OpRecord], target_module: OpRecord, golden_module: OpRecord,
                            step_records: list[OpRecord], golden_of, target_dump, golden_dump,
                            golden_records: list[OpRecord] = (), widened: bool = False,
                            in_float64: bool = False) -> float | None:
    """The largest relative error of golden's module outputs against what the target's ops of that module call
    (``members``, in order) write when run again on golden's inputs (`replay_group`) with the numerics the target
    recorded, or None where that cannot be told (an input without golden's counterpart, an output the replay does
    not write). A module whose replay writes golden's outputs computes golden's function: what it departs by is
    its inputs' error (parameters included), amplified by that function. State it carries from its last call
    (an LSTM's hidden state clamped between steps) is its own, not golden's input. ``widened``: in plain PyTorch,
    its casts to narrower dtypes left out: a module that then writes golden's outputs computes golden's function
    in another precision; ``in_float64``: that in float64 (`replay_group`)."""
    replayed = replay_group(members, step_records, golden_of, target_dump, golden_dump, golden_records, widened,
                            as_recorded=not widened, own_state=True, in_float64=in_float64,
                            given=frozenset(fingerprint(t) for t in target_module.inputs if t.stats.count))
    if replayed is None or not replayed[1]:
        return None
    written = replayed[0]
    writers = {fingerprint(t): (r, t.slot) for r in members for t in r.outputs if t.stats.count and t.has_data}
    errors = []
    for tensor, golden in zip(target_module.outputs, golden_module.outputs):
        if not (is_float(tensor.dtype) and tensor.stats.count and golden.has_data):
            continue
        array = written.get(fingerprint(tensor))
        value = golden_dump.tensor(golden_module.step, golden_module.exec_index, golden.slot)
        if array is not None and np.shape(array) != np.shape(value) and tensor.has_data and \
                fingerprint(tensor) in writers:  # returned through a view: an LSTM's time-major stack, batch first
            writer, slot = writers[fingerprint(tensor)]
            array = as_read(array, target_dump.tensor(writer.step, writer.exec_index, slot),
                            target_dump.tensor(target_module.step, target_module.exec_index, tensor.slot))
        if array is None or np.size(array) != np.size(value):
            return None
        errors.append(split_error(np.reshape(array, np.shape(value)), value, golden.dtype).error)
    return max(errors, default=None)


def backward_on_golden_inputs(members: list[OpRecord], golden_group: list[OpRecord], step_records: list[OpRecord],
                              golden_of, target_dump, golden_dump, golden_records: list[OpRecord] = (),
                              widened: bool = False) -> float | None:
    """The largest relative error of the gradients a module's backward ops hand on (`group_results`) when the
    target's ops of it (``members``, in order) run again on golden's inputs (`replay_group`, with the numerics
    the target recorded, or ``widened``: in plain PyTorch with its casts to narrower dtypes left out), each
    against the closest of golden's results of its size; None where that cannot be told (an input without
    golden's counterpart, a result without a golden one of its size). Under a float16 run the gradient a group
    reads can carry more rounding noise than a change the group makes to it (a 5 % scale): on golden's
    gradient the change stands alone."""
    replayed = replay_group(members, step_records, golden_of, target_dump, golden_dump, golden_records, widened,
                            as_recorded=not widened)
    if replayed is None or not replayed[1]:
        return None
    golden = [(record, tensor, golden_dump.tensor(record.step, record.exec_index, tensor.slot))
              for record, tensor in group_results(golden_group) if tensor.has_data]
    errors = []
    for _, tensor in group_results(members):
        array = replayed[0].get(fingerprint(tensor))
        candidates = [split_error(np.reshape(array, np.shape(value)), value, tensor.dtype).error
                      for _, other, value in golden if array is not None and np.size(value) == np.size(array)]
        if not candidates:
            return None
        errors.append(min(candidates))
    return max(errors, default=None)


def backward_departs(members: list[OpRecord], golden_group: list[OpRecord], step_records: list[OpRecord], golden_of,
                     target_dump, golden_dump, golden_records: list[OpRecord], floor: float) -> float | None:
    """What a backward group's results depart from golden's by when it runs on golden's inputs, as the target
    recorded it and with its casts left out (`backward_on_golden_inputs`): another function where both reach
    ``floor``; else None."""
    errors = [backward_on_golden_inputs(members, golden_group, step_records, golden_of, target_dump, golden_dump,
                                        golden_records, widened) for widened in (False, True)]
    return None if None in errors or min(errors) < floor else min(errors)


def relaid(values, shape: tuple):
    """``values`` (as many as ``shape`` holds) read in each order of ``shape``'s axes and put back in ``shape``'s
    order: what a tensor laid out with those axes permuted holds at each of ``shape``'s positions. Up to 4 axes."""
    if len(shape) > 4:
        return
    for order in itertools.permutations(range(len(shape))):
        if order != tuple(range(len(shape))):
            yield values.reshape([shape[i] for i in order]).transpose(np.argsort(order))


def _rounded_narrower(record: OpRecord, tensor, golden_of) -> bool:
    """Whether the target's own value of ``record``'s input ``tensor`` is in a narrower float format than golden's
    partner op reads in that slot: no state both runs start from, but a value the target rounded (a slice of a
    bf16 query that no recorded op wrote whole, read by a rotary half), whose rounding a replay on golden's
    inputs must not take in."""
    partner = golden_of(record)
    if partner is None:  # (an op golden does not run: in a float32 golden run, a 16-bit value is the target's)
        return getattr(golden_of, "golden_float32", False) and tensor.dtype in ("float16", "bfloat16")
    try:
        golden = partner.tensor(tensor.slot)
    except KeyError:
        return False
    return _narrower(tensor.dtype, golden.dtype)


def _narrower(compute: str, dtype: str) -> bool:
    bits = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
    return bits.get(compute, 0) < bits.get(dtype, 0) and compute in bits
