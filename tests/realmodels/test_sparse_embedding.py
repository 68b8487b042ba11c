"""Sparse gradients and an embedding's renorm (probe P c12, c30, f15).

An ``nn.Embedding(sparse=True)`` gives its weight a sparse COO gradient, which has no strided memory: capture in
dump and overflow mode stopped the user's training with a RuntimeError (``data_ptr`` of a tensor without storage,
``t()`` of a sparse tensor), and statistics mode recorded it as empty. A dump keeps a sparse tensor's statistics,
those of the dense tensor it stands for, and no values.

``nn.Embedding(max_norm=...)`` in the target only renormalises the rows it reads, in place, before the lookup
(``aten.embedding_renorm_``): the lookup then reads a weight golden's never had, which the scan took for other
weights or data ("the runs differ before any op"). A value an op only the target runs rewrote is no leaf there:
the Embedding module that runs the renorm is named.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, mode: str, target: bool, max_norm: float | None = None, steps: int = 3) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8, sparse=True, max_norm=max_norm), nn.Flatten(), nn.Linear(32, 16),
                          nn.GELU(), nn.Linear(16, 3))
    sparse = torch.optim.SparseAdam(list(model[0].parameters()), lr=1e-2)
    dense = torch.optim.Adam(list(model[2].parameters()) + list(model[4].parameters()), lr=1e-3)
    ids = torch.randint(0, 50, (4, 4), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 0])
    with ptt.dump(path, mode=mode):
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                loss = nn.functional.cross_entropy(model(ids).float(), labels)
            sparse.zero_grad()
            dense.zero_grad()
            loss.backward()
            sparse.step()
            dense.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode", ["dump", "stats", "overflow"])
def test_a_sparse_gradient_is_recorded_by_its_statistics(tmp_path, mode):
    from precision_tool.dump.reader import open_dump

    _train(tmp_path / "run.h5", mode, target=False, steps=2)
    with open_dump(tmp_path / "run.h5") as dump:
        assert dump.complete and [s.step for s in dump.steps()] == [0, 1]
        if mode == "overflow":
            return  # (nothing overflowed: no op is recorded)
        grad = dump.op(0, "Sequential/0/aten.embedding_0/aten._sparse_coo_tensor_with_dims_and_tensors_0",
                       "backward")
        gradient, rows = grad.tensor("output_0"), grad.tensor("input_1")  # (the values it stores: a row a lookup)
        assert (gradient.shape, gradient.has_data, rows.shape, rows.has_data) == ((50, 8), False, (16, 8),
                                                                                  mode == "dump")
        # the dense gradient: 16 lookups' rows summed where they repeat, zeros elsewhere; the same sum of squares
        # at most (a repeated row's sum can cancel), the same extremes or zero
        assert gradient.stats.count == 400 and gradient.stats.min <= 0.0 <= gradient.stats.max
        assert 0.0 < gradient.stats.norm and math.isfinite(gradient.stats.norm)
        # the same sum, up to float32 rounding where coalescing adds repeated rows
        assert gradient.stats.mean * 400 == pytest.approx(rows.stats.mean * 128, abs=1e-6 * rows.stats.norm)


def test_a_clean_pair_with_sparse_gradients_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", "dump", target=False)
    _train(tmp_path / "target.h5", "dump", target=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_renorm_only_the_target_runs_is_named_at_its_embedding(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, target=False)
    _train(tmp_path / "target.h5", mode, target=True, max_norm=1.0)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", "Sequential/0", 0, "forward")
    assert verdict.evidence[0] == ("in module Sequential/0, golden ran [embedding]; the target ran "
                                   "[embedding_renorm_, embedding]")
