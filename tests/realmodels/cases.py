"""Real models, clean targets and planted faults: the diagnosis suite's cases.

Every case trains a tiny-config, random-init model twice for two optimizer
steps under `precision_tool.torch.dump`: a golden float32 run, then a target
run that is either clean (bf16 autocast, simulated mixed precision, simulated
force_fp16) or carries one planted fault. `run_case` writes both dumps and
returns the diagnosis; `judge` says whether the verdict is right. The
verdict logic never sees which model or fault it looks at: the case only
decides what the right answer is.

Used by ``tests/realmodels`` and ``bench/bench_diagnosis.py``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

import precision_tool.torch as ptt

STEPS = 2
CLEAN_TARGETS = ("bf16", "mix", "fp16")


# ---- models ------------------------------------------------------------------------------------

@dataclass
class Run:
    """A model, its optimizer, one batch and the loss of a forward pass."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: dict
    loss: Callable[[nn.Module, dict], torch.Tensor]
    clip: float | None = None  # clip_grad_norm_ to this before each update
    accumulate: int = 1  # micro-batches a step accumulates gradients over (the batch split along dim 0) ...
    divide: bool = True  # ... each micro-batch's loss divided by their number
    steps: int = 0  # optimizer steps both runs take (0: STEPS)
    scaler: dict | None = None  # amp16 targets: GradScaler arguments beyond init_scale 2^10


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _hf_loss(model, batch):
    return model(**batch).loss


def gpt2(attn: str, offset: float = 0.0, qk_scale: float = 1.0) -> Run:
    tf = _quiet_transformers()
    config = tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    model = tf.GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.wpe.weight.add_(offset)
        for block in model.transformer.h:  # c_attn packs q, k, v along its output columns
            block.attn.c_attn.weight[:, :64].mul_(qk_scale)
    ids = torch.randint(0, 64, (4, 16))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}, _hf_loss)


def bert(attn: str, offset: float = 0.0, qk_scale: float = 1.0) -> Run:
    tf = _quiet_transformers()
    config = tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, num_labels=4, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation=attn)
    model = tf.BertForSequenceClassification(config)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.add_(offset)
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.weight.mul_(qk_scale)
            layer.attention.self.key.weight.mul_(qk_scale)
    ids = torch.randint(1, 64, (4, 16))
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[1, 12:] = 0  # padding: exercises the additive attention mask
    mask[3, 9:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def vit(attn: str = "sdpa", offset: float = 0.0, qk_scale: float = 1.0) -> Run:
    tf = _quiet_transformers()
    config = tf.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, attn_implementation=attn)
    model = tf.ViTForImageClassification(config)
    with torch.no_grad():
        model.vit.embeddings.patch_embeddings.projection.bias.add_(offset)
        for layer in model.vit.layers:
            layer.attention.q_proj.weight.mul_(qk_scale)
            layer.attention.k_proj.weight.mul_(qk_scale)
    batch = {"pixel_values": torch.randn(4, 3, 16, 16), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def resnet(**_) -> Run:
    tf = _quiet_transformers()
    config = tf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                             layer_type="basic", num_labels=4)
    model = tf.ResNetForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batch, _hf_loss)


def llama(**_) -> Run:
    """RMSNorm (upcast to float32 by the model), SiLU-gated MLP, rotary positions, grouped-query attention."""
    tf = _quiet_transformers()
    config = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = tf.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (4, 16))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}, _hf_loss)


def distilbert(offset: float = 0.0, **_) -> Run:
    tf = _quiet_transformers()
    config = tf.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, num_labels=4,
                                 dropout=0.0, attention_dropout=0.0, max_position_embeddings=32)
    model = tf.DistilBertForSequenceClassification(config)
    with torch.no_grad():
        model.distilbert.embeddings.word_embeddings.weight.add_(offset)
    batch = {"input_ids": torch.randint(1, 64, (4, 16)), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def convnext(**_) -> Run:
    """Depthwise convolutions, channels-last LayerNorm, GELU, layer scale."""
    tf = _quiet_transformers()
    config = tf.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_labels=4, num_stages=2)
    model = tf.ConvNextForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def t5(**_) -> Run:
    """Encoder-decoder, relative position bias, RMS-style layer norm without a mean, ReLU MLP."""
    tf = _quiet_transformers()
    config = tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                         decoder_start_token_id=0)
    model = tf.T5ForConditionalGeneration(config)
    ids = torch.randint(1, 64, (4, 12))
    batch = {"input_ids": ids, "labels": ids[:, :8].contiguous()}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


