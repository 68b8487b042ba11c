"""nn.MultiheadAttention called with ``need_weights=False`` in golden (one SDPA kernel) and ``True`` in a bf16
target (baddbmm, softmax and bmm, the weights averaged): the same function, clean (probe P c40).

The diagnosis ran the target's ops again on golden's inputs in float64 to tell another function from another
precision; the value that bmm reads (a slice of the projected keys and values through views no op records) had
no golden partner and was taken as the target held it, in bfloat16, so the replay carried bfloat16's rounding
and "computed another function" (`kernel_bug` at the attention). A 16-bit value of an op golden does not run,
in a float32 golden run, is the target's rounding: such a replay is not exact, and not judged on.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, token_batches

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


class _Attending(nn.Module):
    def __init__(self, need_weights: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 64)
        self.need_weights = need_weights

    def forward(self, ids):
        causal = torch.triu(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool), 1)
        x = self.embed(ids)
        out, _ = self.attention(x, x, x, attn_mask=causal, key_padding_mask=ids == 0,
                                need_weights=self.need_weights)
        return self.head(x + out)


def _train(path, target: bool) -> None:
    import precision_tool.torch as ptt

    model = _Attending(need_weights=target)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ptt.dump(path, mode="dump"):
        for ids in token_batches(3):
            ids[:, -2:] = 0  # padding
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                logits = model(ids)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids.reshape(-1))
            loss.backward()
            optimizer.step()
            ptt.step(loss)


def test_attention_through_its_weights_in_bfloat16_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", target=False)
    _train(tmp_path / "target.h5", target=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_runs_whose_op_names_do_not_pair_are_said_to(tmp_path):
    # the target's model subclassed under another class name: no op name pairs, and `none` said "accumulated
    # rounding" (probe P f30)
    class Renamed(_Attending):
        pass

    import precision_tool.torch as ptt

    for path, cls in ((tmp_path / "golden.h5", _Attending), (tmp_path / "target.h5", Renamed)):
        model = cls(need_weights=False)
        with ptt.dump(path, mode="stats"):
            for ids in token_batches(2):
                loss = nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1))
                loss.backward()
                ptt.step(loss)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    # (the 3 that pair are ops outside every module: the loss)
    assert (verdict.cls, verdict.evidence[0]) == ("none", (
        "only 3 of the target's 21 forward ops at step 0 have a golden op of the same name (golden's outermost "
        "modules _Attending; the target's Renamed): ops are paired by name, and what does not pair is not judged"))
