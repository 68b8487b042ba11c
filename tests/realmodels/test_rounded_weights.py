"""A float32 run whose one weight was rounded to 16 bits before training (``w.half().float()`` on load, as from a
checkpoint saved in half precision). Its departure, one rounding (2e-4 in float16), is far under the 1 % a changed
parameter must move, and every op after it inherits it: `none` ("accumulated rounding"). Every value of the
target's weight lies on float16's (bfloat16's) grid while golden's does not: precision_loss where it is first read.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch]

MM = "GPT2LMHeadModel/transformer/h.0/mlp/c_fc/aten.addmm_0"


def _train(path, mode: str, rounded: torch.dtype | None = None) -> None:
    model = tiny_gpt2()
    if rounded is not None:
        with torch.no_grad():
            weight = model.transformer.h[0].mlp.c_fc.weight
            weight.copy_(weight.to(rounded).float())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = token_batches(2)
    fit(path, model, optimizer, lambda model, ids: model(input_ids=ids, labels=ids).loss, batches, mode)


@pytest.mark.parametrize("mode,rounded", [("dump", torch.float16), ("stats", torch.float16),
                                          ("dump", torch.bfloat16)])
def test_a_weight_rounded_to_16_bits_before_training_is_named_where_read(tmp_path, mode, rounded):
    _train(tmp_path / "golden.h5", mode)
    _train(tmp_path / "target.h5", mode, rounded)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("precision_loss", MM, 0, "forward"), \
        verdict.evidence
    assert str(rounded).removeprefix("torch.") in verdict.evidence[0]