class GRUTagger(nn.Module):
    """Embedding -> two-layer GRU -> Linear -> tanh -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.GRU(width, width, num_layers=2, batch_first=True)
        self.proj = nn.Linear(width, width)
        self.act = nn.Tanh()
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.act(self.proj(self.rnn(self.embed(ids))[0])))


def gru(**_) -> Run:
    model = GRUTagger()
    ids = torch.randint(0, 64, (4, 12))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": ids}, loss)


class LSTMLanguageModel(nn.Module):
    """Embedding -> two-layer LSTM -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


def lstm(**_) -> Run:
    model = LSTMLanguageModel()
    ids = torch.randint(0, 64, (4, 12))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": ids}, loss)


def swin(**_) -> Run:
    """Shifted-window attention, patch merging, mean pooling before the head (a bias gradient that cancels)."""
    tf = _quiet_transformers()
    config = tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                           num_labels=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    model = tf.SwinForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


class MLPRegressor(nn.Module):
    """Linear -> LayerNorm -> GELU -> square Linear -> SiLU -> Linear, an MSE loss: no transformers at all."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(20, width)
        self.norm = nn.LayerNorm(width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.SiLU()
        self.fc3 = nn.Linear(width, 1)

    def forward(self, x):
        return self.fc3(self.act2(self.fc2(self.act(self.norm(self.fc1(x))))))


def mlp(**_) -> Run:
    model = MLPRegressor()
    batch = {"x": torch.randn(32, 20), "y": torch.randn(32, 1)}
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), batch,
               lambda model, batch: nn.functional.mse_loss(model(batch["x"]), batch["y"]))


class SmallCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU -> max pool, twice, global average pool, Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.pool(self.act1(self.bn1(self.conv1(x))))
        x = self.act2(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def cnn(**_) -> Run:
    model = SmallCNN()
    batch = {"x": torch.randn(8, 3, 16, 16), "y": torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])}
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batch,
               lambda model, batch: nn.functional.cross_entropy(model(batch["x"]), batch["y"]))


# name -> (builder, keyword arguments, module paths by role)
MODELS: dict[str, tuple[Callable, dict, dict]] = {
    "gpt2-sdpa": (gpt2, {"attn": "sdpa"}, {"act": "transformer.h.1.mlp.act", "ln": "transformer.h.0.ln_1",
                                           "attn": "transformer.h.0.attn"}),
    "gpt2-eager": (gpt2, {"attn": "eager"}, {"act": "transformer.h.1.mlp.act", "ln": "transformer.h.0.ln_1",
                                             "attn": "transformer.h.0.attn", "embed": "transformer.wte",
                                             "fc": "transformer.h.0.mlp.c_fc"}),
    "bert-sdpa": (bert, {"attn": "sdpa"}, {"act": "bert.encoder.layer.1.intermediate.intermediate_act_fn",
                                           "ln": "bert.embeddings.LayerNorm",
                                           "attn": "bert.encoder.layer.0.attention.self"}),
    "bert-eager": (bert, {"attn": "eager"}, {"act": "bert.encoder.layer.1.intermediate.intermediate_act_fn",
                                             "ln": "bert.embeddings.LayerNorm",
                                             "attn": "bert.encoder.layer.0.attention.self",
                                             "ln2": "bert.encoder.layer.1.output.LayerNorm",
                                             "fc": "bert.encoder.layer.1.intermediate.dense",
                                             "embed": "bert.embeddings.word_embeddings"}),
    "vit": (vit, {"attn": "sdpa"}, {"act": "vit.layers.1.mlp.activation_fn", "ln": "vit.layers.0.layernorm_before",
                                    "attn": "vit.layers.0.attention"}),
    "vit-eager": (vit, {"attn": "eager"}, {"act": "vit.layers.1.mlp.activation_fn",
                                           "ln": "vit.layers.0.layernorm_before", "attn": "vit.layers.0.attention"}),
    "resnet": (resnet, {}, {"act": "resnet.encoder.stages.1.layers.0.layer.0.activation",
                            "conv": "resnet.encoder.stages.1.layers.0.layer.0.convolution"}),
    "lstm": (lstm, {}, {"act": "head"}),
    "lstm-nodnn": (lstm, {}, {"act": "head"}),
    "llama": (llama, {}, {"act": "model.layers.1.mlp.act_fn", "norm": "model.norm"}),
    "distilbert": (distilbert, {}, {"act": "distilbert.transformer.layer.1.ffn.activation",
                                    "ln": "distilbert.embeddings.LayerNorm"}),
    "convnext": (convnext, {}, {"act": "convnext.encoder.stages.1.layers.0.act"}),
    "t5": (t5, {}, {"act": "encoder.block.1.layer.1.DenseReluDense.act"}),
    "gru": (gru, {}, {"act": "act", "embed": "embed"}),
    "swin": (swin, {}, {"act": "swin.encoder.layers.1.blocks.0.intermediate.intermediate_act_fn"}),
    "mlp": (mlp, {}, {"act": "act", "ln": "norm", "fc": "fc2"}),
    "cnn": (cnn, {}, {"act": "act2", "bn": "bn1"}),
}
# Clean targets a model cannot pass, because the precision mode itself breaks it (a genuine verdict, tested in
# test_mechanisms): force_fp16 overrides Llama's float32 upcast in RMSNorm, and rsqrt's backward, x^-1.5 of a
# variance near 4e-4, is 2.8e5 in golden: beyond float16.
NOT_CLEAN = {("llama", "fp16")}


def module(model: nn.Module, path: str) -> nn.Module:
    return model.get_submodule(path)


def dumped_path(model: nn.Module, path: str) -> str:
    """The module path as dumps name it: the outermost class, then attribute names with '/'."""
    return "/".join([type(model).__name__, *path.split(".")])


# ---- faults ------------------------------------------------------------------------------------

def _patch_forward(mod: nn.Module, forward: Callable) -> None:
    mod.forward = forward  # an instance attribute: __call__ and the module hooks still run


def scale_output(run: Run, path: str, factor: float = 1.02) -> None:
    """The module computes its output 2 % too large: a pure scale error."""
    mod = module(run.model, path)
    original = mod.forward
    _patch_forward(mod, lambda *args, **kwargs: original(*args, **kwargs) * factor)


def handwritten_activation(run: Run, path: str) -> None:
    """A hand-written sigmoid approximation replaces the activation kernel: x * sigmoid(1.702 x)."""
    _patch_forward(module(run.model, path), lambda x: x * torch.sigmoid(1.702 * x))


def onepass_layernorm(run: Run, path: str) -> None:
    """A hand-written LayerNorm taking the variance in one pass, E[x^2] - E[x]^2."""
    ln = module(run.model, path)

    def forward(x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) * torch.rsqrt(var + ln.eps) * ln.weight + ln.bias

    _patch_forward(ln, forward)


def naive_softmax(run: Run, path: str) -> None:
    """Inside the attention module, softmax without subtracting the max: exp(x) / sum(exp(x))."""
    attn = module(run.model, path)
    original = attn.forward

    def softmax(x, dim=-1, dtype=None, **_):
        e = torch.exp(x if dtype is None else x.to(dtype))
        return e / e.sum(dim, keepdim=True)

    def forward(*args, **kwargs):
        saved = nn.functional.softmax
        nn.functional.softmax = softmax
        try:
            return original(*args, **kwargs)
        finally:
            nn.functional.softmax = saved

    _patch_forward(attn, forward)


def sqrt_activation(run: Run, path: str) -> None:
    """A hand-written activation that takes the square root of its input, negative values included."""
    _patch_forward(module(run.model, path), torch.sqrt)


class ScaledGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor`` (1.05 unless given)."""

    @staticmethod
    def forward(ctx, x, factor=1.05):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def backward_only(run: Run, path: str) -> None:
    """The activation's forward is right; the gradient through it is 5 % too large."""
    mod = module(run.model, path)
    original = mod.forward
    _patch_forward(mod, lambda *args, **kwargs: ScaledGradient.apply(original(*args, **kwargs)))


