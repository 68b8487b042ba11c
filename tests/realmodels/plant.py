"""The planted faults of the real-model suite (tests/realmodels/cases.py's ``FAULTS``): each patches one module
of a built `Run` (found by its dotted path) so that the target run computes something else there.

cases.py imports these names; it holds the models, the cases and how a case runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

if TYPE_CHECKING:
    from tests.realmodels.models import Run

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
