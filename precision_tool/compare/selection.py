"""Choosing what to compare: step lists (``0,5-7``, parsed as `collect` parses them) and op-name globs."""

from __future__ import annotations

import fnmatch

from precision_tool.collect.selection import parse_steps
from precision_tool.dump.records import OpRecord

__all__ = ["op_matches", "parse_steps", "select_ops"]


def op_matches(record: OpRecord, pattern: str | None) -> bool:
    """True when the glob matches the op's name or one of the names it was fused from."""
    if not pattern:
        return True
    names = (record.name, *record.original_names)
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def select_ops(records: list[OpRecord], steps: frozenset[int] | None, pattern: str | None) -> list[OpRecord]:
    """The records in ``steps`` (all when None) whose names match ``pattern``."""
    return [r for r in records if (steps is None or r.step in steps) and op_matches(r, pattern)]
