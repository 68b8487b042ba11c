"""Collection modes, which of them combine, and the role a dump plays.

``dump``
    every selected op's inputs and outputs, with statistics.
``stats``
    statistics only (shape, dtype, min, max, mean, std, L2 norm, NaN, Inf and
    saturated counts); no tensor data.
``overflow``
    only the ops that raised the float status, in execution order, with all
    their tensors; the op selection does not apply (every overflowing op of a
    selected step is kept).
``fusion-off``
    the npu device with every fusion pass off (or as ``--fusion-switch``
    says) and a full dump.

Combinations, written ``overflow,stats`` (order does not matter):

* ``overflow,stats``: statistics of every selected op, plus the tensors of
  every op that overflowed: one run gives both the stats comparison and the
  overflow evidence.
* ``fusion-off`` with ``stats``, ``overflow`` or both: the fusion-off device,
  recording what those modes record.
* ``dump`` combines with nothing but ``fusion-off`` (where it is implied):
  it already records every tensor with its statistics and overflow flag.
"""

from __future__ import annotations

from precision_tool.errors import ConfigError

DUMP, STATS, OVERFLOW, FUSION_OFF = "dump", "stats", "overflow", "fusion-off"
MODES = (DUMP, STATS, OVERFLOW, FUSION_OFF)
MODE_FORM = "dump, stats, overflow or fusion-off, or a combination such as overflow,stats"
ROLES = ("golden", "target", "overflow", "fusion-off")


def parse_modes(spec) -> tuple[str, ...]:
    """``"overflow,stats"`` (or a list) -> the modes in canonical order; ConfigError if invalid."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or ())
    modes = {str(m).strip().lower().replace("_", "-") for m in items if str(m).strip()}
    if not modes:
        raise ConfigError(f"no collection mode given; expected {MODE_FORM}")
    unknown = sorted(modes - set(MODES))
    if unknown:
        raise ConfigError(f"unknown collection mode {unknown[0]!r}; expected {MODE_FORM}")
    if DUMP in modes and FUSION_OFF in modes:
        modes.discard(DUMP)  # fusion-off is a full dump already
    if DUMP in modes and len(modes) > 1:
        other = sorted(modes - {DUMP})[0]
        raise ConfigError(f"mode dump cannot be combined with {other}: dump already records every tensor "
                          "with its statistics and overflow flag (overflow,stats records statistics "
                          "everywhere and tensors where an op overflowed)")
    return tuple(m for m in MODES if m in modes)


def primary_mode(modes: tuple[str, ...]) -> str:
    """The one-word mode readers see as ``dump.mode``."""
    if FUSION_OFF in modes:
        return FUSION_OFF
    if modes == (OVERFLOW,):
        return OVERFLOW
    if STATS in modes:
        return STATS
    return DUMP


def role_for(modes: tuple[str, ...], device_kind: str) -> str:
    """What the dump is for: the golden reference, a target run, an overflow trace, a fusion-off run."""
    if device_kind == "golden":
        return "golden"
    if FUSION_OFF in modes:
        return "fusion-off"
    if modes == (OVERFLOW,):
        return "overflow"
    return "target"


def records_data(modes: tuple[str, ...]) -> bool:
    """Whether selected ops keep their tensors (not only statistics)."""
    return STATS not in modes and OVERFLOW not in modes


def records_every_op(modes: tuple[str, ...]) -> bool:
    """Whether selected ops are recorded whether or not they overflowed."""
    return OVERFLOW not in modes or STATS in modes
