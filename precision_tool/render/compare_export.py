"""A comparison as plain data: the JSON document and the CSV table.

JSON numbers are finite: NaN and +-inf become null, and the row's ``note``,
``problem`` or ``reasons`` say why (cosine is null, for example, when one side
is all zeros or only statistics were dumped). CSV keeps them as ``nan`` and
``inf``; an empty cell is a value that does not apply.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict

import numpy as np

from precision_tool.compare.report import CompareReport, OpComparison, TensorRow, row_flags

METRIC_FIELDS = ("cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "mean_rel_err", "rmse",
                 "rel_euclidean", "accumulated_rel_err", "kl_divergence")
STATS_FIELDS = ("abs_mean_diff", "abs_std_diff", "rel_norm_diff", "abs_max_diff", "abs_min_diff")
CSV_COLUMNS = ("status", "step", "exec_index", "op", "type", "direction", "tensor", "golden_op", "golden_tensor",
               "target_dtype", "golden_dtype", "shape", "golden_shape", *METRIC_FIELDS, "count",
               "target_nan", "target_inf", "target_saturated", "golden_nan", "golden_inf", "golden_saturated",
               "extra_nonfinite", *(f"stats_{name}" for name in STATS_FIELDS), "flagged", "reasons", "note",
               "problem", "pass_name", "skip", "loss_scale")


def json_text(document) -> str:
    """A command's JSON output: every command indents by 2 and writes no NaN (not JSON)."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def json_number(value):
    """JSON-safe: None for None, NaN and +-inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def row_dict(row: TensorRow, cosine_threshold: float) -> dict:
    """One compared tensor pair as a flat dict (JSON-safe numbers)."""
    metrics = row.metrics
    out = {
        "step": row.step, "exec_index": row.exec_index, "op": row.op, "type": row.type,
        "direction": row.direction, "tensor": row.tensor, "golden_op": row.golden_op,
        "golden_tensor": row.golden_tensor, "target_dtype": row.target_dtype, "golden_dtype": row.golden_dtype,
        "shape": list(row.shape), "golden_shape": list(row.golden_shape),
    }
    for name in METRIC_FIELDS:
        out[name] = json_number(getattr(metrics, name)) if metrics is not None else None
    out["count"] = metrics.count if metrics is not None else None
    for side, counts in (("target", row.target_counts), ("golden", row.golden_counts)):
        out[f"{side}_nan"], out[f"{side}_inf"], out[f"{side}_saturated"] = counts.nan, counts.inf, counts.saturated
    out["extra_nonfinite"] = row.extra_nonfinite
    out["stats"] = ({name: json_number(getattr(row.stats, name)) for name in STATS_FIELDS}
                    if row.stats is not None else None)
    reasons = row_flags(row, cosine_threshold)
    out["flagged"] = bool(reasons) and row.kind == "output"
    out["reasons"] = reasons
    out["note"] = metrics.note if metrics is not None else ("cosine unavailable: statistics only"
                                                             if row.stats is not None else "")
    out["problem"] = row.problem
    out["pass_name"] = row.pass_name
    out["skip"] = row.skip  # why the pair is shown but not judged, or ""
    out["loss_scale"] = row.loss_scale  # divided out of the target before scoring
    return out


def _op_ref(op: OpComparison | None, cosine_threshold: float) -> dict | None:
    if op is None:
        return None
    return {"step": op.step, "exec_index": op.exec_index, "op": op.name, "type": op.type,
            "direction": op.direction, "reasons": op.flag_reasons(cosine_threshold)}


def report_dict(report: CompareReport, ops: list[OpComparison], cosine_threshold: float,
                limit: int | None, listing: str) -> dict:
    """The JSON document: the listed ops' rows, the summary, the leftovers and the notes."""
    summary = report.summary(cosine_threshold)
    return {
        "golden": asdict(report.golden),
        "target": asdict(report.target),
        "cosine_threshold": cosine_threshold,
        "limit": limit,
        "listing": listing,
        "summary": {
            "compared_tensors": summary.compared_tensors,
            "compared_ops": summary.compared_ops,
            "flagged_ops": summary.flagged_ops,
            "unmatched_golden": summary.unmatched_golden,
            "unmatched_target": summary.unmatched_target,
            "covered_by_fusion": summary.covered_by_fusion,
            "shape_mismatches": summary.shape_mismatches,
            "cosine_available": not report.stats_only,
            "first_flagged": _op_ref(summary.first_flagged, cosine_threshold),
            "first_flagged_module": _op_ref(summary.first_flagged_module, cosine_threshold),
        },
        "notes": list(report.notes),
        "rows": [row_dict(row, cosine_threshold) for op in ops for row in op.rows],
        "unmatched_golden": [_unmatched_dict(u) for u in report.unmatched_golden],
        "unmatched_target": [_unmatched_dict(u) for u in report.unmatched_target],
        "covered_by_fusion": [asdict(c) for c in report.covered_by_fusion],
    }


def _unmatched_dict(item) -> dict:
    return {"step": item.step, "exec_index": item.exec_index, "op": item.name, "type": item.type,
            "direction": item.direction, "tensor": item.slot, "reason": item.reason}


def to_json(report: CompareReport, ops: list[OpComparison], cosine_threshold: float, limit: int | None,
            listing: str) -> str:
    return json_text(report_dict(report, ops, cosine_threshold, limit, listing))


def _csv_cell(value) -> str:
    if isinstance(value, np.generic):  # numpy 2 writes np.float64(0.99) as its repr: a plain number instead
        value = value.item()
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value) if value and not isinstance(value[0], str) else "; ".join(value)
    return str(value)


def to_csv(report: CompareReport, ops: list[OpComparison], cosine_threshold: float) -> str:
    """One line per listed tensor pair, then one per unmatched op or tensor (``status`` tells which)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for op in ops:
        for row in op.rows:
            data = row_dict(row, cosine_threshold)
            for name in METRIC_FIELDS:  # CSV keeps nan and inf
                data[name] = getattr(row.metrics, name) if row.metrics is not None else None
            for name in STATS_FIELDS:
                data[f"stats_{name}"] = getattr(row.stats, name) if row.stats is not None else None
            data["status"] = "compared"
            writer.writerow([_csv_cell(data.get(column)) for column in CSV_COLUMNS])
    for status, items in (("unmatched golden", report.unmatched_golden), ("unmatched target", report.unmatched_target)):
        for item in items:
            data = {"status": status, "step": item.step, "exec_index": item.exec_index, "op": item.name,
                    "type": item.type, "direction": item.direction, "tensor": item.slot, "note": item.reason}
            writer.writerow([_csv_cell(data.get(column)) for column in CSV_COLUMNS])
    return buffer.getvalue()
