"""The layer API: torch-like modules that trace ops under hierarchical names.

A module's ops are traced inside a scope named after the attribute that holds
it in its parent, so a Dense stored as ``model.mlp.fc1`` traces
``mlp/fc1/MatMul``, ``mlp/fc1/BiasAdd``, ``mlp/fc1/Gelu``, and its parameters
are named ``mlp/fc1/weight`` and ``mlp/fc1/bias``. The root `Model` has no
scope. Names depend only on the module tree, so they are the same on every
trace and every device. Initial weights come only from the ``rng`` a layer is
given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from precision_tool.engine import functional as F
from precision_tool.engine.graph import Graph, GraphBuilder, Parameter, Value
from precision_tool.errors import ConfigError, choice_error

DATA_KINDS = ("features", "images", "tokens")
TASKS = ("classification", "regression")
ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid")
SOFTMAX_KINDS = ("stable", "naive")
MASK_VALUE = -1e4  # "minus infinity" for masked scores that stays finite in fp16


class Module:
    """A node of the model tree: holds parameters and sub-modules in assignment order."""

    def __setattr__(self, name: str, value) -> None:
        members = self.__dict__.setdefault("_members", {})
        members.pop(name, None)
        if isinstance(value, (Parameter, Module)):
            members[name] = value
            if isinstance(value, Module):
                object.__setattr__(value, "_scope_name", name)
        object.__setattr__(self, name, value)

    def __call__(self, *args) -> Value:
        name = self.__dict__.get("_scope_name")
        if name is None:  # the root module, or one called outside any parent
            return self.forward(*args)
        with GraphBuilder.current().scope(name):
            return self.forward(*args)

    def forward(self, *args) -> Value:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def children(self) -> list[tuple[str, "Module"]]:
        """The direct sub-modules with their attribute names, in assignment order."""
        return [(n, m) for n, m in self.__dict__.get("_members", {}).items() if isinstance(m, Module)]

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """Every parameter with its "/"-joined attribute path; a shared one appears once."""
        found: list[tuple[str, Parameter]] = []
        seen: set[int] = set()
        self._collect("", found, seen)
        return found

    def _collect(self, prefix: str, found: list, seen: set[int]) -> None:
        for name, member in self.__dict__.get("_members", {}).items():
            if isinstance(member, Module):
                member._collect(f"{prefix}{name}/", found, seen)
            elif id(member) not in seen:
                seen.add(id(member))
                found.append((prefix + name, member))

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def replace_child(self, name: str, module: "Module") -> None:
        """Put ``module`` where the sub-module ``name`` is, keeping the order (a graph rewrite)."""
        members = self.__dict__["_members"]
        if not isinstance(members.get(name), Module):
            raise ConfigError(f"{type(self).__name__} has no sub-module {name!r}")
        object.__setattr__(module, "_scope_name", name)
        object.__setattr__(self, name, module)
        self.__dict__["_members"] = {k: (module if k == name else v) for k, v in members.items()}

    def module(self, path: str) -> "Module":
        """The sub-module at the "/"-joined attribute ``path`` ("" is this module)."""
        module = self
        for part in filter(None, path.split("/")):
            child = module.__dict__.get("_members", {}).get(part)
            if not isinstance(child, Module):
                raise ConfigError(f"no sub-module {path!r} in {type(self).__name__}")
            module = child
        return module

    def named_modules(self, prefix: str = "") -> list[tuple[str, "Module"]]:
        """This module and every sub-module with its "/"-joined path, depth first in assignment order."""
        found = [(prefix, self)]
        for name, child in self.children():
            found += child.named_modules(f"{prefix}/{name}" if prefix else name)
        return found

    def name_parameters(self) -> None:
        """Name every parameter after its path, as graph tracing requires."""
        for path, param in self.named_parameters():
            param.name = path


class Sequential(Module):
    """Sub-modules named "0", "1", ... applied one after another."""

    def __init__(self, *modules: Module):
        for i, module in enumerate(modules):
            setattr(self, str(i), module)

    def __len__(self) -> int:
        return len(self.children())

    def __getitem__(self, index: int) -> Module:
        return self.children()[index][1]

    def forward(self, x):
        for _, module in self.children():
            x = module(x)
        return x


@dataclass(frozen=True)
class DataSpec:
    """The synthetic data a model trains on; ``shape`` is per sample."""

    kind: str  # "features", "images" or "tokens"
    shape: tuple
    task: str  # "classification" or "regression"
    num_classes: int = 0
    output_dim: int = 0
    vocab_size: int = 0
    # features only: the model sees raw readings offset + scale * z of standard features z
    offset: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise choice_error("data kind", self.kind, DATA_KINDS)
        if self.task not in TASKS:
            raise choice_error("task", self.task, TASKS)
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if self.task == "classification" and self.num_classes < 2:
            raise ConfigError("a classification DataSpec needs num_classes >= 2")
        if self.task == "regression" and self.output_dim < 1:
            raise ConfigError("a regression DataSpec needs output_dim >= 1")
        if self.kind == "tokens" and self.vocab_size < 1:
            raise ConfigError("a tokens DataSpec needs vocab_size >= 1")


class Model(Module):
    """The root module; ``data`` says what it trains on."""

    data: DataSpec


_tracing: list[DataSpec] = []  # the data of the model being traced, for layers that need its shape


def trace(model: Model) -> Graph:
    """Trace ``model`` with its loss into a Graph with outputs "logits" and "loss"."""
    spec = getattr(model, "data", None)
    if not isinstance(spec, DataSpec):
        raise ConfigError(f"{type(model).__name__}.data must be a DataSpec")
    model.name_parameters()
    _tracing.append(spec)
    try:
        with GraphBuilder() as builder:
            x = builder.input("x", is_float=spec.kind != "tokens")
            labels = builder.input("labels", is_float=spec.task == "regression")
            output = model(x)
            if spec.task == "classification":
                loss = F.softmax_cross_entropy(output, labels)
            else:
                loss = F.mse_loss(output, labels)
            builder.output("logits", output)
            builder.output("loss", loss)
    finally:
        _tracing.pop()
    return builder.graph


def _need_rng(layer: str, rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"{layer} needs rng=np.random.Generator for its initial weights")
    return rng


def _normal(rng: np.random.Generator, shape: tuple, std: float) -> Parameter:
    return Parameter(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


_ACTIVATION_FUNCTIONS = {"relu": F.relu, "gelu": F.gelu, "tanh": F.tanh, "sigmoid": F.sigmoid}


class Dense(Module):
    """``activation(x @ weight + bias)``; weight (in, out), Glorot-normal."""

    def __init__(self, in_features: int, out_features: int, activation: str | None = None,
                 bias: bool = True, rng: np.random.Generator | None = None):
        if activation is not None and activation not in ACTIVATIONS:
            raise choice_error("activation", activation, ACTIVATIONS)
        rng = _need_rng("Dense", rng)
        self.activation = activation
        self.weight = _normal(rng, (in_features, out_features), math.sqrt(2.0 / (in_features + out_features)))
        self.bias = Parameter(np.zeros(out_features, np.float32)) if bias else None

    def forward(self, x):
        y = F.matmul(x, self.weight)
        if self.bias is not None:
            y = F.bias_add(y, self.bias)
        if self.activation is not None:
            y = _ACTIVATION_FUNCTIONS[self.activation](y)
        return y


class Conv2d(Module):
    """2-D convolution of NCHW images; weight (out, in, k, k), He-normal."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = False, rng: np.random.Generator | None = None):
        rng = _need_rng("Conv2d", rng)
        self.stride, self.padding = stride, padding
        fan_in = in_channels * kernel_size * kernel_size
        self.weight = _normal(rng, (out_channels, in_channels, kernel_size, kernel_size), math.sqrt(2.0 / fan_in))
        self.bias = Parameter(np.zeros(out_channels, np.float32)) if bias else None

    def forward(self, x):
        y = F.conv2d(x, self.weight, stride=self.stride, padding=self.padding)
        if self.bias is not None:
            y = F.bias_add(y, self.bias, data_format="NCHW")
        return y


