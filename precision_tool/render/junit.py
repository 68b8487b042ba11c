"""A check result as JUnit XML: one testcase per compared op, failures named.

``classname`` is ``step<N>.<op type>``, ``name`` is ``<op name> (<direction>)``;
a failing op carries one ``<failure>`` whose message names the first failing
tensor and metric, with every failure of the op in its text. Unmatched ops
are ``<skipped>`` testcases, so CI dashboards show them rather than drop them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from precision_tool.compare.check import CheckResult

SUITE_NAME = "precision-tool check"


def _testcase(suite: ET.Element, step: int, op_type: str, name: str, direction: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=f"step{step}.{op_type}", name=f"{name} ({direction})",
                         time="0")


def to_junit_xml(result: CheckResult) -> str:
    """The JUnit XML document of ``result``."""
    failures_by_op: dict[tuple[int, int, str, str], list] = {}
    for failure in result.failures:
        failures_by_op.setdefault((failure.step, failure.exec_index, failure.op, failure.direction), []).append(failure)
    report = result.report
    skipped = report.unmatched_golden + report.unmatched_target
    suite = ET.Element("testsuite", name=SUITE_NAME, tests=str(len(report.ops) + len(skipped)),
                       failures=str(len(failures_by_op)), errors="0", skipped=str(len(skipped)), time="0")
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="golden", value=report.golden.path)
    ET.SubElement(properties, "property", name="target", value=report.target.path)
    for op in report.ops:
        case = _testcase(suite, op.step, op.type, op.name, op.direction)
        failures = failures_by_op.get((op.step, op.exec_index, op.name, op.direction))
        if failures:
            first = failures[0]
            element = ET.SubElement(case, "failure", type=first.metric,
                                    message=f"{first.tensor}: {first.message} ({first.target_dtype} vs "
                                            f"{first.golden_dtype})")
            element.text = "\n".join(f"{f.tensor}: {f.message} ({f.target_dtype} vs {f.golden_dtype})"
                                     for f in failures)
    for item in skipped:
        case = _testcase(suite, item.step, item.type, item.name, item.direction)
        what = f"{item.slot}: " if item.slot else ""
        ET.SubElement(case, "skipped", message=f"unmatched {item.side}: {what}{item.reason}")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
