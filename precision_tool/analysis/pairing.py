"""Pairing the training loop's own ops (those outside every module) by what they compute, not by their number.

Dumps name an op outside any module by its type and its occurrence in the
step (``aten.mul_1``). The training loop's ops are there: the loss, gradient
clipping, a GradScaler's ``loss * scale`` and its unscaling. When the target
runs one such op golden does not (a GradScaler's multiplication), every later
op of that type is numbered one higher and pairing by name pairs unrelated
ops: clipping's ``mul`` with the scaler's. `align_loop_ops` pairs them by
aligning the two op sequences instead (`difflib`), each op standing for its
type and its tensors' slots and shapes (not dtypes: autocast changes those);
casts and copies are left to the name pairing.

A module's layout copies are numbered the same way: ``reshape`` of a tensor
that is not contiguous (channels_last activations unfolded into patches)
copies it, ``clone`` then ``_unsafe_view``, where golden's contiguous tensor
is only viewed. Every later copy of that module is then numbered one higher.
`align_layout_copies` aligns a module's copies by their slots and shapes, and
re-pairs the backward ops named after them.
"""

from __future__ import annotations

from collections import defaultdict
from difflib import SequenceMatcher

from precision_tool.analysis.structure import is_copy, module_path
from precision_tool.dump.records import OpRecord


def _outside_modules(record: OpRecord) -> bool:
    return not record.is_module and module_path(record.name) == "" and not is_copy(record.type)


def _signature(record: OpRecord) -> tuple:
    return record.type, tuple((t.slot, tuple(t.shape)) for t in record.tensors)


def align_loop_ops(golden: list[OpRecord], target: list[OpRecord]) -> dict[int, OpRecord | None]:
    """``id(target record)`` -> its golden partner (None: golden runs no such op) for the ops outside every module
    of one step, per direction, where the alignment differs from pairing by name. Empty when they agree."""
    changed: dict[int, OpRecord | None] = {}
    for direction in ("forward", "backward"):
        g = [r for r in golden if r.direction == direction and _outside_modules(r)]
        t = [r for r in target if r.direction == direction and _outside_modules(r)]
        if not t or [r.name for r in g] == [r.name for r in t]:
            continue
        partner: dict[int, OpRecord] = {}
        matcher = SequenceMatcher(None, [_signature(r) for r in g], [_signature(r) for r in t], autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                partner[id(t[block.b + k])] = g[block.a + k]
        by_name = {r.name: r for r in g}
        for record in t:
            found = partner.get(id(record))
            named = by_name.get(record.name)
            if found is not named:
                changed[id(record)] = found
    return changed


_LAYOUT = frozenset({"aten.clone", "aten._unsafe_view"})  # what reshape runs on a tensor it cannot view


def align_layout_copies(golden: list[OpRecord], target: list[OpRecord]) -> dict[int, OpRecord | None]:
    """``id(target record)`` -> its golden partner (None: golden runs no such copy) for the forward layout copies
    of each module whose copies differ from golden's in number or shape, and for the backward ops named after
    them (``<forward op>/<op>_<k>``). Empty when every module copies as golden's does."""
    groups: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for side, records in enumerate((golden, target)):
        for record in records:
            if record.direction == "forward" and record.type in _LAYOUT and not record.is_module:
                groups[module_path(record.name)][side].append(record)
    changed: dict[int, OpRecord | None] = {}
    renamed: dict[str, str | None] = {}  # a target copy's name -> its golden partner's
    for g, t in groups.values():
        signatures = [_signature(r) for r in g], [_signature(r) for r in t]
        if signatures[0] == signatures[1]:
            continue
        partner: dict[int, OpRecord] = {}
        for block in SequenceMatcher(None, *signatures, autojunk=False).get_matching_blocks():
            for k in range(block.size):
                partner[id(t[block.b + k])] = g[block.a + k]
        for record in t:
            found = partner.get(id(record))
            if found is None or found.name != record.name:
                changed[id(record)] = found
                renamed[record.name] = None if found is None else found.name
    if renamed:
        backward = {r.name: r for r in golden if r.direction == "backward"}
        for record in target:
            head, _, tail = record.name.rpartition("/")
            if record.direction == "backward" and head in renamed:
                changed[id(record)] = None if renamed[head] is None else backward.get(f"{renamed[head]}/{tail}")
    return changed
