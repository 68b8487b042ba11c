"""A dump's root and step attributes as plain values, and the checks of the root attributes readers rely on.

Split from `precision_tool.dump.reader`; each check raises InputError naming the file and the attribute.
"""

from __future__ import annotations

import json

import numpy as np

from precision_tool.dump import layout
from precision_tool.dump.records import SCHEMA_VERSION
from precision_tool.errors import InputError


def flag(path: str, metadata: dict, key: str) -> bool:
    """A boolean root attribute (absent: False)."""
    value = metadata.get(key, False)
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise InputError(path, f"/ attribute {key}: {value!r} is not true or false")
    return bool(value)


def count(path: str, metadata: dict, key: str) -> int:
    """A whole-number root attribute >= 0 (absent: 0)."""
    value = metadata.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(path, f"/ attribute {key}: {value!r} is not a whole number >= 0")
    return value


def check_seed(path: str, metadata: dict) -> None:
    """The ``seed`` root attribute, when present: a whole number (a replay seeds its random ops with it)."""
    seed = metadata.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise InputError(path, f"/ attribute seed: {seed!r} is not a whole number")


def check_modes(path: str, metadata: dict) -> None:
    """The ``modes`` root attribute, when present: a JSON list of mode names."""
    modes = metadata.get("modes")
    if modes is not None and not (isinstance(modes, list) and all(isinstance(m, str) for m in modes)):
        raise InputError(path, f"/ attribute modes: {modes!r} is not a list of mode names")


def check_evaluations(path: str, metadata: dict) -> None:
    """The ``evaluations`` root attribute, when present: a JSON list of objects (one a held-out evaluation)."""
    evaluations = metadata.get("evaluations")
    if evaluations is not None and not (isinstance(evaluations, list) and all(isinstance(e, dict)
                                                                               for e in evaluations)):
        raise InputError(path, f"/ attribute evaluations: {_short(evaluations)} is not a list of evaluations "
                               "(JSON objects)")


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def check_schema(path: str, metadata: dict) -> int:
    """The schema version, once it is one this reader reads."""
    version = metadata.get("schema_version")
    if version is None:
        raise InputError(path, "not a precision-tool dump (no schema_version attribute)")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise InputError(path, f"unknown dump schema version {version!r}; "
                               f"this precision-tool reads versions 1 to {SCHEMA_VERSION}")
    return version


def decode_attrs(attrs) -> dict:
    """Attributes as plain Python values; those named in ``json_keys`` JSON-decoded."""
    raw = {key: attrs[key] for key in attrs.keys()}
    json_keys = set()
    if layout.JSON_KEYS_ATTR in raw:
        json_keys = set(json.loads(plain_value(raw.pop(layout.JSON_KEYS_ATTR))))
    result = {}
    for key, value in raw.items():
        value = plain_value(value)
        if key in json_keys and isinstance(value, str):
            value = json.loads(value)
        result[key] = value
    return result


def plain_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):  # (an array of strings: its bytes decoded, as a lone value's)
        return _decoded(value.tolist()) if value.dtype.names is None else value
    if isinstance(value, np.generic) and value.dtype.names is None:
        return value.item()
    return value



def _decoded(value):
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
