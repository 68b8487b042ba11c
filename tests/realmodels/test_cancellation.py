"""A difference of two nearly equal values, judged from statistics in a 16-bit run (probe S, a clean RWKV).

RWKV's linear attention runs its recurrence in float32 and subtracts the running maximum of its keys from the new
one (``max_state - max_for_output``): two tensors of norm 11 whose difference has norm 1. Under bfloat16 autocast
the inputs of that subtraction depart from golden's by 3.8 % at the second step (the first update, rounded), and
the difference by 49 %: 13 times its inputs, so a statistics-only dump named it a float32 kernel_bug. A sum's error
is at most the sum of its inputs' errors, which over a small difference grows by (||a|| + ||b||) / ||a - b||
(21 there): within that, the difference carries its inputs' error. Full dumps replay it on golden's inputs and
said none already.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.torch]

transformers = pytest.importorskip("transformers")


def _rwkv():
    torch.manual_seed(0)
    config = transformers.RwkvConfig(vocab_size=64, context_length=16, hidden_size=32, num_hidden_layers=2,
                                     attention_hidden_size=32, intermediate_size=64, use_cache=False)
    model = transformers.RwkvForCausalLM(config)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(123))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}


def _pair(folder, mode: str):
    def loss_of(model, batch, autocast: bool = False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(**batch).loss

    paths = []
    for name, autocast in (("golden", False), ("target", True)):
        model, optimizer, batch = _rwkv()
        paths.append(folder / f"{name}-{mode}.h5")
        fit(paths[-1], model, optimizer, lambda m, b, a=autocast: loss_of(m, b, a), [batch] * 2, mode=mode)
    return paths


@pytest.fixture(scope="module")
def stats_pair(tmp_path_factory):
    return _pair(tmp_path_factory.mktemp("rwkv"), "stats")


def test_clean_bfloat16_rwkv_is_none_from_statistics(stats_pair):
    diagnosis = diagnosis_of(*stats_pair)
    assert diagnosis.verdict.cls == "none", diagnosis.verdict


def test_cancellation_factor_of_the_subtraction(stats_pair):
    from precision_tool.analysis.statsjudge import _cancellation
    from precision_tool.dump.reader import open_dump

    with open_dump(stats_pair[0]) as dump:
        subtractions = [r for r in dump.ops() if r.type == "aten.sub" and r.direction == "forward"
                        and "/blocks.0/attention/" in r.name and len(r.inputs) == 2]
        assert subtractions
        for record in subtractions:  # the factor is the norms' ratio, exactly as the statistics give it
            a, b = (t.stats.norm for t in record.inputs)
            out = record.outputs[0].stats.norm
            assert record.inputs[0].stats.count == record.inputs[1].stats.count == record.outputs[0].stats.count
            assert _cancellation(record) == (max(1.0, (a + b) / out) if out > 0 else 1.0)
        assert max(_cancellation(r) for r in subtractions) > 10.0  # the running maximum's: near cancellation
        matmul = next(r for r in dump.ops() if r.type in ("aten.mm", "aten.addmm", "aten.bmm"))
        assert _cancellation(matmul) == 1.0
        assert not math.isnan(_cancellation(subtractions[0]))
