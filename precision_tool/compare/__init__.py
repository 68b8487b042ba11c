"""The comparator: match target ops to golden ops, score each tensor pair, judge them.

Entry points: `compare_dumps` (paths or opened dumps -> `CompareReport`),
`select_flagged` (the `vcs -c -l` rule), `check_report` (the CI gate) and
`baseline_from_report` / `load_baseline`. No module here imports click or rich.
"""

from __future__ import annotations

_EXPORTS = {
    "compare_dumps": "precision_tool.compare.comparator",
    "compare_sources": "precision_tool.compare.comparator",
    "CompareOptions": "precision_tool.compare.comparator",
    "CompareReport": "precision_tool.compare.report",
    "select_flagged": "precision_tool.compare.report",
    "check_report": "precision_tool.compare.check",
    "CheckCriteria": "precision_tool.compare.check",
    "CheckResult": "precision_tool.compare.check",
    "baseline_from_report": "precision_tool.compare.baseline",
    "load_baseline": "precision_tool.compare.baseline",
    "save_baseline": "precision_tool.compare.baseline",
    "compare_arrays": "precision_tool.compare.metrics",
    "parse_steps": "precision_tool.compare.selection",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
