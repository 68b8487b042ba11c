"""More of the suite (tests/realmodels/cases.py): families and faults added after cases.py reached its size.

Families: BLOOM (ALiBi position biases instead of position embeddings), a dilated Conv1d network (TCN), a
``torch.nn.TransformerEncoder`` with a causal mask, a mixture of experts (Mixtral: tokens routed by topk), and
training loops around known models: SGD with Nesterov momentum, gradient clipping, gradient accumulation over
micro-batches. Faults: a module's output detached (no gradient flows back through it), a module's parameters
frozen, a stray float16 round trip of a module's input, label smoothing switched on in the loss, a hand-written
SiLU whose backward forgets a term, the optimizer's state reset every step, the clipping norm changed, the loss
not divided by the micro-batches, the router choosing one expert instead of two. Clean targets beyond cases.py's:
float16 autocast with a GradScaler (``amp16``), with clipping. `register` adds them to cases.py's tables.

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


def mixtral(**_):
    """A sparse mixture of experts: a topk router picks 2 of 4 experts per token, RMSNorm, rotary positions."""
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                              num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)
    model = tf.MixtralForCausalLM(config)
    ids = torch.randint(0, 64, (4, 16))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}, _hf_loss)


def mlp_sgd(**_):
    """cases.py's MLP regressor under SGD with Nesterov momentum."""
    from tests.realmodels.cases import mlp

    run = mlp()
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    return run


def gpt2_clip(**kwargs):
    """GPT-2 whose gradients are clipped to norm 0.5 before each update."""
    from tests.realmodels.cases import gpt2

    run = gpt2(**kwargs)
    run.clip = 0.5
    return run


def gpt2_accumulate(**kwargs):
    """GPT-2 whose step accumulates gradients over two micro-batches, each loss divided by two."""
    from tests.realmodels.cases import gpt2

    run = gpt2(**kwargs)
    run.accumulate = 2
    return run


MODELS = {
    "bloom": (bloom, {}, {"act": "transformer.h.1.mlp.gelu_impl", "attn": "transformer.h.0.self_attention"}),
    "tcn": (tcn, {}, {"act": "act1", "conv": "conv2"}),
    "torch-encoder": (torch_encoder, {}, {"attn": "encoder.layers.0.self_attn", "norm": "encoder.layers.0.norm1"}),
    "mixtral": (mixtral, {}, {"gate": "model.layers.0.mlp.gate", "act": "model.layers.1.mlp.experts.act_fn"}),
    "mlp-sgd": (mlp_sgd, {}, {"fc": "fc2"}),
    "gpt2-clip": (gpt2_clip, {"attn": "sdpa"}, {}),
    "gpt2-accumulate": (gpt2_accumulate, {"attn": "sdpa"}, {}),
}
# force_fp16 computes Mixtral's float32 RMSNorm in float16 too: rsqrt's backward overflows, as for llama (cases.py)
NOT_CLEAN = {("mixtral", "fp16")}


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


class _SiLUForgetsATerm(torch.autograd.Function):
    """SiLU with a hand-written backward that returns g * sigmoid(x), leaving out g * x * s * (1 - s)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return nn.functional.silu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


def silu_backward(run, path: str) -> None:
    """The activation is a custom autograd SiLU: forward right, backward missing a term."""
    from tests.realmodels.cases import _patch_forward, module

    _patch_forward(module(run.model, path), _SiLUForgetsATerm.apply)


def state_reset(run, path: str) -> None:
    """The optimizer's state (momentum buffers) is cleared before every update, as if re-created each step."""
    optimizer = run.optimizer
    step = optimizer.step

    def reset_then_step(*args, **kwargs):
        optimizer.state.clear()
        return step(*args, **kwargs)

    optimizer.step = reset_then_step


def clip_changed(run, path: str) -> None:
    """Gradients are clipped to norm 0.01 instead of golden's."""
    run.clip = 0.01


def undivided(run, path: str) -> None:
    """Each micro-batch's loss is not divided by the number of micro-batches: gradients come out twice golden's."""
    run.divide = False


def one_expert(run, path: str) -> None:
    """The router picks one expert per token instead of two (a top-k read from the wrong config field)."""
    from tests.realmodels.cases import module

    module(run.model, path).top_k = 1


FAULTS = {"detached": detached_output, "frozen": frozen, "half_input": half_input,
          "label_smoothing": label_smoothing, "data_write": input_written_through_data,
          "silu_backward": silu_backward, "state_reset": state_reset, "clip_changed": clip_changed,
          "undivided": undivided, "one_expert": one_expert}


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
        # a custom autograd backward that reads the saved input (of the gradient's size) before the gradient:
        # the group's incoming gradient is the input a backward op outside it wrote
        Case("llama", "fp32", "silu_backward", "act", "kernel_bug", "backward"),
        # the optimizer's update ops differ from golden's (momentum buffers made again each step): judged as a
        # group, not op by op paired by name
        Case("mlp-sgd", "fp32", "state_reset", "", "kernel_bug", "optimizer"),
        # the training loop's own ops: clipping called with another norm; a division golden runs and the target
        # skips (the value goes from ones_like straight to the loss's backward)
        Case("gpt2-clip", "fp32", "clip_changed", "", "kernel_bug"),
        Case("gpt2-accumulate", "fp32", "undivided", "", "kernel_bug", "backward"),
        Case("mixtral", "fp32", "one_expert", "gate", "kernel_bug"),
    ]


def clean_cases() -> list:
    """Clean targets cases.py's CLEAN_TARGETS do not cover: float16 autocast with a GradScaler, with clipping (the
    scaler's multiplication renumbers the training loop's ops after it: they are paired by alignment)."""
    from tests.realmodels.cases import Case

    return [Case("mlp", "amp16"), Case("gpt2-clip", "amp16")]


def register(models: dict, faults: dict, not_clean: set) -> None:
    """Add this module's families, roles, faults and clean targets a model cannot pass to cases.py's tables."""
    models.update(MODELS)
    models["mlp"][2].setdefault("fc1", "fc1")
    models["llama"][2].setdefault("act", "model.layers.1.mlp.act_fn")
    faults.update(FAULTS)
    not_clean.update(NOT_CLEAN)
