"""More of the suite (tests/realmodels/cases.py): families and faults added after cases.py reached its size.

Families: BLOOM (ALiBi position biases instead of position embeddings), a dilated Conv1d network (TCN) and a
``torch.nn.TransformerEncoder`` with a causal mask. Faults: a module's output detached (no gradient flows
back through it), a module's parameters frozen, a stray float16 round trip of a module's input, and label
smoothing switched on in the loss. `register` adds them to cases.py's MODELS and FAULTS.

Imports of cases.py happen inside the functions: cases.py imports this module at its end.
"""

from __future__ import annotations

import torch
from torch import nn


def bloom(**_):
    """ALiBi attention biases, fused query-key-value, LayerNorm after the word embeddings, tanh GELU."""
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0,
                            attention_dropout=0.0)
    model = tf.BloomForCausalLM(config)
    ids = torch.randint(0, 64, (4, 16))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}, _hf_loss)


class TCN(nn.Module):
    """Two causal dilated Conv1d layers with ReLU and a residual, mean over time, Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(4, 16, 3, padding=2)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv1d(16, 16, 3, padding=4, dilation=2)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        steps = x.shape[-1]
        h = self.act1(self.conv1(x)[..., :steps])
        h = self.act2(self.conv2(h)[..., :steps]) + h
        return self.head(h.mean(-1))


def tcn(**_):
    from tests.realmodels.cases import Run

    batch = {"x": torch.randn(8, 4, 24), "y": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])}
    model = TCN()
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), batch,
               lambda model, batch: nn.functional.cross_entropy(model(batch["x"]), batch["y"]))


class TorchEncoder(nn.Module):
    """Embedding -> two nn.TransformerEncoderLayers under a causal mask -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.encoder(self.embed(ids), mask=mask, is_causal=True))


def torch_encoder(**_):
    from tests.realmodels.cases import Run

    model = TorchEncoder()
    ids = torch.randint(0, 64, (4, 12))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": ids}, loss)


MODELS = {
    "bloom": (bloom, {}, {"act": "transformer.h.1.mlp.gelu_impl", "attn": "transformer.h.0.self_attention"}),
    "tcn": (tcn, {}, {"act": "act1", "conv": "conv2"}),
    "torch-encoder": (torch_encoder, {}, {"attn": "encoder.layers.0.self_attn", "norm": "encoder.layers.0.norm1"}),
}


# ---- faults ------------------------------------------------------------------------------------

def detached_output(run, path: str) -> None:
    """The module returns its output detached: forward is right, no gradient flows back through it (around it,
    a residual still carries one)."""
    from tests.realmodels.cases import _patch_forward, module

    mod = module(run.model, path)
    original = mod.forward

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        return (out[0].detach(), *out[1:]) if isinstance(out, tuple) else out.detach()

    _patch_forward(mod, forward)


def frozen(run, path: str) -> None:
    """The module's parameters do not require grad in the target: golden trains them, the target does not."""
    from tests.realmodels.cases import module

    module(run.model, path).requires_grad_(False)


def half_input(run, path: str) -> None:
    """The module's input makes a round trip through float16 (a stray ``.half()``) in a float32 run."""
    from tests.realmodels.cases import _patch_forward, module

    mod = module(run.model, path)
    original = mod.forward
    _patch_forward(mod, lambda x, *args, **kwargs: original(x.half().float(), *args, **kwargs))


def label_smoothing(run, path: str) -> None:
    """Every cross entropy the loss computes (inside the model for transformers) smooths its labels by 0.1."""
    loss, cross_entropy = run.loss, nn.functional.cross_entropy

    def smoothed(*args, **kwargs):
        return cross_entropy(*args, **{**kwargs, "label_smoothing": 0.1})

    def patched(model, batch):
        nn.functional.cross_entropy = smoothed
        try:
            return loss(model, batch)
        finally:
            nn.functional.cross_entropy = cross_entropy

    run.loss = patched


def input_written_through_data(run, path: str) -> None:
    """After computing its output the module scales its input in place through ``.data``: the tensor its matmul
    saved for backward changes under autograd with no new version, so only the weight gradient sees it."""
    from tests.realmodels.cases import _patch_forward, module

    mod = module(run.model, path)
    original = mod.forward

    def forward(x, *args, **kwargs):
        out = original(x, *args, **kwargs)
        x.data.mul_(1.05)
        return out

    _patch_forward(mod, forward)


FAULTS = {"detached": detached_output, "frozen": frozen, "half_input": half_input,
          "label_smoothing": label_smoothing, "data_write": input_written_through_data}


def fault_cases() -> list:
    from tests.realmodels.cases import Case

    return [
        # no gradient through a module: its backward golden runs and the target does not
        Case("gpt2-eager", "fp32", "detached", "attn", "kernel_bug", "backward"),
        Case("torch-encoder", "fp32", "detached", "attn", "kernel_bug", "backward"),
        # frozen parameters: a backward group computes fewer gradients; or none at all (the first layer)
        Case("gpt2-eager", "fp32", "frozen", "fc", "kernel_bug", "backward"),
        Case("mlp", "fp32", "frozen", "fc1", "kernel_bug", "backward"),
        # a cast golden does not run rounds a value to float16
        Case("mlp", "fp32", "half_input", "fc", "precision_loss"),
        Case("torch-encoder", "fp32", "half_input", "norm", "precision_loss"),
        # the loss computed differently inside the model (a mask constant at float32's lowest in the rewrite)
        Case("gpt2-eager", "fp32", "label_smoothing", "", "kernel_bug"),
        # a saved tensor written through .data: named at the write, in the module's forward (the capture stamps
        # writes through such aliases; before, the readers recorded stale statistics and the verdict was "none")
        Case("mlp", "fp32", "data_write", "fc", "kernel_bug"),
    ]


def register(models: dict, faults: dict) -> None:
    """Add this module's families, roles and faults to cases.py's tables."""
    models.update(MODELS)
    models["mlp"][2].setdefault("fc1", "fc1")
    faults.update(FAULTS)
