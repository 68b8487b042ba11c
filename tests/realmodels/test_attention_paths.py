"""nn.MultiheadAttention called two ways in golden and the target, and runs whose op names do not pair.

``need_weights=False`` in golden (one SDPA kernel) and ``True`` in a bf16 target (baddbmm, softmax and bmm, the
weights averaged) compute the same function: clean (probe P c40). The diagnosis ran the target's ops again on
golden's inputs in float64 to tell another function from another precision; the value bmm reads (a slice of the
projected keys and values through views no op records) had no golden partner and was taken as the target held
it, in bfloat16, so the replay carried bfloat16's rounding and "computed another function" (`kernel_bug` at the
attention). A 16-bit value of an op golden does not run, in a float32 golden run, is the target's rounding: such
a replay is not exact, and not judged on.

MHA turns a bool mask into an additive one, zeros filled with -inf (``masked_fill_``): the float status is
raised there by design. Where golden's op of that name filled another mask (the target passes its key padding
mask as floats, which MHA adds instead of filling), the infinities paired with none of golden's, and a
statistics-only diagnosis blamed the fill for an overflow (probe P f12). A fill of finite values with an
infinity the op was asked for writes the model's constant.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, token_batches

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration"),
              pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")]  # (the float one)


class _Attending(nn.Module):
    def __init__(self, need_weights: bool = False, float_padding: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 64)
        self.need_weights, self.float_padding = need_weights, float_padding

    def forward(self, ids):
        causal = torch.triu(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool), 1)
        padding = ids == 0
        padding = (~padding).float() if self.float_padding else padding
        x = self.embed(ids)
        out, _ = self.attention(x, x, x, attn_mask=causal, key_padding_mask=padding, need_weights=self.need_weights)
        return self.head(x + out)


def _train(path, model: nn.Module, mode: str = "dump", bf16: bool = False, steps: int = 3) -> None:
    import precision_tool.torch as ptt

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ptt.dump(path, mode=mode):
        for ids in token_batches(steps):
            ids[:, -2:] = 0  # padding
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids.reshape(-1))
            loss.backward()
            optimizer.step()
            ptt.step(loss)


def test_attention_through_its_weights_in_bfloat16_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", _Attending())
    _train(tmp_path / "target.h5", _Attending(need_weights=True), bf16=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_the_fill_of_a_mask_with_minus_infinity_is_the_models_own(tmp_path):
    _train(tmp_path / "golden.h5", _Attending(), mode="stats", steps=2)
    _train(tmp_path / "target.h5", _Attending(float_padding=True), mode="stats", bf16=True, steps=2)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    fill = next(e for e in diagnosis.overflow.entries if e.name == "_Attending/attention/aten.masked_fill__0")
    assert fill.models_own and not diagnosis.verdict.cls == "overflow"


def test_runs_whose_op_names_do_not_pair_are_said_to(tmp_path):
    # the target's model subclassed under another class name: no op name pairs, and `none` said "accumulated
    # rounding" (probe P f30)
    class Renamed(_Attending):
        pass

    _train(tmp_path / "golden.h5", _Attending(), mode="stats", steps=2)
    _train(tmp_path / "target.h5", Renamed(), mode="stats", steps=2)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    # (the loss's 3 ops, outside every module, and 6 copies are not counted)
    assert (verdict.cls, verdict.evidence[0]) == ("none", (
        "only 0 of the target's 12 forward ops at step 0 have a golden op of the same name (golden's outermost "
        "modules _Attending; the target's Renamed): ops are paired by name, and what does not pair is not judged"))


def _mlp_pair_verdict(tmp_path, hidden: int, loss_of, after_backward=None):
    """The verdict on a golden and a target run (``target`` False, True) of an MLP of ``hidden`` Linears of width
    8 and a head, two SGD steps in dump mode: ``loss_of(model, x, target)``; ``after_backward(model, target)``
    between backward and the update."""
    import precision_tool.torch as ptt

    for name, target in (("golden", False), ("target", True)):
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(hidden)), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        with ptt.dump(tmp_path / f"{name}.h5", "dump"):
            for _ in range(2):
                loss = loss_of(model, x, target)
                optimizer.zero_grad()
                loss.backward()
                if after_backward is not None:
                    after_backward(model, target)
                optimizer.step()
                ptt.step(loss)
    return diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict


def test_the_casts_of_an_autocast_target_are_not_counted_as_ops_that_do_not_pair(tmp_path):
    # a small bf16 autocast MLP runs more casts (input, weight and bias of each Linear) than Linears: a clean pair
    # was said to pair "only 6 of the target's 14 forward ops" by name (probe Q f10: a saved-tensor hook's casts)
    def loss_of(model, x, autocast: bool):
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = model(x)
        return out.float().pow(2).mean()

    verdict = _mlp_pair_verdict(tmp_path, 2, loss_of)
    assert (verdict.cls, verdict.evidence) == ("none", ("no op at or below cosine 0.98 and no unhandled overflow",))


def test_a_training_loops_own_ops_are_not_counted_as_ops_that_do_not_pair(tmp_path):
    # the target clips its gradients by hand (a norm, an add and a mul per parameter, outside every module), golden
    # with clip_grad_norm_: a float32 pair whose model ops all pair was said to pair "only 15 of the target's 123
    # forward ops" and told to collect both runs from the same model code (probe S, GPTBigCode)
    def clip(model, by_hand: bool):
        if not by_hand:
            nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            return
        with torch.no_grad():
            total = sum(p.grad.norm() ** 2 for p in model.parameters()).sqrt()
            for p in model.parameters():
                p.grad.mul_(torch.clamp(10.0 / (total + 1e-6), max=1.0))

    verdict = _mlp_pair_verdict(tmp_path, 6, lambda model, x, _: model(x).pow(2).mean(), clip)
    assert (verdict.cls, verdict.evidence) == ("none", ("no op at or below cosine 0.98 and no unhandled overflow",))
