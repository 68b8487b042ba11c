"""Boost levels and the ``boost_config_dict``: resolved, checked, with every unset key at its default.

The dict has MindSpore's shape (mindspore.boost.AutoBoost)::

    {"boost": {"mode": "auto", "less_bn": False, "grad_freeze": False, "adasum": False,
               "grad_accumulation": False, "dim_reduce": False, "loss_scale_group": False},
     "common": {"gradient_split_groups": [50, 100], "device_number": 8},
     "less_bn": {"fn_flag": True, "gc_flag": True},
     "grad_freeze": {"param_groups": 10, "freeze_type": 1, "freeze_p": 0.7, "total_steps": 65536},
     "grad_accumulation": {"grad_accumulation_step": 1},
     "dim_reduce": {"rho": 0.55, "gamma": 0.9, "alpha": 0.001, "sigma": 0.4, "n_components": 32,
                    "pca_mat_path": None, "weight_load_dir": None, "timeout": 1800},
     "loss_scale_group": {"init_loss_scale": 65536, "scale_factor": 2, "scale_window": 1000}}

(the ``loss_scale_group`` section is this tool's: MindSpore configures the
manager in code). Modes: ``auto`` takes the level's algorithms (O0 none, O1
less_bn + grad_freeze, O2 less_bn + grad_freeze + adasum); ``manual`` the
dict's flags; ``enable_all`` / ``disable_all`` every algorithm on / off.

Interactions (`active_algorithms`), as BoostTrainOneStepCell runs them:
dim_reduce on turns every other algorithm off. grad_freeze on (dim_reduce
off) replaces the train step with the freeze nets, so adasum does not run;
less_bn (a network rewrite done before) and grad_accumulation (the freeze
nets accumulate) still do. grad_accumulation on likewise bypasses adasum
(the accumulated update is a plain optimizer call). The seed's "other algorithms become ineffective"
is read as that train-step replacement, which is what the source does.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from precision_tool.errors import ConfigError, InputError
from precision_tool.inputs import read_json

BOOST_LEVELS = ("O0", "O1", "O2")
BOOST_MODES = ("auto", "manual", "enable_all", "disable_all")
ALGORITHMS = ("less_bn", "grad_freeze", "adasum", "grad_accumulation", "dim_reduce", "loss_scale_group")
LEVEL_ALGORITHMS = {"O0": (), "O1": ("less_bn", "grad_freeze"), "O2": ("less_bn", "grad_freeze", "adasum")}

DEFAULTS: dict[str, dict] = {
    "boost": {"mode": "auto", **{name: False for name in ALGORITHMS}},
    "common": {"gradient_split_groups": [50, 100], "device_number": 8},
    "less_bn": {"fn_flag": True, "gc_flag": True},
    "grad_freeze": {"param_groups": 10, "freeze_type": 1, "freeze_p": 0.7, "total_steps": 65536},
    "grad_accumulation": {"grad_accumulation_step": 1},
    "dim_reduce": {"rho": 0.55, "gamma": 0.9, "alpha": 0.001, "sigma": 0.4, "n_components": 32,
                   "pca_mat_path": None, "weight_load_dir": None, "timeout": 1800},
    "loss_scale_group": {"init_loss_scale": 65536.0, "scale_factor": 2.0, "scale_window": 1000},
}


@dataclass(frozen=True)
class BoostConfig:
    """A resolved boost setting: the level, every section with defaults filled in, what runs."""

    level: str = "O0"
    sections: dict = field(default_factory=lambda: copy.deepcopy(DEFAULTS))
    enabled: tuple[str, ...] = ()  # what the mode and flags ask for
    active: tuple[str, ...] = ()  # what runs after the interactions
    notes: tuple[str, ...] = ()  # why an enabled algorithm does not run

    def __bool__(self) -> bool:
        return bool(self.active)

    def section(self, name: str) -> dict:
        return self.sections[name]

    def to_dict(self) -> dict:
        """JSON-serialisable: the resolved dict plus what runs (dump metadata key ``boost``)."""
        return {**copy.deepcopy(self.sections), "level": self.level, "enabled": list(self.enabled),
                "active": list(self.active), "notes": list(self.notes)}


def resolve_boost(level: str = "O0", config: dict | str | Path | None = None) -> BoostConfig:
    """Check ``level`` and ``config`` (a dict or a JSON file's path); ConfigError names the valid values."""
    if level not in BOOST_LEVELS:
        raise ConfigError(f"unknown boost level {level!r}; valid: {', '.join(BOOST_LEVELS)}")
    given = load_boost_config(config)
    try:
        sections = _sections(given)
        mode = sections["boost"]["mode"]
        if mode not in BOOST_MODES:
            raise ConfigError(f"unknown boost mode {mode!r}; valid: {', '.join(BOOST_MODES)}")
    except ConfigError as exc:  # a file's content: the error names the file
        if isinstance(config, (str, Path)):
            raise InputError(config, str(exc)) from None
        raise
    enabled = _enabled(mode, level, sections["boost"])
    active, notes = active_algorithms(enabled)
    return BoostConfig(level, sections, enabled, active, notes)


def _sections(given: dict) -> dict:
    """The defaults with ``given``'s sections and keys, checked."""
    sections = copy.deepcopy(DEFAULTS)
    for name, values in given.items():
        if name not in DEFAULTS:
            raise ConfigError(f"unknown boost config section {name!r}; valid: {', '.join(DEFAULTS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"boost config section {name!r} must be a dict, got {type(values).__name__}")
        for key, value in values.items():
            if key not in DEFAULTS[name]:
                raise ConfigError(f"unknown key {key!r} in boost config section {name!r}; "
                                  f"valid: {', '.join(DEFAULTS[name])}")
            sections[name][key] = _checked(name, key, value)
    return sections


def load_boost_config(config) -> dict:
    """The config as a dict: itself, or a JSON file's contents; InputError for an unreadable file."""
    if config is None or config == "":
        return {}
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, Path)):
        return read_json(config, "boost config", expect_object="a boost config must be a JSON object")
    raise ConfigError(f"boost_config must be a dict or a JSON file path, got {type(config).__name__}")