def layernorm_eps(run: Run, path: str) -> None:
    """The LayerNorm is called with epsilon 0.1 instead of the model's: the right kernel, the wrong call."""
    ln = module(run.model, path)
    _patch_forward(ln, lambda x: nn.functional.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, 1e-1))


def gelu_tanh(run: Run, path: str) -> None:
    """GELU's tanh approximation instead of the exact GELU: errors near 1e-3, below any cosine threshold."""
    _patch_forward(module(run.model, path), lambda x: nn.functional.gelu(x, approximate="tanh"))


def drop_bias(run: Run, path: str) -> None:
    """The Linear layer forgets its bias."""
    linear = module(run.model, path)
    _patch_forward(linear, lambda x: nn.functional.linear(x, linear.weight))


def conv_noise(run: Run, path: str) -> None:
    """The convolution adds noise of 1e-2 to its output (a kernel reading uninitialised memory, say)."""
    conv = module(run.model, path)
    original = conv.forward
    generator = torch.Generator().manual_seed(1)

    def forward(x):
        y = original(x)
        return y + 1e-2 * torch.randn(y.shape, generator=generator)

    _patch_forward(conv, forward)


def attention_scale(run: Run, path: str) -> None:
    """The attention scales its scores by 1/d instead of 1/sqrt(d) (the module's ``scaling`` squared)."""
    attn = module(run.model, path)
    attn.scaling = attn.scaling ** 2


