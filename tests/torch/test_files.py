"""`precision_tool.torch.files`: reading msprobe's .pt tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_running_out_of_memory_while_loading_a_pt_file_is_not_called_damage(tmp_path, monkeypatch):
    """torch.load raising its allocator's out-of-memory error is the machine's limit: it reaches the one
    out-of-memory line, not "unreadable .pt file" (exit 2, as if the file were damaged)."""
    from precision_tool.errors import InputError
    from precision_tool.torch import files

    path = tmp_path / "t.pt"
    torch.save(torch.ones(3), path)
    assert files.load_pt(str(path))[0].tolist() == [1.0, 1.0, 1.0]

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(torch, "load", no_memory)
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        files.load_pt(str(path))
    monkeypatch.setattr(torch, "load", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("PytorchStreamReader failed")))
    with pytest.raises(InputError, match="unreadable .pt file"):
        files.load_pt(str(path))
