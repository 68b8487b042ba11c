"""An LSTM between an embedding and a head, with the kernels a CPU picks for it.

* Cast to bfloat16 by hand in a float32 run (its parameters too): oneDNN runs it in bf16, 0.3 % off golden.
  The run was taken for a 16-bit one (six of its eight ops compute in bf16, the embedding and the head one
  float32 op each), so nothing was judged against the float32 it declares: `none`.
* Cast to float16: no oneDNN kernel takes it, and the cells run op by op (249 ops where golden runs two
  kernels): named a kernel_bug by the backward that op-by-op form runs.
* oneDNN off in the target only, under bf16 autocast: the op-by-op cells compute in bfloat16 and write a float32
  output, judged as if float32 rounding were all it could carry.
* oneDNN off in the target only, both float32: golden's oneDNN backward computes the gradients of the zero
  initial states, which no op reads; the decomposed LSTM computes none, and "parameters that golden trains get
  no gradient".
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


class _Tagger(nn.Module):
    def __init__(self, cast=None):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.rnn, self.head = nn.Embedding(64, 32), nn.LSTM(32, 32, num_layers=2, batch_first=True), \
            nn.Linear(32, 4)
        self.cast = cast
        if cast is not None:
            self.rnn.to(cast)

    def forward(self, ids):
        x = self.emb(ids)
        hidden = self.rnn(x if self.cast is None else x.to(self.cast))[0].float()
        return self.head(hidden[:, -1])


def _train(path, cast=None, onednn: bool = True, mode: str = "dump", autocast=None) -> None:
    model = _Tagger(cast)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 64, (3, 9), generator=generator), torch.randint(0, 4, (3,), generator=generator))
               for _ in range(2)]
    def loss_of(model, batch):
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return nn.functional.cross_entropy(model(batch[0]).float(), batch[1])

    with torch.backends.mkldnn.flags(enabled=onednn):
        fit(path, model, optimizer, loss_of, batches, mode)


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_an_lstm_cast_down_by_hand_in_a_float32_run_is_precision_loss(tmp_path, cast):
    if cast is torch.bfloat16 and not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN runs the bf16 LSTM")
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden)
    _train(target, cast)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == ("precision_loss", "_Tagger/rnn", 0,
                                                                               "forward")


def test_an_lstm_without_onednn_against_one_with_it_blames_nothing(tmp_path):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("needs oneDNN in golden")
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden)
    _train(target, onednn=False)
    verdict = diagnosis_of(golden, target).verdict
    assert verdict.cls == "none", verdict.evidence


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_an_lstm_without_onednn_under_bf16_autocast_blames_nothing(tmp_path, mode):
    # its cells run op by op, their matmuls in bfloat16: 0.44 % from golden's oneDNN LSTM on golden's inputs (a
    # float32 output); judged against float32's floor (0.1 %), then replayed in float64, where the op-by-op form
    # departs 0.39 (no faithful replay), it was "another function". A 16-bit run's module carries its ops' rounding
    if not torch.backends.mkldnn.is_available():
        pytest.skip("needs oneDNN in golden")
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, mode=mode)
    _train(target, onednn=False, mode=mode, autocast=torch.bfloat16)
    verdict = diagnosis_of(golden, target).verdict
    assert verdict.cls == "none", verdict.evidence


def test_a_module_level_resnet_without_onednn_against_one_with_it_blames_no_relu_backward(tmp_path):
    # one float32 unit of other convolution kernels' rounding (8.7e-7 at a ReLU's output) flips the ReLU's mask
    # where its input is near 0, and moves the gradient it passes back by 0.8 %: not a fault of its backward
    import transformers as tf

    if not torch.backends.mkldnn.is_available():
        pytest.skip("needs oneDNN in golden")
    tf.logging.set_verbosity_error()
    paths = {}
    for role in ("golden", "target"):
        torch.manual_seed(0)
        model = tf.ResNetForImageClassification(tf.ResNetConfig(
            num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
            num_labels=3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        generator = torch.Generator().manual_seed(51)
        batches = [(torch.randn(4, 3, 32, 32, generator=generator), torch.randint(0, 3, (4,), generator=generator))
                   for _ in range(2)]
        paths[role] = tmp_path / f"{role}.h5"
        with torch.backends.mkldnn.flags(enabled=role == "golden"):
            fit(paths[role], model, optimizer, lambda m, b: m(pixel_values=b[0], labels=b[1]).loss, batches,
                level="module")
    verdict = diagnosis_of(paths["golden"], paths["target"]).verdict
    assert verdict.cls == "none", verdict.evidence