def transposed_weight(run: Run, path: str) -> None:
    """A square Linear multiplies by W instead of W^T: every shape agrees, the values do not."""
    linear = module(run.model, path)
    _patch_forward(linear, lambda x: x @ linear.weight + linear.bias)


class _WeightGradientScaled(torch.autograd.Function):
    """A hand-written Linear: right forward and input gradient, weight gradient 5 % too large."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        return grad @ weight, (rows.t() @ x.reshape(-1, x.shape[-1])) * 1.05, rows.sum(0)


def weight_gradient(run: Run, path: str) -> None:
    """The Linear's forward is right; its custom backward makes the weight gradient 5 % too large."""
    linear = module(run.model, path)
    _patch_forward(linear, lambda x: _WeightGradientScaled.apply(x, linear.weight, linear.bias))


def summed_variance(run: Run, path: str) -> None:
    """A hand-written LayerNorm whose variance sums over the features instead of averaging."""
    ln = module(run.model, path)

    def forward(x):
        centered = x - x.mean(-1, keepdim=True)
        return centered / torch.sqrt((centered * centered).sum(-1, keepdim=True) + ln.eps) * ln.weight + ln.bias

    _patch_forward(ln, forward)


def batchnorm_eval(run: Run, path: str) -> None:
    """The BatchNorm normalises with its running statistics (eval mode) while the model trains."""
    bn = module(run.model, path)
    _patch_forward(bn, lambda x: nn.functional.batch_norm(x, bn.running_mean.clone(), bn.running_var.clone(),
                                                          bn.weight, bn.bias, False, 0.0, bn.eps))


def dropout_left_on(run: Run, path: str) -> None:
    """A dropout of 0.1 after the module that golden does not have."""
    mod = module(run.model, path)
    original = mod.forward
    _patch_forward(mod, lambda *args, **kwargs: nn.functional.dropout(original(*args, **kwargs), 0.1, training=True))


def gradient_noise(run: Run, path: str) -> None:
    """A tensor hook on the module's weight adds noise of 1e-2 of its norm to the weight's gradient (a
    hand-written gradient-noise or clipping hook gone wrong): forward and every other gradient are right."""
    weight = module(run.model, path).weight
    generator = torch.Generator().manual_seed(1)

    def hook(grad):
        noise = torch.randn(grad.shape, generator=generator)
        return grad + noise * (1e-2 * grad.norm() / noise.norm())

    weight.register_hook(hook)


