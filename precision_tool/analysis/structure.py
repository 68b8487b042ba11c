"""What a dump's records say about the network: module boundaries, op sequences, who consumes what.

* **Modules.** The torch capture records each module's forward call as a
  record named by its module path (``OpRecord.is_module``), after its ops.
  An op belongs to the innermost module whose path prefixes its name and
  whose record follows it.
* **Sequences.** Where golden and target ran different op sequences inside
  one module call (a hand-written activation for a fused kernel, an extra
  op), pairing ops by name inside it pairs unrelated ops: such a module is
  judged at its boundary, and both sequences are shown. Casts that autocast
  inserts do not count as a difference.
* **Consumers.** Which later ops read an op's output, found on the golden
  run (no casts there) by each tensor's statistics: count, min, max, mean and
  norm together identify a tensor within one step, reshaped views included.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from precision_tool.analysis.replay import is_float
from precision_tool.dump.records import OpRecord

# Ops autocast inserts, copies and reshapes that compute nothing: not part of an op sequence (``_unsafe_view`` is
# a reshape the capture records, as it is no alias op: one implementation of a kernel's backward reshapes a
# gradient where another's needs none, the math SDPA's against the CPU flash one's).
_NOT_COMPUTE = frozenset({"aten._to_copy", "aten.to", "aten.clone", "aten.contiguous", "aten.copy_",
                          "aten.lift_fresh_copy", "aten.detach", "aten._unsafe_view", "Cast"})


@dataclass(frozen=True)
class Rewritten:
    """A module call (or one forward op's backward) whose op sequence differs between the runs."""

    name: str  # module path, or the forward op whose backward differs
    direction: str
    golden_ops: tuple[str, ...]
    target_ops: tuple[str, ...]
    golden_record: OpRecord | None  # the module record, or the last backward op of the group
    target_record: OpRecord | None
    target_first: OpRecord | None = None  # backward: the group's op that reads its incoming gradient
    golden_first: OpRecord | None = None
    members: frozenset[tuple[str, str]] = frozenset()  # (direction, name) of the target ops inside it
    target_slot: str = "input_0"  # the slot of target_first / golden_first holding the incoming gradient
    golden_slot: str = "input_0"

    def describe(self) -> str:
        """What each run ran; where the two lists would show alike (their first 12 ops the same), from the
        first op that differs."""
        common = 0
        for golden, target in zip(self.golden_ops, self.target_ops):
            if golden != target:
                break
            common += 1
        if common < _SHOWN or common < 3:
            return f"golden ran {_listing(self.golden_ops)}; the target ran {_listing(self.target_ops)}"
        start = common - 1  # the last op in common, for context
        return (f"after {start} op(s) in common, golden ran {_listing(self.golden_ops[start:])}; the target ran "
                f"{_listing(self.target_ops[start:])}")


_SHOWN = 12  # ops a listing shows


def _listing(types: tuple[str, ...]) -> str:
    shown = ", ".join(t.removeprefix("aten.") for t in types[:_SHOWN])
    return f"[{shown}{', ...' if len(types) > _SHOWN else ''}]"


def is_copy(op_type: str) -> bool:
    """Whether an op of this type only casts or copies (computes nothing)."""
    return op_type in _NOT_COMPUTE


def _compute_types(records: list[OpRecord]) -> tuple[str, ...]:
    return tuple(r.type for r in records if r.type not in _NOT_COMPUTE)


def module_calls(records: list[OpRecord]) -> list[tuple[OpRecord, list[OpRecord]]]:
    """Each module record of one step's forward records with the ops inside that call, in execution order."""
    calls = []
    previous_end: dict[str, int] = {}
    ops = [r for r in records if r.direction == "forward" and not r.is_module]
    for record in records:
        if not record.is_module or record.direction != "forward":  # (a backward module record is no call: paired
            continue  # by occurrence, it stood for a call checkpointing recomputes, with none of golden's ops)
        prefix = record.name + "/"
        start = previous_end.get(record.name, -1)
        inside = [r for r in ops if start < r.exec_index < record.exec_index and r.name.startswith(prefix)]
        previous_end[record.name] = record.exec_index
        calls.append((record, inside))
    return calls


def _occurrences(calls):
    seen: dict[str, int] = defaultdict(int)
    keyed = {}
    for record, inside in calls:
        keyed[(record.name, seen[record.name])] = (record, inside)
        seen[record.name] += 1
    return keyed


def rewritten_modules(golden: list[OpRecord], target: list[OpRecord]) -> list[Rewritten]:
    """The innermost module calls of one step whose forward op sequences differ, in target order."""
    golden_calls = _occurrences(module_calls(golden))
    found, own = [], set()
    recomputes = _recomputes(target) and not _recomputes(golden)
    for key, (record, inside) in _occurrences(module_calls(target)).items():
        partner = golden_calls.get(key)
        if partner is None:
            continue
        g_types, t_types = _compute_types(partner[1]), _compute_types(inside)
        if g_types != t_types and not (recomputes and _uncached(g_types) == _uncached(t_types)):
            g_own, t_own = (_compute_types(_own_ops(call)) for call in (partner, (record, inside)))
            if g_own != t_own and not (recomputes and _uncached(g_own) == _uncached(t_own)):
                own.add(record.name)  # its own code differs too, whatever its submodules run (a residual dropped
                g_types, t_types = g_own, t_own  # in a block whose attention keeps no cache): listed as such
            found.append(Rewritten(record.name, "forward", g_types, t_types, partner[0], record,
                                   members=frozenset((r.direction, r.name) for r in inside)))
    return _innermost(found, own)


def _own_ops(call: tuple[OpRecord, list[OpRecord]]) -> list[OpRecord]:
    """The ops of a module call outside every submodule: those its own forward code runs."""
    record, inside = call
    prefix = len(record.name) + 1
    return [r for r in inside if "/" not in r.name[prefix:]]


def _innermost(found: list[Rewritten], own: set[str] = frozenset()) -> list[Rewritten]:
    """The rewrites no other one lies inside, and those whose own ops (``own``: their names) differ."""
    innermost = [r for r in found if r.name in own or
                 not any(o is not r and o.name.startswith(r.name + "/") for o in found)]
    return sorted(innermost, key=lambda r: r.target_record.exec_index)


def _backward_groups(records: list[OpRecord]) -> dict[str, list[OpRecord]]:
    groups: dict[str, list[OpRecord]] = defaultdict(list)
    for record in records:
        if record.direction == "backward" and "/" in record.name and not record.is_module:
            groups[module_path(record.name)].append(record)
    return groups


def rewritten_backward(golden: list[OpRecord], target: list[OpRecord]) -> list[Rewritten]:
    """Modules whose backward ops (those named after the module's forward ops) differ between the runs.

    Only dumps with module records name backward ops after forward ops this way (the torch capture).
    """
    if not any(r.is_module for r in target):
        return []
    golden_groups, groups = _backward_groups(golden), _backward_groups(target)
    found = []
    writers = None
    # where autograd sums gradients moves with the graph (checkpointing builds a block's again in backward; a cast
    # adds a node): groups that differ only there, as many sums and buffers in all as golden's, are no rewrite;
    # one sum fewer in all is one fewer reader (a weight golden ties and the target does not)
    moved = (_recomputes(target) and not _recomputes(golden)) or _placements(golden_groups) == _placements(groups)
    for name, group in groups.items():
        partner = golden_groups.get(name)
        if partner is None:
            continue
        g_types, t_types = _compute_types(partner), _compute_types(group)
        if g_types != t_types and not (moved and _placed(g_types) == _placed(t_types)):
            if writers is None:
                writers = tuple(Consumers([r for r in records if r.direction == "backward"])
                                for records in (golden, target))
            golden_first, golden_slot = _incoming(partner, writers[0]) or (partner[0], "input_0")
            target_first, target_slot = _reads_incoming(group, _count(golden_first, golden_slot), writers[1])
            found.append(Rewritten(name, "backward", g_types, t_types, partner[-1], group[-1], target_first,
                                   golden_first, frozenset((r.direction, r.name) for r in group), target_slot,
                                   golden_slot))
    return _innermost(found)


PLACED = frozenset({"aten.add", "aten.zeros", "aten.zeros_like", "aten.empty", "aten.empty_like", "aten.new_zeros"})


def _recomputes(records: list[OpRecord]) -> bool:
    """Whether a step's forward ops run again (activation checkpointing: a recomputed op takes the name its first
    call had, `precision_tool.torch.naming`)."""
    seen: set[str] = set()
    for record in records:
        if record.direction == "forward" and not record.is_module:
            if record.name in seen:
                return True
            seen.add(record.name)
    return False


def _placements(groups: dict) -> Counter:
    """How many ops of each `PLACED` type the backward ``groups`` run in all."""
    return Counter(r.type for group in groups.values() for r in group if r.type in PLACED)


def _uncached(types: tuple[str, ...]) -> tuple[str, ...]:
    """``types`` without concatenations: a model that checkpoints its blocks keeps no key/value cache
    (transformers turns ``use_cache`` off), golden's appends to one."""
    return tuple(t for t in types if t != "aten.cat")


def _placed(types: tuple[str, ...]) -> tuple[str, ...]:
    """``types`` without the ops whose place in backward the graph's shape decides: the sum of a tensor's
    gradients from its several readers (the engine adds them where the last arrives), and the buffers it
    allocates. Checkpointing builds the graph of a block again in backward, and such ops land in other groups."""
    return tuple(t for t in types if t not in PLACED)


def rewritten_optimizer(golden: list[OpRecord], target: list[OpRecord]) -> list[Rewritten]:
    """The optimizers (``optimizer/<class>``) of one step whose update ops differ between the runs: a state
    reset (a momentum buffer made again), another update rule. Pairing their ops by name would pair unrelated
    updates; the group is judged at its last op, by the parameters it writes."""
    def groups(records):
        found: dict[str, list[OpRecord]] = defaultdict(list)
        for record in records:
            if record.direction == "optimizer" and not record.is_module:
                found[module_path(record.name)].append(record)
        return found

    golden_groups = groups(golden)
    found = []
    for name, group in groups(target).items():
        partner = golden_groups.get(name)
        if partner is None:
            continue
        g_types, t_types = _compute_types(partner), _compute_types(group)
        if g_types != t_types:
            found.append(Rewritten(name, "optimizer", g_types, t_types, partner[-1], group[-1], group[0], partner[0],
                                   frozenset((r.direction, r.name) for r in group)))
    return found


@dataclass(frozen=True)
class MissingBackward:
    """A module whose backward golden runs and the target runs none of: no gradient reaches it in the target."""

    name: str  # module path, the outermost one whose backward is missing
    golden_ops: tuple[str, ...]
    golden_records: tuple[OpRecord, ...]  # golden's backward ops inside it, in execution order


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def missing_backward(golden: list[OpRecord], target: list[OpRecord]) -> list[MissingBackward]:
    """Modules of one step whose forward both runs ran and whose backward ops golden runs and the target does
    not run at all, outermost first, in golden's execution order: a detached output, a branch computed without
    gradients, parameters frozen where nothing below them needs a gradient.

    Only dumps with module records name backward ops after forward ops this way (the torch capture). In a
    module-level dump (module calls only) the module calls' backward records stand for the ops.
    """
    if not any(r.is_module for r in target):
        return []
    modules_only = all(r.is_module for r in target)
    has_backward = {p for r in target if r.direction == "backward" and r.is_module == modules_only
                    and (not modules_only or any(t.stats.count for t in r.inputs))  # (a call no gradient reached
                    for p in _prefixes(owning_module(r))}  # at its outputs, recorded for its inputs' gradients)
    # a module ran forward where the target holds its call's record or an op of its own: a dump of some modules
    # only (a zoom region) holds no record of the modules around them, and their backward records are absent too
    ran_forward = {owning_module(r) for r in target if r.direction == "forward"}
    groups: dict[str, list[OpRecord]] = defaultdict(list)
    for record in golden:
        if record.direction != "backward" or record.is_module != modules_only or "/" not in record.name or \
                (modules_only and not any(t.stats.count for t in record.inputs)):  # (no gradient reached it)
            continue
        path = owning_module(record)
        outermost = next((p for p in _prefixes(path) if p and p not in has_backward and p in ran_forward), None)
        if outermost is not None:
            groups[outermost].append(record)
    if modules_only:
        groups = _cut_modules(target, groups)
    found = [MissingBackward(name, _compute_types(records), tuple(records)) for name, records in groups.items()
             if _compute_types(records)]
    return sorted(found, key=lambda m: m.golden_records[0].exec_index)


def _cut_modules(target: list[OpRecord], groups: dict) -> dict:
    """The modules of a module-level dump whose backward record is missing because no gradient reaches their
    outputs. A call is recorded in backward once the gradients at its inputs arrive, so a call whose inputs need
    none (a LayerNorm after a frozen Linear) has no record though its backward ran: a module call reading its
    output that passed back a gradient there shows that one reached it. And a call that hands on what it reads
    (a dropout at p=0, an identity), reading the output of a module cut off, misses its backward by that module's
    cut (a dropout after a detached attention). Which call of a chain cut off cut it is otherwise ambiguous in
    module calls (an attention detached and the LayerNorm before it both miss theirs): the last in golden's
    backward is named, as for ops."""
    forward = [r for r in target if r.is_module and r.direction == "forward"]
    passed_back = {(r.name, t.slot.replace("output_", "input_", 1)) for r in target
                   if r.is_module and r.direction == "backward" for t in r.outputs}
    written = {name: {fingerprint(t) for r in forward if r.name == name for t in r.outputs if t.stats.count}
               for name in groups}

    def related(a: str, b: str) -> bool:
        return a == b or a.startswith(b + "/") or b.startswith(a + "/")

    def reached(name: str) -> bool:
        return any((r.name, t.slot) in passed_back for r in forward if not related(r.name, name)
                   for t in r.inputs if t.stats.count and fingerprint(t) in written[name])

    def handed_on(name: str) -> bool:
        read = {fingerprint(t) for r in forward if r.name == name for t in r.inputs if t.stats.count}
        return bool(written[name]) and written[name] <= read and \
            any(f in written[other] for f in read for other in groups if not related(other, name))

    return {name: records for name, records in groups.items() if not reached(name) and not handed_on(name)}


def under(path: str, module: str) -> bool:
    """Whether ``path`` is the module path ``module`` or inside it."""
    return path == module or path.startswith(module + "/")


def _incoming(group: list[OpRecord], writers: Consumers, count: int | None = None) -> tuple[OpRecord, str] | None:
    """(op, slot) of the group's first float input that an earlier backward op outside the group wrote: the
    gradient handed in (a saved forward tensor has no backward writer; a value the group made, a writer inside
    it). With ``count``, only inputs of that many elements. None when no input qualifies."""
    members = {id(r) for r in group}
    for record in group:
        for tensor in record.inputs:
            if not is_float(tensor.dtype) or not tensor.stats.count or (count is not None
                                                                         and tensor.stats.count != count):
                continue
            writer = writers.producer(record, tensor.slot)
            if writer is not None and id(writer) not in members:
                return record, tensor.slot
    return None


def _count(record: OpRecord, slot: str) -> int | None:
    try:
        return record.tensor(slot).stats.count
    except KeyError:
        return None


def _reads_incoming(group: list[OpRecord], count: int | None, writers: Consumers) -> tuple[OpRecord, str]:
    """(op, slot) of a target backward group where it reads the incoming gradient, of ``count`` elements (as many
    as golden's): the input a backward op outside the group wrote (`_incoming`); else the first op whose first
    input has that many elements. The group may open with ops that read nothing from outside (a hook's
    ``randn``) or with ops reading a saved forward tensor of the gradient's size (a hand-written backward's
    ``sigmoid(x)``); the group's first op when nothing matches."""
    found = _incoming(group, writers, count)
    if found is not None:
        return found
    for record in group:
        inputs = record.inputs
        if count is not None and inputs and inputs[0].slot == "input_0" and inputs[0].stats.count == count:
            return record, "input_0"
    return group[0], "input_0"


def enclosing_module(record: OpRecord, records: list[OpRecord]) -> OpRecord | None:
    """The innermost module call of ``records`` (one step) that a forward op ran in."""
    best = None
    for candidate in records:
        if not candidate.is_module or candidate.exec_index <= record.exec_index:
            continue
        if record.name.startswith(candidate.name + "/") and (best is None or len(candidate.name) > len(best.name)
                                                            or (len(candidate.name) == len(best.name)
                                                                and candidate.exec_index < best.exec_index)):
            best = candidate
    return best


def module_path(name: str) -> str:
    """The module path in an op name: everything before its first ``aten.``-style op component."""
    parts = name.split("/")
    for i, part in enumerate(parts):
        if "." in part and part.split(".", 1)[0].isidentifier() and not part.split(".", 1)[1][:1].isdigit() \
                and part.rsplit("_", 1)[-1].isdigit():
            return "/".join(parts[:i])
    return "/".join(parts[:-1])


def owning_module(record: OpRecord) -> str:
    """The module a verdict on ``record`` names: a module call's own path, or the path an op lies in."""
    return record.name if record.is_module else module_path(record.name)


def is_a_loss(record: OpRecord) -> bool:
    """Whether ``record`` is a forward op whose float outputs are single values: a loss (what a script reads and
    stops at when it is not finite, so that nothing after it reads it but the check)."""
    floats = [t for t in record.outputs if is_float(t.dtype)]
    return record.direction == "forward" and bool(floats) and all(t.stats.count == 1 for t in floats)


def fingerprint(tensor) -> tuple:
    """What identifies a tensor within a step: count, min and max (values of its own), mean and norm to 40
    bits. No shape: an op often reads a reshaped view of what another wrote; and sums of the same values can
    differ in their last bits where two statistics passes read them in other orders (BERT's attention output,
    written by a clone and read as a matrix by the output projection: a norm 3.5e-16 apart)."""
    s = tensor.stats
    return s.count, s.min, s.max, _to_40_bits(s.mean), _to_40_bits(s.norm)


def _to_40_bits(value: float) -> float:
    if value != value or value in _INFINITE:
        return value
    mantissa, exponent = math.frexp(value)
    return math.ldexp(round(mantissa * 1099511627776.0), exponent - 40)  # 2**40


_INFINITE = (math.inf, -math.inf)


class Consumers:
    """Which records of one step and direction read and write each tensor (by statistics fingerprint), indexed on
    first use."""

    def __init__(self, records: list[OpRecord]):
        self._records = records
        self._built: tuple[dict, dict] | None = None

    def _index(self) -> tuple[dict[tuple, list[OpRecord]], dict[tuple, list[OpRecord]]]:
        """(readers, writers) of each fingerprint, in the records' order."""
        if self._built is None:
            readers: dict[tuple, list[OpRecord]] = defaultdict(list)
            writers: dict[tuple, list[OpRecord]] = defaultdict(list)
            for record in self._records:
                if not record.is_module:
                    for index, tensors in ((readers, record.inputs), (writers, record.outputs)):
                        for tensor in tensors:
                            if tensor.stats.count:
                                index[fingerprint(tensor)].append(record)
            self._built, self._records = (readers, writers), []
        return self._built

    def producer(self, record: OpRecord, slot: str) -> OpRecord | None:
        """The latest earlier record whose output is ``record``'s input ``slot``."""
        try:
            tensor = record.tensor(slot)
        except KeyError:
            return None
        writers = [w for w in self._index()[1].get(fingerprint(tensor), ()) if w.exec_index < record.exec_index]
        return writers[-1] if writers else None

    def rewriter(self, record: OpRecord, slot: str) -> OpRecord | None:
        """`producer` of ``record``'s input ``slot`` where it computed the value from a float input as large (an
        update in place, a renorm), not where it drew or filled it."""
        writer = self.producer(record, slot)
        if writer is None:
            return None
        count = record.tensor(slot).stats.count
        return writer if any(is_float(t.dtype) and t.stats.count == count for t in writer.inputs) else None

    def written_before(self, record: OpRecord):
        """(writer, output tensor) of every output written before ``record``, the latest first."""
        found = [(writer, tensor) for writers in self._index()[1].values() for writer in writers
                 if writer.exec_index < record.exec_index for tensor in writer.outputs if tensor.stats.count]
        return sorted(found, key=lambda item: -item[0].exec_index)

    def of(self, record: OpRecord, slots=None) -> list[OpRecord]:
        """The later records that read one of ``record``'s outputs (those in ``slots``, default all)."""
        found: dict[int, OpRecord] = {}
        for tensor in record.outputs:
            if not tensor.stats.count or (slots is not None and tensor.slot not in slots):
                continue
            for reader in self._index()[0].get(fingerprint(tensor), ()):
                if reader.exec_index > record.exec_index:
                    found.setdefault(id(reader), reader)
        return sorted(found.values(), key=lambda r: r.exec_index)


def forward_writers(members: list[OpRecord], step_records: list[OpRecord]) -> list[OpRecord]:
    """The forward ops of the step that wrote what the backward group ``members`` reads besides gradients: the
    values forward saved for it (a softmax's output, a matmul's operands), which carry the forward's error."""
    writers = Consumers([r for r in step_records if r.direction == "forward"])
    found: dict[int, OpRecord] = {}
    for record in members:
        for tensor in record.inputs:
            writer = writers.producer(record, tensor.slot) if tensor.stats.count and is_float(tensor.dtype) else None
            if writer is not None:
                found.setdefault(id(writer), writer)
    return list(found.values())


def group_results(records: list[OpRecord]) -> list[tuple[OpRecord, object]]:
    """(record, float output tensor) for each output of ``records`` (one group, in order) that no later record
    of the group reads: what the group hands on."""
    readers = Consumers(records)
    return [(record, tensor) for record in records for tensor in record.outputs
            if is_float(tensor.dtype) and tensor.stats.count
            and not any(r.exec_index > record.exec_index for r in readers.of(record, {tensor.slot}))]


def occurrence_keys(records: list[OpRecord]) -> dict[int, tuple]:
    """``id(record)`` -> (step, direction, name, occurrence): what pairs a target op with golden's (an op name
    repeats when a module is called more than once in a step)."""
    seen: dict[tuple, int] = {}
    keys = {}
    for record in records:
        base = (record.step, record.direction, record.name)
        keys[id(record)] = (*base, seen.get(base, 0))
        seen[base] = seen.get(base, 0) + 1
    return keys
