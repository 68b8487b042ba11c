"""Building a step's ``index`` table from the writer's rows: the columns that describe each tensor.

Split from `precision_tool.dump.writer`, which keeps the rows and the HDF5
side; these functions only turn rows into numpy structured arrays, fast for
the hundreds of rows a training step repeats (layout in `dump.layout`).
"""

from __future__ import annotations

import numpy as np

from precision_tool.dump import layout


def describe_tensors(columns: list, counts: list) -> tuple[np.ndarray, dict[int, list[int]]]:
    """An ``index`` table with the columns that describe each tensor filled, statistics zero; and the
    shapes of rank above ``layout.MAX_RANK`` by row (they go to a step attribute). ``columns`` are the
    tensors' kinds, slots, dtypes and shapes (`describing_columns`), ``counts`` each op's number of tensors."""
    kinds, slots, dtypes, shapes = columns
    table = np.zeros(len(kinds), dtype=layout.tensor_row_dtype())
    long_shapes: dict[int, list[int]] = {}
    if not kinds:
        return table, long_shapes
    table["op"] = np.repeat(np.arange(len(counts)), counts)
    table["kind"] = kinds
    table["slot"] = slots
    # a step has a few dozen distinct shapes and dtypes among hundreds of rows: convert each once
    unique_dtypes, positions = distinct(dtypes)
    table["dtype"] = np.array(unique_dtypes, dtype=table.dtype["dtype"])[positions]
    unique_shapes, positions = distinct(shapes)
    table["shape"] = np.array([_pad(shape) for shape in unique_shapes], dtype=np.int64)[positions]
    table["ndim"] = np.array([len(shape) for shape in unique_shapes], dtype=np.uint8)[positions]
    for which, shape in enumerate(unique_shapes):
        if len(shape) > layout.MAX_RANK:
            long_shapes.update({row: list(shape) for row in np.flatnonzero(positions == which).tolist()})
    return table, long_shapes


def describing_columns(entries: list) -> list:
    """The kinds, slots, dtypes and shapes of the writer's tensor rows (kind, index, dtype, shape, stats, ...),
    one tuple each: a training step's are its previous step's, and tuples compare in C."""
    if not entries:
        return [(), (), (), ()]
    return list(zip(*entries))[:4]


def op_table(rows: list, previous: tuple | None) -> np.ndarray:
    """A step's ``op_index`` table from its rows (`DumpWriter._op_row`).

    ``previous`` is (rows, table) of the step written before. A training loop
    repeats its ops every step: equal rows give the very same table, and rows
    of which a few changed (an optimizer's bias correction, a scalar argument
    of the step) a copy of it with those rows replaced, as long as their text
    fits its columns. Otherwise the table is built, its text columns as wide
    as their longest value.
    """
    if previous is not None:
        old_rows, old_table = previous
        if old_rows == rows:
            return old_table
        if len(old_rows) == len(rows):
            changed = [i for i, (old, new) in enumerate(zip(old_rows, rows)) if old != new]
            if len(changed) * 8 <= len(rows) and all(_fits(rows[i], old_table.dtype) for i in changed):
                table = copy_table(old_table)
                for i in changed:
                    table[i] = rows[i]
                return table
    columns = list(zip(*rows))
    widths = tuple(max(map(len, columns[column])) for column in _TEXT_COLUMNS)
    return np.array(rows, dtype=layout.op_row_dtype(widths))


_TEXT_COLUMNS = (7, 8, 10, 11)  # name, type, fusion, attrs: as wide as their longest value


def _fits(row: tuple, dtype: np.dtype) -> bool:
    """Whether the text of an op row fits the columns of a table of ``dtype`` (numpy would cut it short)."""
    return all(len(row[column]) <= dtype[column].itemsize for column in _TEXT_COLUMNS)


def copy_table(table: np.ndarray) -> np.ndarray:
    """A copy of a structured array, byte for byte (numpy copies packed records field by field, 6x slower)."""
    return table.view(np.uint8).copy().view(table.dtype)


def distinct(values: tuple) -> tuple[list, np.ndarray]:
    """The distinct ``values`` in first-seen order, and the position of each value among them."""
    unique = list(dict.fromkeys(values))
    position = {value: i for i, value in enumerate(unique)}
    return unique, np.fromiter(map(position.__getitem__, values), np.intp, count=len(values))


def _pad(shape: tuple) -> tuple:
    return (tuple(shape) + (0,) * layout.MAX_RANK)[:layout.MAX_RANK]


def op_group_attrs(h5, gid, exec_index: int, direction: str, op_type: str, compute_dtype: str, overflow: bool,
                   fusion) -> None:
    """The attributes a reader of an op's group needs (``h5``: a `LowLevel`); the exact name,
    inherited_nonfinite, the op's attributes and the fusion origins are in the step's op_index (each
    attribute costs ~25 us)."""
    h5.attr(gid, "type", op_type)
    h5.attr(gid, "exec_index", np.int64(exec_index))
    h5.attr(gid, "direction", direction)
    h5.attr(gid, "compute_dtype", compute_dtype)
    h5.attr(gid, "overflow", bool(overflow))
    if fusion is not None:
        pass_name, names = fusion_fields(fusion)[:2]
        h5.attr(gid, "pass_name", pass_name)
        h5.attr(gid, "original_names", layout.dumps(names))


def fusion_fields(fusion) -> tuple:
    """(pass_name, original_names, original_types, output_origins, input_origins) of a tuple or FusionInfo."""
    if isinstance(fusion, tuple):
        return fusion
    return (fusion.pass_name, fusion.original_names, fusion.original_types, fusion.output_origins,
            fusion.input_origins)


class JsonColumns:
    """op_index's ``attrs`` and ``fusion`` columns as UTF-8 JSON, encoded again only when an op's object changes.

    A training loop passes each op the same attrs and fusion objects every
    step: keyed by op name and checked by identity, each is encoded once.
    """

    def __init__(self) -> None:
        self._attrs: dict[str, tuple] = {}  # op name -> (attrs object, JSON)
        self._fusion: dict[str, tuple] = {}

    def attrs(self, name: str, attrs) -> bytes:
        if not attrs:
            return b""
        cached = self._attrs.get(name)
        if cached is None or cached[0] is not attrs:
            cached = self._attrs[name] = (attrs, layout.dumps(attrs).encode())
        return cached[1]

    def fusion(self, name: str, fusion) -> bytes:
        if fusion is None:
            return b""
        cached = self._fusion.get(name)
        if cached is None or cached[0] is not fusion:
            pass_name, names, types, outputs, inputs = fusion_fields(fusion)
            text = layout.dumps({"pass_name": pass_name, "original_names": names, "original_types": types,
                                 "output_origins": outputs, "input_origins": inputs})
            cached = self._fusion[name] = (fusion, text.encode())
        return cached[1]