def activation_gradient_noise(run: Run, path: str) -> None:
    """A tensor hook on the module's output adds noise of 5e-2 of its norm to the gradient flowing back into
    the module (a debugging hook left in): forward is right, backward from there on is not."""
    mod = module(run.model, path)
    original = mod.forward
    generator = torch.Generator().manual_seed(1)

    def hook(grad):
        noise = torch.randn(grad.shape, generator=generator)
        return grad + noise * (5e-2 * grad.norm() / noise.norm())

    def forward(*args, **kwargs):
        y = original(*args, **kwargs)
        if y.requires_grad:
            y.register_hook(hook)
        return y

    _patch_forward(mod, forward)


def clamped_input_ids(run: Run, path: str) -> None:
    """The model's forward feeds ``clamp(input_ids - 1, min=0)`` to the network (an off-by-one between a
    tokenizer and the vocabulary) while the labels stay right; ``path`` is the embedding that reads them."""
    original = run.model.forward
    _patch_forward(run.model, lambda input_ids, **kwargs: original((input_ids - 1).clamp(min=0), **kwargs))


def shifted_ids(run: Run, path: str) -> None:
    """The embedding looks up the next token id (an off-by-one in a hand-written vocabulary mapping):
    ``(ids + 1) % vocab`` instead of ``ids``."""
    embedding = module(run.model, path)
    _patch_forward(embedding, lambda ids: nn.functional.embedding((ids + 1) % embedding.num_embeddings,
                                                                   embedding.weight, embedding.padding_idx))


@dataclass(frozen=True)
class Case:
    """One golden/target pair and the verdict it must get."""

    model: str
    target: str  # bf16 | mix | fp16 | amp16 | fp32 (the precision of the target run; amp16: float16 autocast
    # with a GradScaler)
    fault: str = ""  # "" for a clean run
    role: str = ""  # the module the fault is planted in (MODELS' roles)
    expect_class: str = "none"
    expect_direction: str = ""  # "" any
    model_kwargs: tuple = ()  # extra builder arguments, both runs
    loss_scale: float = 1.0  # target only: loss * scale in backward, gradients unscaled before the update
    condition: str = ""  # a clean difference between the runs (probed.CONDITIONS): a kernel switch, a layout

    @property
    def id(self) -> str:
        return f"{self.model}-{self.fault or 'clean'}-{self.target}" + (f"-{self.condition}" if self.condition else "")

    @property
    def clean(self) -> bool:
        return not self.fault


def optimizer_setting(name: str, change: Callable) -> Callable:
    """A fault that changes one hyperparameter of every param group of the target's optimizer."""
    def plant(run: Run, path: str) -> None:
        for group in run.optimizer.param_groups:
            group[name] = change(group[name])
    return plant


FAULTS: dict[str, Callable] = {
    "scale": scale_output, "handwritten": handwritten_activation, "onepass_ln": onepass_layernorm,
    "naive_softmax": naive_softmax, "backward_only": backward_only, "attn_overflow": None, "loss_scale": None,
    "sqrt_act": sqrt_activation, "ln_eps": layernorm_eps, "gelu_tanh": gelu_tanh, "drop_bias": drop_bias,
    "conv_noise": conv_noise, "attn_scale": attention_scale, "transposed": transposed_weight,
    "weight_grad": weight_gradient, "summed_var": summed_variance, "bn_eval": batchnorm_eval,
    "dropout_on": dropout_left_on, "grad_noise": gradient_noise, "shifted_ids": shifted_ids,
    "act_grad_noise": activation_gradient_noise, "clamped_ids": clamped_input_ids,
    "adam_eps": optimizer_setting("eps", lambda eps: 1e-2), "lr_up": optimizer_setting("lr", lambda lr: lr * 1.5),
    "betas": optimizer_setting("betas", lambda betas: (0.5, betas[1])),
}


