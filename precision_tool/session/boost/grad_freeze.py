"""GradientFreeze: parameter groups and the per-step freeze index, as mindspore.boost.grad_freeze builds them.

Groups: the trainable parameters in order; a BatchNorm parameter (or one
whose name holds ``bn``) or a bias joins the current group, any other starts
a new group once the current one holds 3. ``stride = len(groups) //
param_groups``; freeze group ``i`` is the concatenation ``groups[i*stride:]``
(index 0 trains everything, a larger index only the deeper layers; with
fewer groups than ``param_groups`` every index trains everything).

The index sequence, ``int(total_steps * 1.01)`` long and used cyclically:

* freeze_type 0 (continuous, "00001234"): ``zero_cnt = int(freeze_p * (n-1)
  // (1 - freeze_p) + 0.5)``; the block ``[0]*zero_cnt + [1..n-1]`` repeated.
  For n=10, p=0.7 the float floor division gives 20 zeros, 69.0 % of steps.
* freeze_type 1 (interval, "01020304"): start ``[0]``; while the share of
  frozen steps is below ``1 - freeze_p`` draw ``k`` from ``[n-1, ..., 1]``
  with probabilities ``[1, ..., n-1] / sum`` (a small k more likely), else 0.
  MindSpore draws from the unseeded global RNG; here the draws come from
  ``default_rng([seed, FREEZE_STREAM])``, all drawn at once, so a run is
  reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precision_tool.errors import ConfigError

CONTINUOUS, INTERVAL = 0, 1
GROUP_MIN = 3  # parameters in a group before a weight starts the next one
FREEZE_STREAM = 0xB005F  # the RNG stream of the type-1 draws, apart from weights and data


def split_parameter_groups(names: list[str], joins) -> list[list[str]]:
    """Group ``names``; ``joins(name)`` is True for a parameter that stays with the current group."""
    groups: list[list[str]] = []
    current: list[str] = []
    for name in names:
        if joins(name):
            current.append(name)
        elif len(current) >= GROUP_MIN:
            groups.append(current)
            current = [name]
        else:
            current.append(name)
    if current:
        groups.append(current)
    return groups


def freeze_groups(groups: list[list[str]], param_groups: int) -> list[list[str]]:
    """The ``param_groups`` trainable sets: set ``i`` is every group from ``i * stride`` on."""
    stride = len(groups) // param_groups
    return [sum(groups[i * stride:], []) for i in range(param_groups)]


def zero_count(n: int, freeze_p: float) -> int:
    """Leading zeros of a freeze_type 0 block."""
    return int(freeze_p * (n - 1) // (1 - freeze_p) + 0.5)


def freeze_index_sequence(n: int, freeze_type: int, freeze_p: float, total_steps: int,
                          rng: np.random.Generator | None = None) -> list[int]:
    """The freeze index of every step (see the module docstring); ``rng`` draws freeze_type 1."""
    total = int(total_steps * 1.01)
    if n <= 1:
        return [0] * total
    if freeze_type == CONTINUOUS:
        block = [0] * zero_count(n, freeze_p) + list(range(1, n))
        sequence: list[int] = []
        while len(sequence) < total:
            sequence += block
        return sequence
    if freeze_type != INTERVAL:
        raise ConfigError(f"freeze_type must be 0 or 1, got {freeze_type!r}")
    if rng is None:
        raise ConfigError("freeze_type 1 needs an rng")
    indices = list(range(1, n))
    draws = rng.choice(indices[::-1], size=total, p=np.array(indices, float) / sum(indices)).tolist()
    sequence, zeros, frozen = [0], 1, 0
    while len(sequence) < total:
        if frozen / (zeros + frozen) < 1 - freeze_p:
            sequence.append(int(draws[frozen]))
            frozen += 1
        else:
            sequence.append(0)
            zeros += 1
    return sequence


@dataclass
class GradientFreeze:
    """Which parameters train at each step; the others get no update that step."""

    groups: list[list[str]]  # the freeze groups: groups[k] trains at index k
    sequence: list[int]

    @classmethod
    def build(cls, names: list[str], joins, settings: dict, seed: int) -> "GradientFreeze":
        groups = freeze_groups(split_parameter_groups(names, joins), settings["param_groups"])
        rng = np.random.default_rng([seed, FREEZE_STREAM])
        sequence = freeze_index_sequence(len(groups), settings["freeze_type"], settings["freeze_p"],
                                         settings["total_steps"], rng)
        return cls(groups, sequence)

    def index(self, step: int) -> int:
        """The freeze index of ``step`` (the sequence repeats)."""
        return self.sequence[step % len(self.sequence)]

    def trained(self, step: int) -> list[str]:
        """The parameters updated at ``step``."""
        return self.groups[self.index(step)]
