"""Diagnosis over dumps: overflow, fusion suspects, introduced-vs-inherited error, the verdict.

No UI imports here: every function returns the dataclasses of `results`.
"""

from precision_tool.analysis.attribution import attribute, attribute_record, relative_error
from precision_tool.analysis.diagnose import diagnose
from precision_tool.analysis.fusion import fusion_report
from precision_tool.analysis.overflow import overflow_report
from precision_tool.analysis.results import (
    VERDICT_CLASSES,
    Attribution,
    Diagnosis,
    FusionReport,
    FusionSuspect,
    OverflowEntry,
    OverflowReport,
    Verdict,
)

__all__ = [
    "VERDICT_CLASSES", "Attribution", "Diagnosis", "FusionReport", "FusionSuspect", "OverflowEntry",
    "OverflowReport", "Verdict", "attribute", "attribute_record", "diagnose", "fusion_report",
    "overflow_report", "relative_error",
]