# families and faults added later live in more.py
from tests.realmodels import more, probed, unseen  # noqa: E402

more.register(MODELS, FAULTS, NOT_CLEAN)
unseen.register(MODELS, FAULTS, NOT_CLEAN)
probed.register(MODELS, FAULTS, NOT_CLEAN)


def clean_cases() -> list[Case]:
    return [Case(model, target) for model in MODELS if model != "vit-eager" and model not in unseen.MODELS
            for target in CLEAN_TARGETS
            if (model, target) not in NOT_CLEAN and model not in probed.MODELS] + more.clean_cases() + \
        unseen.clean_cases() + probed.clean_cases()


def fault_cases() -> list[Case]:
    cases = []
    for model in ("gpt2-sdpa", "bert-eager", "vit", "resnet", "lstm"):
        cases.append(Case(model, "fp32", "scale", "act", "kernel_bug"))
    for model in ("gpt2-eager", "bert-sdpa", "vit", "resnet"):
        cases.append(Case(model, "fp32", "handwritten", "act", "kernel_bug"))
    for model in ("gpt2-sdpa", "bert-eager", "vit"):
        cases.append(Case(model, "fp16", "onepass_ln", "ln", "precision_loss", model_kwargs=(("offset", 16.0),)))
    for model in ("gpt2-eager", "bert-eager", "vit-eager"):
        cases.append(Case(model, "fp16", "attn_overflow", "attn", "overflow", model_kwargs=(("qk_scale", 3000.0),)))
        cases.append(Case(model, "fp16", "naive_softmax", "attn", "overflow", model_kwargs=(("qk_scale", 24.0),)))
    for model in ("gpt2-sdpa", "resnet"):
        cases.append(Case(model, "mix", "loss_scale", "", "overflow", "backward", loss_scale=2.0 ** 24))
    for model in ("gpt2-sdpa", "bert-sdpa", "vit"):
        cases.append(Case(model, "fp32", "backward_only", "act", "kernel_bug", "backward"))
    for model in ("bert-eager", "resnet"):
        cases.append(Case(model, "fp32", "sqrt_act", "act", "invalid_operation"))
    # model families the cases above do not hold: RMSNorm and rotary (llama), encoder-decoder (t5), depthwise
    # convolutions (convnext), a GRU
    for model in ("llama", "convnext", "t5", "gru"):
        cases.append(Case(model, "fp32", "scale", "act", "kernel_bug"))
    for model in ("llama", "distilbert", "gru"):
        cases.append(Case(model, "fp32", "backward_only", "act", "kernel_bug", "backward"))
    for model in ("distilbert", "convnext"):
        cases.append(Case(model, "fp32", "handwritten", "act", "kernel_bug"))
    cases.append(Case("distilbert", "fp16", "onepass_ln", "ln", "precision_loss", model_kwargs=(("offset", 16.0),)))
    cases.append(Case("t5", "fp32", "sqrt_act", "act", "invalid_operation"))
    cases.append(Case("llama", "mix", "loss_scale", "", "overflow", "backward", loss_scale=2.0 ** 24))
    # the right kernels called wrongly, or with a small error of their own
    cases.append(Case("bert-eager", "fp32", "ln_eps", "ln2", "kernel_bug"))
    cases.append(Case("vit", "fp32", "ln_eps", "ln", "kernel_bug"))
    cases.append(Case("bert-eager", "fp32", "gelu_tanh", "act", "kernel_bug"))
    cases.append(Case("vit", "fp32", "gelu_tanh", "act", "kernel_bug"))
    cases.append(Case("bert-eager", "fp32", "drop_bias", "fc", "kernel_bug"))
    cases.append(Case("resnet", "fp32", "conv_noise", "conv", "kernel_bug"))
    # code bugs that keep every shape: a wrong attention scale, a transposed weight, a wrong gradient of a
    # hand-written Linear, a variance summed instead of averaged, BatchNorm in eval mode, a stray dropout
    cases.append(Case("bert-sdpa", "fp32", "attn_scale", "attn", "kernel_bug"))
    cases.append(Case("gpt2-eager", "fp32", "attn_scale", "attn", "kernel_bug"))
    cases.append(Case("mlp", "fp32", "transposed", "fc", "kernel_bug"))
    cases.append(Case("mlp", "fp32", "weight_grad", "fc", "kernel_bug", "backward"))
    cases.append(Case("mlp", "fp32", "summed_var", "ln", "kernel_bug"))
    cases.append(Case("cnn", "fp32", "bn_eval", "bn", "kernel_bug"))
    cases.append(Case("cnn", "fp32", "dropout_on", "act", "kernel_bug"))
    # faults outside any paired op: a gradient hook only the target has, token ids shifted before the lookup
    cases.append(Case("mlp", "fp32", "grad_noise", "fc", "kernel_bug", "backward"))
    # the optimizer configured differently: its update ops are called with another eps, lr or beta
    cases.append(Case("mlp", "fp32", "adam_eps", "", "kernel_bug", "optimizer"))
    cases.append(Case("resnet", "fp32", "lr_up", "", "kernel_bug", "optimizer"))
    cases.append(Case("bert-eager", "fp32", "betas", "", "kernel_bug", "optimizer"))
    cases.append(Case("bert-eager", "fp32", "grad_noise", "fc", "kernel_bug", "backward"))
    cases.append(Case("gru", "fp32", "shifted_ids", "embed", "kernel_bug"))
    cases.append(Case("bert-eager", "fp32", "shifted_ids", "embed", "kernel_bug"))
    cases.append(Case("cnn", "fp32", "act_grad_noise", "act", "kernel_bug", "backward"))
    cases.append(Case("gpt2-eager", "fp32", "clamped_ids", "embed", "kernel_bug"))
    return cases + more.fault_cases() + unseen.fault_cases() + probed.fault_cases()


