"""Seeded synthetic data for any `DataSpec`: learnable tasks, the same on every device.

The batch of step ``s`` comes from ``np.random.default_rng([seed, s])`` and a
fixed "teacher" (the rule that makes the labels) from its own seed, so a
golden and an npu run see the same batches, and a batch does not depend on
which steps ran before it.

========  ==================================================  ==========================================
kind      classification (``num_classes`` = C)                 regression (``output_dim`` = D)
========  ==================================================  ==========================================
features  z ~ N(0, 1), x = offset + scale z;                  y = tanh(z @ W1 / sqrt(d)) @ W2
          label = argmax(z @ W)
images    x = class template + N(0, 1) noise; a template is    x = per-sample channel offsets u + noise;
          a per-channel level plus a spatial pattern           y = u @ W
tokens    tokens lean to one group (token % C); label = the    y = (share of each token group) @ W
          group that occurs most often (argmax, lowest wins)
========  ==================================================  ==========================================
"""

from __future__ import annotations

import numpy as np

from precision_tool.errors import ConfigError

TOKEN_GROUPS = 4  # token groups of the tokens/regression task
TOKEN_BIAS = 0.4  # share of a sequence drawn from its leaning group
_TEACHER_KEY = (0x5EED, 0xDA7A, 1)  # never equal to a (seed, step) pair, even zero-padded
_EVAL_KEY = (0x5EED, 0xE7A1)  # held-out batches: [seed, *_EVAL_KEY, index], apart from training and teacher
EVAL_SET_BATCHES = 8  # the held-out set an evaluation with eval_steps -1 covers


def batch_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of step ``step``'s batch."""
    return np.random.default_rng([seed, step])


class SyntheticData:
    """Batches ``{"x", "labels"}`` of a model's `DataSpec`."""

    def __init__(self, spec, seed: int, batch_size: int):
        check_spec(spec)
        self.spec = spec
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self.shape = tuple(int(n) for n in spec.shape)
        teacher = np.random.default_rng([self.seed, *_TEACHER_KEY])
        make = {"features": self._features_teacher, "images": self._images_teacher,
                "tokens": self._tokens_teacher}[spec.kind]
        make(teacher)

    @property
    def classification(self) -> bool:
        return self.spec.task == "classification"

    @property
    def n_out(self) -> int:
        return int(self.spec.num_classes if self.classification else self.spec.output_dim)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """The inputs of step ``step``: float32 or int64 ``x``; int64 or float32 ``labels``."""
        return self._batch(batch_rng(self.seed, step))

    def eval_batch(self, index: int) -> dict[str, np.ndarray]:
        """Held-out batch ``index``: the same task, never a training batch."""
        return self._batch(np.random.default_rng([self.seed, *_EVAL_KEY, index]))

    def _batch(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        x, labels = getattr(self, f"_{self.spec.kind}_batch")(rng)
        labels = labels.astype(np.int64) if self.classification else labels.astype(np.float32)
        return {"x": x, "labels": labels}

    # features
    def _features_teacher(self, rng) -> None:
        d = int(np.prod(self.shape))
        if self.classification:
            self.w = rng.standard_normal((d, self.n_out)).astype(np.float32)
        else:
            self.w1 = (rng.standard_normal((d, 16)) / np.sqrt(d)).astype(np.float32)
            self.w2 = (rng.standard_normal((16, self.n_out)) / 2).astype(np.float32)

    def _features_batch(self, rng):
        z = rng.standard_normal((self.batch_size, *self.shape)).astype(np.float32)
        flat = z.reshape(self.batch_size, -1)
        x = z
        if self.spec.offset or self.spec.scale != 1.0:  # raw readings; the teacher sees z
            x = (np.float32(self.spec.offset) + np.float32(self.spec.scale) * z).astype(np.float32)
        if self.classification:
            return x, np.argmax(flat @ self.w, axis=1)
        return x, np.tanh(flat @ self.w1) @ self.w2

    # images (C, H, W)
    def _images_teacher(self, rng) -> None:
        channels = self.shape[0]
        if self.classification:
            levels = rng.standard_normal((self.n_out, channels, 1, 1))
            patterns = rng.standard_normal((self.n_out, *self.shape))
            self.templates = (levels + 0.5 * patterns).astype(np.float32)
        else:
            self.w = (rng.standard_normal((channels, self.n_out)) / np.sqrt(channels)).astype(np.float32)

    def _images_batch(self, rng):
        n = self.batch_size
        if self.classification:
            labels = rng.integers(0, self.n_out, n)
            noise = rng.standard_normal((n, *self.shape)).astype(np.float32)
            return self.templates[labels] + noise, labels
        offsets = rng.standard_normal((n, self.shape[0])).astype(np.float32)
        noise = rng.standard_normal((n, *self.shape)).astype(np.float32)
        x = offsets.reshape(n, -1, *([1] * (len(self.shape) - 1))) + noise
        return x, offsets @ self.w

    # tokens (seq,)
    def _tokens_teacher(self, rng) -> None:
        self.groups = self.n_out if self.classification else TOKEN_GROUPS
        vocab = int(self.spec.vocab_size)
        if vocab < self.groups:
            raise ConfigError(f"a tokens data spec needs vocab_size >= {self.groups}, got {vocab}")
        if not self.classification:
            self.w = rng.standard_normal((self.groups, self.n_out)).astype(np.float32)

    def _tokens_batch(self, rng):
        n, vocab, groups = self.batch_size, int(self.spec.vocab_size), self.groups
        leaning = rng.integers(0, groups, n)
        uniform = rng.integers(0, vocab, (n, *self.shape))
        # a token of the leaning group g is g + groups * k, for k while it stays in the vocabulary
        lead = leaning.reshape(n, *([1] * len(self.shape)))
        biased = lead + groups * rng.integers(0, (vocab - 1 - lead) // groups + 1, (n, *self.shape))
        tokens = np.where(rng.random((n, *self.shape)) < TOKEN_BIAS, biased, uniform).astype(np.int64)
        counts = np.stack([(tokens % groups == g).reshape(n, -1).sum(axis=1) for g in range(groups)], axis=1)
        if self.classification:
            return tokens, np.argmax(counts, axis=1)
        share = (counts / counts.sum(axis=1, keepdims=True)).astype(np.float32)
        return tokens, share @ self.w


def check_spec(spec) -> None:
    """Refuse, in one line, a `DataSpec` the generator cannot serve (DataSpec checks the rest)."""
    if spec.kind == "images" and len(tuple(spec.shape)) != 3:
        raise ConfigError(f"an images data spec needs a (channels, height, width) shape, got {tuple(spec.shape)}")