def _enabled(mode: str, level: str, flags: dict) -> tuple[str, ...]:
    if mode == "auto":
        return LEVEL_ALGORITHMS[level]
    if mode == "enable_all":
        return ALGORITHMS
    if mode == "disable_all":
        return ()
    return tuple(name for name in ALGORITHMS if flags[name])


def active_algorithms(enabled: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(what runs, why the others do not) after the interactions in the module docstring."""
    if "dim_reduce" in enabled:
        off = [name for name in enabled if name != "dim_reduce"]
        return ("dim_reduce",), tuple(f"{name} off: dim_reduce turns every other algorithm off" for name in off)
    if "adasum" in enabled and "grad_freeze" in enabled:
        return (tuple(name for name in enabled if name != "adasum"),
                ("adasum off: grad_freeze replaces the train step (BoostTrainOneStepCell runs the freeze nets)",))
    if "adasum" in enabled and "grad_accumulation" in enabled:
        return (tuple(name for name in enabled if name != "adasum"),
                ("adasum off: grad_accumulation replaces the optimizer call adasum would make",))
    return tuple(enabled), ()


# -- value checks ---------------------------------------------------------------------------------

def _checked(section: str, key: str, value):
    where = f"boost config {section}.{key}"
    check = _CHECKS.get((section, key))
    return check(where, value) if check is not None else value


def _flag(where, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _whole(minimum: int):
    def check(where, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ConfigError(f"{where} must be a whole number >= {minimum}, got {value!r}")
        return int(value)
    return check


def _real(low: float, high: float, open_low: bool = True, open_high: bool = True):
    def check(where, value):
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > low if open_low else value >= low) and (value < high if open_high else value <= high)
        if not ok:
            lo, hi = "(" if open_low else "[", ")" if open_high else "]"
            raise ConfigError(f"{where} must be a number in {lo}{low:g}, {high:g}{hi}, got {value!r}")
        return float(value)
    return check


def _choice(valid):
    def check(where, value):
        if value not in valid or isinstance(value, bool):
            raise ConfigError(f"{where} must be one of {', '.join(map(str, valid))}, got {value!r}")
        return value
    return check


def _optional_path(where, value):
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where} must be a path or null, got {value!r}")
    return value


def _split_groups(where, value):
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                              for v in value):
        raise ConfigError(f"{where} must be a list of whole numbers, got {value!r}")
    return list(value)


def _mode(where, value):
    if not isinstance(value, str):
        raise ConfigError(f"unknown boost mode {value!r}; valid: {', '.join(BOOST_MODES)}")
    return value


_CHECKS = {
    ("boost", "mode"): _mode,
    **{("boost", name): _flag for name in ALGORITHMS},
    ("common", "gradient_split_groups"): _split_groups,
    ("common", "device_number"): _whole(1),
    ("less_bn", "fn_flag"): _flag,
    ("less_bn", "gc_flag"): _flag,
    ("grad_freeze", "param_groups"): _whole(1),
    ("grad_freeze", "freeze_type"): _choice((0, 1)),
    ("grad_freeze", "freeze_p"): _real(0.0, 1.0),
    ("grad_freeze", "total_steps"): _whole(1),
    ("grad_accumulation", "grad_accumulation_step"): _whole(1),
    ("dim_reduce", "rho"): _real(0.0, 1.0),
    ("dim_reduce", "gamma"): _real(0.0, 1.0, open_low=False, open_high=False),
    ("dim_reduce", "alpha"): _real(0.0, math.inf, open_low=False),
    ("dim_reduce", "sigma"): _real(0.0, 1.0),
    ("dim_reduce", "n_components"): _whole(1),
    ("dim_reduce", "pca_mat_path"): _optional_path,
    ("dim_reduce", "weight_load_dir"): _optional_path,
    ("dim_reduce", "timeout"): _whole(0),
    ("loss_scale_group", "init_loss_scale"): _real(0.0, 3.4e38),
    ("loss_scale_group", "scale_factor"): _real(1.0, math.inf),
    ("loss_scale_group", "scale_window"): _whole(1),
}
