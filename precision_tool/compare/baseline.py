"""Baselines: the per-tensor metrics of one comparison, saved to judge later ones against.

A later comparison fails a tensor when, relative to its baseline entry:

* its cosine drops by more than max(BASELINE_COSINE_DROP_ABS,
  BASELINE_COSINE_DROP_REL × (1 − baseline cosine)): a tensor at 0.999 may
  fall to 0.9989, one at exactly 1.0 only by 1e-6;
* its max_abs_err (for statistics-only tensors: the relative norm difference)
  grows beyond baseline × (1 + BASELINE_ERROR_GROWTH_REL) + BASELINE_ERROR_GROWTH_ABS;
* it gains NaN/inf values the golden tensor lacks, or a problem (shape mismatch)
  the baseline did not have.

Values are stored exactly (JSON numbers round-trip float64), so a baseline
always passes on the dumps it was made from. NaN and inf are stored as the
strings "nan", "inf" and "-inf".
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from precision_tool import __version__
from precision_tool.compare.report import CompareReport, TensorRow
from precision_tool.defaults import (BASELINE_COSINE_DROP_ABS, BASELINE_COSINE_DROP_REL, BASELINE_ERROR_GROWTH_ABS,
                                     BASELINE_ERROR_GROWTH_REL)
from precision_tool.errors import InputError
from precision_tool.outputs import problem

BASELINE_FORMAT = "precision-tool-baseline"
BASELINE_VERSION = 1
_FINGERPRINT_BYTES = 1 << 20

Key = tuple[int, str, str, str, int]  # step, op, direction, tensor, occurrence (a module or op run twice a step)


@dataclass(frozen=True)
class BaselineEntry:
    """The saved metrics of one tensor pair."""

    step: int
    op: str
    direction: str
    tensor: str
    type: str = ""
    cosine: float | None = None
    max_abs_err: float | None = None
    rel_norm_diff: float | None = None
    extra_nonfinite: int = 0
    problem: str = ""
    occurrence: int = 0  # which run of ``op`` in the step, counted from 0 (absent from baselines before it: 0)

    @property
    def key(self) -> Key:
        return self.step, self.op, self.direction, self.tensor, self.occurrence


@dataclass
class Baseline:
    """Per-tensor metrics plus where they came from."""

    entries: dict[Key, BaselineEntry]
    tool_version: str = __version__
    created: str = ""
    golden: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)


class RowKeys:
    """The baseline key of each row of a comparison, the rows given in execution order: a name a step runs
    twice (a module called twice, an activation module reused) has an entry per run."""

    def __init__(self) -> None:
        self._runs: dict[tuple, int] = {}

    def __call__(self, row: TensorRow) -> Key:
        base = (row.step, row.op, row.direction, row.tensor)
        occurrence = self._runs.get(base, -1) + 1
        self._runs[base] = occurrence
        return (*base, occurrence)


def entry_from_row(row: TensorRow, occurrence: int = 0) -> BaselineEntry:
    return BaselineEntry(
        step=row.step, op=row.op, direction=row.direction, tensor=row.tensor, type=row.type,
        cosine=row.cosine, max_abs_err=row.max_abs_err,
        rel_norm_diff=None if row.stats is None else row.stats.rel_norm_diff,
        extra_nonfinite=row.extra_nonfinite, problem=row.problem, occurrence=occurrence,
    )


def dump_fingerprint(path) -> dict:
    """Path, size and a SHA-256 of the first and last MiB: cheap, and enough to tell dumps apart."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        digest.update(stream.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            stream.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            digest.update(stream.read(_FINGERPRINT_BYTES))
    return {"path": os.path.abspath(path), "size": size, "sha256_head_tail": digest.hexdigest()}


def baseline_from_report(report: CompareReport) -> Baseline:
    """A baseline holding every compared tensor of ``report``."""
    keys = RowKeys()
    entries = {}
    for row in report.rows:
        key = keys(row)
        entries[key] = entry_from_row(row, key[-1])
    sides = []
    for info in (report.golden, report.target):
        try:
            sides.append(dump_fingerprint(info.path))
        except OSError:
            sides.append({"path": info.path})
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return Baseline(entries, __version__, created, sides[0], sides[1])