# ---- running a case ----------------------------------------------------------------------------

_UNSUPPORTED: dict[tuple[str, str], str | None] = {}


def unsupported(case: Case) -> str | None:
    """Why this CPU cannot run ``case`` at all (its torch kernel fails, with or without us), else None.

    oneDNN's bf16 LSTM primitive needs AVX-512 (BF16) or AMX: on an AVX2-only
    CPU such as an older AMD EPYC, torch's own bf16 autocast LSTM raises
    "could not create a primitive descriptor". The case is then skipped, not failed.
    """
    key = (case.model, case.target)
    if key not in _UNSUPPORTED:
        _UNSUPPORTED[key] = None
        if case.model == "lstm" and case.target == "bf16":
            layer = nn.LSTM(4, 4, batch_first=True)
            try:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    layer(torch.zeros(1, 2, 4))
            except RuntimeError as exc:
                _UNSUPPORTED[key] = f"torch's bf16 LSTM does not run on this CPU: {str(exc).splitlines()[0]}"
    return _UNSUPPORTED[key]


def build(case: Case, seed: int = 0) -> Run:
    builder, kwargs, _ = MODELS[case.model]
    torch.manual_seed(seed)
    return builder(**kwargs, **dict(case.model_kwargs))


def train(run: Run, steps: int = STEPS, loss_scale: float = 1.0, scaler=None) -> list[float]:
    """``steps`` optimizer steps; ``loss_scale``: a fixed scale, gradients unscaled before the update;
    ``scaler``: a GradScaler's dynamic loss scaling (the target's loss scale recorded at each step)."""
    losses = []
    for _ in range(steps):
        run.optimizer.zero_grad()
        for k in range(run.accumulate):
            with _autocast_region():
                loss = run.loss(run.model, _micro_batch(run, k))
            part = loss / run.accumulate if run.divide and run.accumulate > 1 else loss
            if scaler is not None:
                part = scaler.scale(part)
            (part * loss_scale if loss_scale != 1.0 else part).backward()
        if loss_scale != 1.0:
            with torch.no_grad():
                for p in run.model.parameters():
                    if p.grad is not None:
                        p.grad.div_(loss_scale)
        if scaler is not None:
            scaler.unscale_(run.optimizer)
        if run.clip is not None:
            nn.utils.clip_grad_norm_(run.model.parameters(), run.clip)
        if scaler is None:
            run.optimizer.step()
            ptt.step(loss, loss_scale)
        else:
            scaler.step(run.optimizer)
            ptt.step(loss, scaler.get_scale())
            scaler.update()
        losses.append(float(loss.detach()))
    return losses


