"""Tiny msprobe-format dumps written by hand: ``step<N>/rank<R>/dump.json`` and ``dump_tensor_data/*.npy``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

X = np.array([[-1.0, 0.5], [2.0, -0.25]], np.float32)
GELU = np.array([[-0.15865526, 0.34573123], [1.9544997, -0.10032275]], np.float32)


def spec(array: np.ndarray | None, name: str | None = None, dtype: str = "torch.float32", shape=None, **stats) -> dict:
    """One tensor's dump.json entry: statistics computed from ``array`` (or given), a data_name when ``name``."""
    entry = {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape if shape is not None else array.shape)}
    if array is not None:
        values = array.astype(np.float64)
        entry.update(Max=float(values.max()), Min=float(values.min()), Mean=float(values.mean()),
                     Norm=float(np.linalg.norm(values)))
    entry.update(stats)
    entry["requires_grad"] = False
    if name is not None:
        entry["data_name"] = name
    return entry


def write_rank(folder: Path, data: dict, arrays: dict[str, np.ndarray] | None = None, task: str = "tensor",
               construct: dict | None = None, text: str | None = None) -> Path:
    """A rank directory: dump.json of ``data`` (or the raw ``text``), the arrays as .npy files."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {"task": task, "level": "mix", "framework": "pytorch",
                "dump_data_dir": str(folder / "dump_tensor_data") if arrays else None, "data": data}
    (folder / "dump.json").write_text(text if text is not None else json.dumps(document, indent=1))
    if arrays:
        (folder / "dump_tensor_data").mkdir(exist_ok=True)
        for name, array in arrays.items():
            np.save(folder / "dump_tensor_data" / name, array)
    if construct is not None:
        (folder / "construct.json").write_text(json.dumps(construct))
    return folder


def gelu_run(root: Path, scale: float = 1.0, steps: int = 1, task: str = "tensor") -> Path:
    """A two-op forward (gelu, then mul by 2) and gelu's backward, ``scale`` planted on gelu's output."""
    out = GELU * np.float32(scale)
    doubled = out * np.float32(2)
    grad = np.ones_like(X)
    for step in range(steps):
        arrays = {"Functional.gelu.0.forward.input.0.npy": X, "Functional.gelu.0.forward.output.0.npy": out,
                  "Tensor.mul.0.forward.input.0.npy": out, "Tensor.mul.0.forward.output.0.npy": doubled,
                  "Functional.gelu.0.backward.input.0.npy": grad,
                  "Functional.gelu.0.backward.output.0.npy": grad * np.float32(scale)}
        named = task == "tensor"
        data = {
            "Functional.gelu.0.forward": {
                "input_args": [spec(X, "Functional.gelu.0.forward.input.0.npy" if named else None)],
                "input_kwargs": {"approximate": {"type": "str", "value": "none"}},
                "output": [spec(out, "Functional.gelu.0.forward.output.0.npy" if named else None)]},
            "Tensor.mul.0.forward": {
                "input_args": [spec(out, "Tensor.mul.0.forward.input.0.npy" if named else None),
                               {"type": "int", "value": 2}],
                "input_kwargs": {},
                "output": [spec(doubled, "Tensor.mul.0.forward.output.0.npy" if named else None)]},
            "Functional.gelu.0.backward": {
                "input": [spec(grad, "Functional.gelu.0.backward.input.0.npy" if named else None)],
                "output": [spec(grad * np.float32(scale),
                                "Functional.gelu.0.backward.output.0.npy" if named else None)]},
        }
        write_rank(root / f"step{step}" / "rank0", data, arrays if named else None, task)
    return root
