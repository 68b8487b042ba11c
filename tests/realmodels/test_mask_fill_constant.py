"""A mask nn.MultiheadAttention fills with -inf, counted as the model's constant wherever golden's ops differ
(probe P f12).

nn.MultiheadAttention turns a bool mask into an additive one, zeros filled with -inf (``masked_fill_``): the float
status is raised there by design. Where golden's op of that name filled another mask (the target passes its key
padding mask as floats, which MHA adds instead of filling), the infinities counted for no pair of golden's, and
a statistics-only diagnosis blamed the fill for an overflow. A fill of finite values with an infinity the op was
asked for writes the model's constant.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, token_batches

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration"),
              pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")]  # (the float one)


class _Attending(nn.Module):
    def __init__(self, float_padding: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 64)
        self.float_padding = float_padding

    def forward(self, ids):
        causal = torch.triu(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool), 1)
        padding = ids == 0
        padding = (~padding).float() if self.float_padding else padding
        x = self.embed(ids)
        out, _ = self.attention(x, x, x, attn_mask=causal, key_padding_mask=padding, need_weights=False)
        return self.head(x + out)


def _train(path, target: bool) -> None:
    import precision_tool.torch as ptt

    model = _Attending(float_padding=target)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ptt.dump(path, mode="stats"):
        for ids in token_batches(2):
            ids[:, -2:] = 0  # padding
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                logits = model(ids)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids.reshape(-1))
            loss.backward()
            optimizer.step()
            ptt.step(loss)


def test_the_fill_of_a_mask_with_minus_infinity_is_the_models_own(tmp_path):
    _train(tmp_path / "golden.h5", target=False)
    _train(tmp_path / "target.h5", target=True)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    fill = next(e for e in diagnosis.overflow.entries if e.name == "_Attending/attention/aten.masked_fill__0")
    assert fill.models_own and not diagnosis.verdict.cls == "overflow"