def _micro_batch(run: Run, k: int) -> dict:
    if run.accumulate == 1:
        return run.batch
    return {key: value.chunk(run.accumulate)[k] if torch.is_tensor(value) and value.dim() else value
            for key, value in run.batch.items()}


_AUTOCAST: list = []


@contextlib.contextmanager
def _autocast_region():
    """The forward pass (only) under the target's autocast, as torch recommends."""
    with (torch.autocast("cpu", dtype=_AUTOCAST[0]) if _AUTOCAST else contextlib.nullcontext()):
        yield


def _target_context(target: str):
    if target == "mix":
        return ptt.simulate_npu("allow_mix_precision")
    if target == "fp16":
        return ptt.simulate_npu("force_fp16")
    return contextlib.nullcontext()


def _dnn(case: Case):
    return torch.backends.mkldnn.flags(enabled=False) if case.model.endswith("nodnn") else contextlib.nullcontext()


def collect(case: Case, workdir: Path, mode: str = "dump", goldens: Path | None = None,
            level: str = "op") -> tuple[Path, Path]:
    """Write golden.h5 and target.h5 of ``case`` into ``workdir``; with ``goldens``, one golden dump per model
    and model arguments is kept there and shared by the cases that need it. ``level``: ptt.dump's capture
    level ("module": module calls only)."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "target.h5"
    golden_side, target_side, setup = probed.CONDITIONS.get(case.condition, probed.NO_CONDITION)
    golden = workdir / "golden.h5" if goldens is None else \
        goldens / (f"{case.model}-{'-'.join(f'{k}{v}' for k, v in case.model_kwargs)}-{mode}-{level}"
                   f"{'-' + case.condition if golden_side is not contextlib.nullcontext else ''}.h5")
    with _dnn(case):
        if not golden.exists():
            run = build(case)
            with golden_side(), ptt.dump(golden, mode=mode, model=case.model, seed=0, level=level):
                train(run, run.steps or STEPS)
        run = build(case)
        setup(run)
        if case.fault and FAULTS[case.fault] is not None:
            FAULTS[case.fault](run, MODELS[case.model][2].get(case.role, ""))  # role "": the whole run
        _AUTOCAST[:] = {"bf16": [torch.bfloat16], "amp16": [torch.float16]}.get(case.target, [])
        scaler = torch.amp.GradScaler("cpu", **{"init_scale": 2.0 ** 10, **(run.scaler or {})}) \
            if case.target == "amp16" else None
        try:
            with target_side(), _target_context(case.target), \
                    ptt.dump(target, mode=mode, model=case.model, seed=0, level=level):
                train(run, run.steps or STEPS, loss_scale=case.loss_scale, scaler=scaler)
        finally:
            _AUTOCAST.clear()
    return golden, target


def run_case(case: Case, workdir: Path):
    """Collect ``case`` and diagnose it; returns the `Diagnosis`."""
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    golden, target = collect(case, workdir)
    with open_dump(golden) as g, open_dump(target) as t:
        return diagnose(g, t)


def judge(case: Case, diagnosis) -> tuple[bool, str]:
    """(right, why): a clean case wants class none; a fault its class, direction and module."""
    verdict = diagnosis.verdict
    said = f"{verdict.cls} at {verdict.op} ({verdict.direction})"
    if case.clean:
        return verdict.cls == "none", said
    if verdict.cls != case.expect_class:
        return False, said
    if case.expect_direction and verdict.direction != case.expect_direction:
        return False, said
    if case.role:
        _, _, roles = MODELS[case.model]
        where = "." + (verdict.module or verdict.op or "").replace("/", ".") + "."
        if f".{roles[case.role]}." not in where:
            return False, said
    return True, said


def isclose_losses(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b))
