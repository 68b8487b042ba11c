"""Re-running one forward API call recorded by msprobe, through the PyTorch API it names.

An msprobe record keeps its call's arguments (``attrs["msprobe_args"]`` and
``["msprobe_kwargs"]``, `precision_tool.dump.msprobe_json`): tensors as
``{"tensor": i, "dtype": ...}`` slots, every other value as msprobe wrote it
(``{"type": "float", "value": 0.5}``). The API comes from the record's type:
``Functional.gelu`` is ``torch.nn.functional.gelu``, ``Torch.relu``
``torch.relu``, ``Tensor.add_`` ``torch.Tensor.add_`` (its first tensor is
``self``), ``Aten.mm`` ``torch.ops.aten.mm``. Other families (NPU,
Distributed, MindSpore's) are not replayable.
"""

from __future__ import annotations

import numpy as np
import torch

from precision_tool.dump.records import OpRecord
from precision_tool.torch.replay import NotReplayable


def api_of(op_type: str):
    """The PyTorch callable an msprobe API type names; NotReplayable when there is none."""
    family, _, name = op_type.partition(".")
    owners = {"Functional": torch.nn.functional, "Torch": torch, "Tensor": torch.Tensor, "Aten": torch.ops.aten}
    owner = owners.get(family)
    func = getattr(owner, name, None) if owner is not None and name and "." not in name else None
    if func is None or not callable(func):
        raise NotReplayable(f"{op_type}: not a PyTorch API this replay knows")
    return func


def replay_msprobe(record: OpRecord, input_arrays, exact: bool = False) -> list[np.ndarray]:
    """The outputs of ``record``'s API run again on ``input_arrays`` (one per input slot, in slot order).

    Tensors take their recorded dtypes, so a float16 call computes in float16
    again; ``exact`` computes every float in float64 instead.
    """
    if record.direction != "forward" or record.is_module:
        raise NotReplayable(f"{record.name}: only forward API calls can be replayed")
    attrs = record.attrs or {}
    if "msprobe_args" not in attrs:
        raise NotReplayable(f"{record.name}: the dump holds no arguments for this call")
    func = api_of(record.type)
    arrays = list(input_arrays)
    if len(arrays) != len(record.inputs):
        raise NotReplayable(f"{record.name}: {len(record.inputs)} inputs recorded, {len(arrays)} given")
    tensors = [_tensor(array, tensor.dtype, exact) for array, tensor in zip(arrays, record.inputs)]
    decoder = _Decoder(tensors, exact, record.name)
    args, kwargs = decoder.value(attrs["msprobe_args"]), decoder.value(attrs.get("msprobe_kwargs") or {})
    with torch.no_grad():
        try:
            result = func(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            raise NotReplayable(f"{record.name}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    outputs = [_numpy(t) for t in _flat_tensors(result)]
    if len(outputs) != len(record.outputs):
        raise NotReplayable(f"{record.name}: replayed {len(outputs)} outputs, {len(record.outputs)} recorded")
    return outputs


def _tensor(array, dtype: str, exact: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.array(array, copy=True))
    target = getattr(torch, dtype, None)
    if exact and tensor.is_floating_point():
        target = torch.float64
    if isinstance(target, torch.dtype) and tensor.dtype != target:
        tensor = tensor.to(target)
    return tensor


class _Decoder:
    def __init__(self, tensors: list[torch.Tensor], exact: bool, name: str):
        self.tensors, self.exact, self.name = tensors, exact, name

    def value(self, spec):
        if isinstance(spec, list):
            return [self.value(v) for v in spec]
        if not isinstance(spec, dict):
            return spec
        if "tensor" in spec:
            return self.tensors[spec["tensor"]]
        if "type" not in spec:
            return {k: self.value(v) for k, v in spec.items()}
        return self.scalar(spec)

    def scalar(self, spec: dict):
        kind, value = str(spec.get("type")), spec.get("value")
        if "value" not in spec:
            raise NotReplayable(f"{self.name}: an argument of type {kind} without its value")
        if kind == "torch.dtype":
            dtype = getattr(torch, str(value).removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype):
                raise NotReplayable(f"{self.name}: unknown dtype argument {value!r}")
            return torch.float64 if self.exact and dtype.is_floating_point else dtype
        if kind == "slice" and isinstance(value, list) and len(value) == 3:
            return slice(*value)
        if kind == "torch.Size":
            return torch.Size(value)
        if kind == "ellipsis":
            return Ellipsis
        if kind in ("torch.device", "torch.memory_format", "torch.layout"):
            raise NotReplayable(f"{self.name}: a {kind} argument")
        return value


def _flat_tensors(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return [t for item in result for t in _flat_tensors(item)]
    return []


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype in (torch.float16, torch.bfloat16):
        tensor = tensor.float()
    return tensor.contiguous().numpy().copy()