class BatchNorm(Module):
    """Training-mode batch norm over N, H, W (or N) with gamma and beta."""

    def __init__(self, num_features: int, eps: float = 1e-5, rng: np.random.Generator | None = None):
        self.eps = eps
        self.gamma = Parameter(np.ones(num_features, np.float32))
        self.beta = Parameter(np.zeros(num_features, np.float32))

    def forward(self, x):
        return F.batch_norm(x, self.gamma, self.beta, eps=self.eps)


class LayerNorm(Module):
    """Layer norm over the last axis: one op, or TF's primitive ops when ``composite``."""

    def __init__(self, dim: int, eps: float = 1e-5, composite: bool = False,
                 rng: np.random.Generator | None = None):
        self.eps = eps
        self.composite = composite
        self.gamma = Parameter(np.ones(dim, np.float32))
        self.beta = Parameter(np.zeros(dim, np.float32))

    def forward(self, x):
        if not self.composite:
            return F.layer_norm(x, self.gamma, self.beta, eps=self.eps)
        # the op sequence tf.keras/tf.contrib build, which LayerNormFusionPass recognises
        mean = F.reduce_mean(x, -1, keepdims=True)
        centered = F.sub(x, mean)
        variance = F.reduce_mean(F.square(centered), -1, keepdims=True)
        inv_std = F.rsqrt(F.add(variance, self.eps))
        return F.add(F.mul(F.mul(centered, inv_std), self.gamma), self.beta)


