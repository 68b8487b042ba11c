"""Reading one tensor saved with ``torch.save`` (an msprobe ``.pt`` file) as a numpy array.

Only ``precision_tool.dump.msprobe`` calls this, and only when a dump
refers to a ``.pt`` file: the core needs no PyTorch for anything else.
"""

from __future__ import annotations

import numpy as np
import torch

from precision_tool.errors import InputError, memory_ran_out


def load_pt(path: str) -> tuple[np.ndarray, str]:
    """(values, dtype) of the tensor in ``path``: 16-bit floats widened to float32 (exact), others as stored."""
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types (pickle, zip, RuntimeError) for a damaged file
        if memory_ran_out(exc):  # the machine's limit, not the file's damage: the one out-of-memory line
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(path, f"unreadable .pt file ({first})") from None
    if not isinstance(value, torch.Tensor):
        raise InputError(path, f"holds a {type(value).__name__}, not a tensor")
    dtype = str(value.dtype).removeprefix("torch.")
    value = value.detach()
    if value.dtype in (torch.float16, torch.bfloat16):
        value = value.float()
    try:
        return value.contiguous().numpy(), dtype
    except (TypeError, RuntimeError) as exc:  # complex32, quantized and other dtypes numpy lacks
        raise InputError(path, f"a {dtype} tensor numpy cannot hold ({exc})") from None
