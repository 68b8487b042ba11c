"""The sample models, and loading a user's model from ``path/to/file.py:factory``.

Every model is small enough that a training step takes milliseconds on a CPU:

``mlp``
    16 features -> Dense 64 relu -> Dense 64 relu -> 4 classes; batch 32.
``mlp_regression``
    the same network with 2 outputs, trained with MSELoss on a tanh teacher.
``cnn``
    3x8x8 images, 4 classes: a 3x3 conv stem (8 channels) with BatchNorm and
    ReLU, two ResNet basic blocks (conv-BN-ReLU-conv-BN plus the identity,
    then ReLU), global average pooling and a Dense head; batch 32.
``transformer``
    sequences of 16 tokens from a vocabulary of 32, 4 classes (which token
    group, token % 4, occurs most often): token and learned position
    embeddings, two pre-LayerNorm blocks of 2-head self-attention and a GELU
    MLP (32 -> 64 -> 32), a final LayerNorm, mean pooling and a Dense head;
    batch 32.
``sensor``
    the demo's model, with a planted, realistic fault: 16 raw sensor readings
    around 30 (offset 30, scale 1) go through a LayerNorm built from
    primitive ops, as TensorFlow builds one, then Dense 32 relu and a Dense
    head, 4 classes. On the npu, LayerNormFusionPass fuses that LayerNorm
    into one kernel that takes the variance in a single pass,
    E[x^2] - E[x]^2, in the compute dtype: with |mean| >> std that
    cancellation destroys the result, while the unfused ops stay accurate.

A user's factory is called with a ``numpy.random.Generator`` (seeded by the
run seed) when it takes an argument, else with none, and must return a
`precision_tool.engine.layers.Model` with its ``data`` `DataSpec`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from precision_tool.engine import functional as F
from precision_tool.engine.layers import (BatchNorm, Conv2d, DataSpec, Dense, Embedding, LayerNorm, Model,
                                          Module, MultiHeadAttention, Relu, Sequential)
from precision_tool.engine.graph import Parameter
from precision_tool.errors import ConfigError, InputError, PrecisionToolError

DEFAULT_BATCH_SIZE = 32
USER_MODEL_FORM = "FILE.py:FACTORY"


class MLP(Model):
    """Two hidden ReLU layers of 64 on 16 features."""

    def __init__(self, rng: np.random.Generator, task: str = "classification", outputs: int = 4):
        if task == "classification":
            self.data = DataSpec("features", (16,), task, num_classes=outputs)
        else:
            self.data = DataSpec("features", (16,), task, output_dim=outputs)
        self.fc1 = Dense(16, 64, "relu", rng=rng)
        self.fc2 = Dense(64, 64, "relu", rng=rng)
        self.head = Dense(64, outputs, rng=rng)

    def forward(self, x):
        return self.head(self.fc2(self.fc1(x)))


class BasicBlock(Module):
    """ResNet basic block: relu(x + bn2(conv2(relu(bn1(conv1(x))))))."""

    def __init__(self, channels: int, rng: np.random.Generator):
        self.conv1 = Conv2d(channels, channels, 3, padding=1, rng=rng)
        self.bn1 = BatchNorm(channels)
        self.relu1 = Relu()
        self.conv2 = Conv2d(channels, channels, 3, padding=1, rng=rng)
        self.bn2 = BatchNorm(channels)
        self.relu2 = Relu()

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(F.add(x, y))


class CNN(Model):
    """A two-block ResNet on 3x8x8 images."""

    def __init__(self, rng: np.random.Generator, channels: int = 8, classes: int = 4):
        self.data = DataSpec("images", (3, 8, 8), "classification", num_classes=classes)
        self.stem = Sequential(Conv2d(3, channels, 3, padding=1, rng=rng), BatchNorm(channels), Relu())
        self.block1 = BasicBlock(channels, rng)
        self.block2 = BasicBlock(channels, rng)
        self.head = Dense(channels, classes, rng=rng)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        return self.head(F.reduce_mean(x, axis=(2, 3)))


class TransformerBlock(Module):
    """Pre-LayerNorm block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, dim: int, heads: int, rng: np.random.Generator):
        self.ln1 = LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, rng=rng)
        self.ln2 = LayerNorm(dim)
        self.mlp = Sequential(Dense(dim, 2 * dim, "gelu", rng=rng), Dense(2 * dim, dim, rng=rng))

    def forward(self, x):
        x = F.add(x, self.attn(self.ln1(x)))
        return F.add(x, self.mlp(self.ln2(x)))