def _encode(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _decode(value):
    if isinstance(value, str):
        return float(value)
    return None if value is None else float(value)


def save_baseline(baseline: Baseline, path) -> None:
    """Write ``baseline`` as JSON to ``path``."""
    document = {
        "format": BASELINE_FORMAT, "version": BASELINE_VERSION, "tool_version": baseline.tool_version,
        "created": baseline.created, "golden": baseline.golden, "target": baseline.target,
        "tolerances": {"cosine_drop_abs": BASELINE_COSINE_DROP_ABS, "cosine_drop_rel": BASELINE_COSINE_DROP_REL,
                       "error_growth_rel": BASELINE_ERROR_GROWTH_REL, "error_growth_abs": BASELINE_ERROR_GROWTH_ABS},
        "tensors": [{k: _encode(v) for k, v in asdict(entry).items()} for entry in baseline.entries.values()],
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


def _why_unread(exc: BaseException) -> str:
    """Why a baseline file could not be read, in words."""
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg.lower()} at line {exc.lineno}, column {exc.colno})"
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    if isinstance(exc, OSError):
        return f"cannot be read: {problem(exc)}"
    return f"not JSON ({str(exc).split(';')[0]})"  # (a number of 5,000 digits)


def load_baseline(path) -> Baseline:
    """Read a baseline file; InputError when it is missing or not a precision-tool baseline."""
    try:
        if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read
            raise InputError(path, "not a regular file")
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(path, "no such baseline file") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, text or a 5000-digit number
        raise InputError(path, f"not a baseline file: {_why_unread(exc)}") from None
    if not isinstance(document, dict) or document.get("format") != BASELINE_FORMAT:
        raise InputError(path, "not a precision-tool baseline (run `precision-tool baseline` to make one)")
    if document.get("version") != BASELINE_VERSION:
        raise InputError(path, f"baseline version {document.get('version')!r} is not supported")
    try:
        entries = {}
        for item in document["tensors"]:
            entry = BaselineEntry(
                step=int(item["step"]), op=str(item["op"]), direction=str(item["direction"]),
                tensor=str(item["tensor"]), type=str(item.get("type", "")), cosine=_decode(item.get("cosine")),
                max_abs_err=_decode(item.get("max_abs_err")), rel_norm_diff=_decode(item.get("rel_norm_diff")),
                extra_nonfinite=int(item.get("extra_nonfinite", 0)), problem=str(item.get("problem", "")),
                occurrence=int(item.get("occurrence", 0)),
            )
            entries[entry.key] = entry
        return Baseline(entries, str(document.get("tool_version", "")), str(document.get("created", "")),
                        dict(document.get("golden") or {}), dict(document.get("target") or {}))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(path, f"malformed baseline entry ({exc})") from None


def cosine_drop_tolerance(baseline_cosine: float) -> float:
    """How far a cosine may fall below its baseline value before the tensor fails."""
    return max(BASELINE_COSINE_DROP_ABS, BASELINE_COSINE_DROP_REL * (1.0 - baseline_cosine))


def error_growth_limit(baseline_error: float) -> float:
    """The largest error still accepted for a tensor whose baseline error was ``baseline_error``."""
    return baseline_error * (1.0 + BASELINE_ERROR_GROWTH_REL) + BASELINE_ERROR_GROWTH_ABS


def baseline_violations(row: TensorRow, entry: BaselineEntry) -> list[tuple[str, float | None, float | None, str]]:
    """(metric, value, limit, message) for every way ``row`` is worse than its baseline entry."""
    found = []
    cosine = row.cosine
    if entry.cosine is not None and cosine is not None and not math.isnan(entry.cosine):
        limit = entry.cosine - cosine_drop_tolerance(entry.cosine)
        if math.isnan(cosine) or cosine < limit:
            found.append(("cosine", cosine, limit, f"cosine {cosine:.6f} dropped below baseline "
                                                   f"{entry.cosine:.6f} (limit {limit:.6f})"))
    for metric, now, then in (("max_abs_err", row.max_abs_err, entry.max_abs_err),
                              ("rel_norm_diff", None if row.stats is None else row.stats.rel_norm_diff,
                               entry.rel_norm_diff)):
        if now is None or then is None or math.isnan(then):
            continue
        limit = error_growth_limit(then)
        if math.isnan(now) or now > limit:
            found.append((metric, now, limit, f"{metric} {now:.4g} grew beyond baseline {then:.4g} "
                                              f"(limit {limit:.4g})"))
    if row.extra_nonfinite > entry.extra_nonfinite:
        found.append(("nonfinite", float(row.extra_nonfinite), float(entry.extra_nonfinite),
                      f"{row.extra_nonfinite} NaN/inf the golden tensor lacks (baseline {entry.extra_nonfinite})"))
    if row.problem and row.problem != entry.problem:
        found.append(("problem", None, None, f"{row.problem} (not in the baseline)"))
    return found