class Embedding(Module):
    """Rows of a (vocab_size, dim) table picked by integer tokens."""

    def __init__(self, vocab_size: int, dim: int, rng: np.random.Generator | None = None):
        rng = _need_rng("Embedding", rng)
        self.weight = _normal(rng, (vocab_size, dim), 1.0 / math.sqrt(dim))

    def forward(self, tokens):
        return F.gather(self.weight, tokens)


class _Elementwise(Module):
    function = staticmethod(F.relu)

    def forward(self, x):
        return self.function(x)


class Relu(_Elementwise):
    function = staticmethod(F.relu)


class Gelu(_Elementwise):
    function = staticmethod(F.gelu)


class Tanh(_Elementwise):
    function = staticmethod(F.tanh)


class Sigmoid(_Elementwise):
    function = staticmethod(F.sigmoid)


class Dropout(Module):
    """Inverted dropout with rate ``rate``."""

    def __init__(self, rate: float):
        self.rate = float(rate)

    def forward(self, x):
        return F.dropout(x, self.rate)


class MultiHeadAttention(Module):
    """Self-attention over (batch, seq_len, dim) with Dense projections q, k, v and out.

    ``softmax="naive"`` traces the hand-written Exp / ReduceSum / RealDiv
    without the max subtraction, which overflows fp16 once a score passes
    ln(65504) = 11.09. Splitting heads needs the sequence length at trace
    time: ``seq_len``, or else the model's data shape, (seq_len,) for tokens
    or (seq_len, dim) for features.
    """

    def __init__(self, dim: int, heads: int, rng: np.random.Generator | None = None,
                 softmax: str = "stable", causal: bool = False, seq_len: int | None = None):
        if heads < 1 or dim % heads:
            raise ConfigError(f"MultiHeadAttention: dim {dim} is not a multiple of heads {heads}")
        if softmax not in SOFTMAX_KINDS:
            raise choice_error("softmax", softmax, SOFTMAX_KINDS)
        rng = _need_rng("MultiHeadAttention", rng)
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.softmax, self.causal, self.seq_len = softmax, causal, seq_len
        self.q = Dense(dim, dim, rng=rng)
        self.k = Dense(dim, dim, rng=rng)
        self.v = Dense(dim, dim, rng=rng)
        self.out = Dense(dim, dim, rng=rng)

    def forward(self, x):
        seq_len = self._sequence_length()
        q = self._split_heads(self.q(x), seq_len)
        k = self._split_heads(self.k(x), seq_len)
        v = self._split_heads(self.v(x), seq_len)
        scores = F.batch_matmul(q, k, transpose_b=True)
        scores = F.mul(scores, 1.0 / math.sqrt(self.head_dim))
        if self.causal:
            scores = F.add(scores, causal_mask(seq_len))
        probs = F.softmax(scores, axis=-1) if self.softmax == "stable" else _naive_softmax(scores)
        context = F.transpose(F.batch_matmul(probs, v), (0, 2, 1, 3))
        return self.out(F.reshape(context, (-1, seq_len, self.dim)))

    def _split_heads(self, x, seq_len: int):
        """(B, T, D) -> (B, H, T, Dh)."""
        x = F.reshape(x, (-1, seq_len, self.heads, self.head_dim))
        return F.transpose(x, (0, 2, 1, 3))

    def _sequence_length(self) -> int:
        if self.seq_len is not None:
            return self.seq_len
        spec = _tracing[-1] if _tracing else None
        if spec is not None and (spec.kind == "tokens" or len(spec.shape) == 2):
            return spec.shape[0]
        raise ConfigError("MultiHeadAttention needs seq_len= when the data is not (seq_len,) tokens "
                          "or (seq_len, dim) features")


def causal_mask(seq_len: int) -> np.ndarray:
    """(T, T) additive mask: MASK_VALUE above the diagonal, 0 elsewhere."""
    return np.triu(np.full((seq_len, seq_len), MASK_VALUE, np.float32), k=1)


def _naive_softmax(scores):
    # no max subtraction: the classic hand-written softmax that overflows fp16
    e = F.exp(scores)
    return F.div(e, F.reduce_sum(e, axis=-1, keepdims=True))