class Transformer(Model):
    """Classifies which token group dominates a sequence of 16 tokens."""

    def __init__(self, rng: np.random.Generator, seq_len: int = 16, vocab: int = 32, dim: int = 32,
                 heads: int = 2, blocks: int = 2, classes: int = 4):
        self.data = DataSpec("tokens", (seq_len,), "classification", num_classes=classes, vocab_size=vocab)
        self.embed = Embedding(vocab, dim, rng=rng)
        self.position = Parameter(rng.standard_normal((seq_len, dim)).astype(np.float32) * np.float32(0.1))
        self.blocks = Sequential(*(TransformerBlock(dim, heads, rng) for _ in range(blocks)))
        self.ln = LayerNorm(dim)
        self.head = Dense(dim, classes, rng=rng)

    def forward(self, tokens):
        x = F.add(self.embed(tokens), self.position)
        x = self.ln(self.blocks(x))
        return self.head(F.reduce_mean(x, axis=1))


class Sensor(Model):
    """Classifies raw readings around 30 after a composite LayerNorm (the demo's planted fault)."""

    def __init__(self, rng: np.random.Generator, features: int = 16, classes: int = 4):
        self.data = DataSpec("features", (features,), "classification", num_classes=classes, offset=30.0)
        self.norm = LayerNorm(features, composite=True)
        self.fc1 = Dense(features, 32, activation="relu", rng=rng)
        self.head = Dense(32, classes, rng=rng)

    def forward(self, x):
        return self.head(self.fc1(self.norm(x)))


@dataclass(frozen=True)
class ModelEntry:
    """A built-in model: its factory and training defaults."""

    factory: Callable[[np.random.Generator], Model]
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: dict[str, float] = field(default_factory=dict)  # per optimizer; else the optimizer's default


_BUILTIN: dict[str, ModelEntry] = {
    "mlp": ModelEntry(MLP, lr={"sgd": 0.3}),
    "mlp_regression": ModelEntry(lambda rng: MLP(rng, "regression", 2)),
    "cnn": ModelEntry(CNN),
    "transformer": ModelEntry(Transformer),
    "sensor": ModelEntry(Sensor),
}
MODELS: tuple[str, ...] = tuple(_BUILTIN)


@dataclass
class LoadedModel:
    """A built model with the defaults it trains with."""

    model: Model
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: dict[str, float] = field(default_factory=dict)


def is_user_model(name: str) -> bool:
    """True for a ``FILE.py:FACTORY`` reference."""
    path, sep, factory = str(name).rpartition(":")
    return bool(sep) and path.endswith(".py") and factory.isidentifier()


def check_model_name(name: str) -> None:
    """Refuse an unknown model name or a missing user file, before any model is built."""
    if name in _BUILTIN:
        return
    if is_user_model(name):
        path = Path(name.rpartition(":")[0])
        if not path.is_file():
            raise InputError(path, "no such file (model factory file)")
        return
    raise ConfigError(f"unknown model {name!r}; valid: {', '.join(MODELS)}, or {USER_MODEL_FORM}")


def load_model(name: str, rng: np.random.Generator) -> LoadedModel:
    """Build a built-in model by name, or a user's from ``FILE.py:FACTORY``."""
    check_model_name(name)
    if name in _BUILTIN:
        entry = _BUILTIN[name]
        return LoadedModel(entry.factory(rng), entry.batch_size, dict(entry.lr))
    path_text, _, factory_name = name.rpartition(":")
    path = Path(path_text)
    factory = _load_factory(path, factory_name)
    try:
        model = factory(rng) if _takes_argument(factory) else factory()
    except PrecisionToolError:
        raise
    except SystemExit as exc:  # sys.exit(5) in the user's code: not an exit status of ours
        raise InputError(path, f"{factory_name}() called exit({exc.code!r}) instead of returning a model") from None
    except Exception as exc:  # the user's code: report it in one line
        raise InputError(path, f"{factory_name}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, Module) or not isinstance(getattr(model, "data", None), DataSpec):
        raise InputError(path, f"{factory_name}() returned {type(model).__name__}, not a layer-API Model "
                               "with a data DataSpec")
    return LoadedModel(model)


def _load_factory(path: Path, factory_name: str) -> Callable:
    digest = hashlib.sha1(os.fsencode(path.resolve())).hexdigest()[:12]  # (a name need not be UTF-8)
    module_name = f"precision_tool_user_model_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InputError(path, "cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # a training script given as a model file: it must not end precision-tool
        sys.modules.pop(module_name, None)
        raise InputError(path, f"called exit({exc.code!r}) while being imported; a model file defines "
                               "a factory and runs nothing") from None
    except Exception as exc:  # the user's code: report it in one line
        sys.modules.pop(module_name, None)
        raise InputError(path, f"failed to import: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise InputError(path, f"defines no factory function {factory_name!r}")
    return factory


def _takes_argument(factory: Callable) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    return any(p.kind in positional for p in parameters)
