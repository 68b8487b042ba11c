"""A compact terminal chart of a comparison along execution order: where error enters and grows.

Two sparklines, one character per bucket of consecutive ops, the worst op of
each bucket shown: ``1 - cosine`` and ``max abs err`` (statistics only: the
relative norm difference and the lower bound of max abs err), both on a log
scale and both taller when worse. ``×`` marks an undefined cosine (one side all zeros),
a blank an op without the value (statistics only), and ``^`` the first
flagged op.
"""

from __future__ import annotations

import math

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from precision_tool.compare.report import CompareReport

BARS = "▁▂▃▄▅▆▇█"
UNDEFINED = "×"
LABEL_WIDTH = 12
FLOOR = 1e-12  # values at or below this draw the lowest bar


def _bucket_worst(values: list[float | None], width: int) -> list[float | None]:
    """``values`` cut into ``width`` consecutive buckets; each keeps its largest value (NaN wins)."""
    n = len(values)
    if n <= width:
        return list(values)
    buckets = []
    for i in range(width):
        part = [v for v in values[i * n // width:(i + 1) * n // width] if v is not None]
        if not part:
            buckets.append(None)
        elif any(math.isnan(v) for v in part):
            buckets.append(math.nan)
        else:
            buckets.append(max(part))
    return buckets


def sparkline(values: list[float | None], width: int) -> tuple[str, float, float]:
    """A log-scale sparkline of non-negative ``values``; also the smallest and largest value drawn."""
    buckets = _bucket_worst(values, max(1, width))
    drawn = [max(v, FLOOR) for v in buckets if v is not None and not math.isnan(v)]
    if not drawn:
        return "".join(" " if v is None else UNDEFINED for v in buckets), math.nan, math.nan
    lo, hi = math.log10(min(drawn)), math.log10(max(drawn))
    chars = []
    for value in buckets:
        if value is None:
            chars.append(" ")
        elif math.isnan(value):
            chars.append(UNDEFINED)
        else:
            level = 0 if hi == lo else (math.log10(max(value, FLOOR)) - lo) / (hi - lo)
            chars.append(BARS[min(len(BARS) - 1, int(level * len(BARS)))])
    return "".join(chars), min(drawn), max(drawn)


def _one_minus(cosine: float | None) -> float | None:
    if cosine is None or math.isnan(cosine):
        return cosine
    return max(0.0, 1.0 - cosine)


def _worst_stat(op, name: str) -> float | None:
    values = [getattr(r.stats, name) for r in op.outputs if r.stats is not None]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else None


class ExecutionChart:
    """A rich renderable: the two sparklines, as wide as the console allows."""

    def __init__(self, report: CompareReport, cosine_threshold: float):
        self.report = report
        self.cosine_threshold = cosine_threshold

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        ops = self.report.ops
        if not ops:
            return
        width = max(8, min(len(ops), options.max_width - LABEL_WIDTH - 2))
        if any(op.worst_output_cosine is not None for op in ops):
            lines = [("1-cosine", [_one_minus(op.worst_output_cosine) for op in ops]),
                     ("max abs", [op.max_output_abs_err for op in ops])]
        else:  # statistics only: what they prove (lower bounds of rel_euclidean and max abs err)
            lines = [("Δnorm/norm", [_worst_stat(op, "rel_norm_diff") for op in ops]),
                     ("max abs >=", [_worst_stat(op, "max_abs_err_bound") for op in ops])]
        yield Text(f"along execution order: {len(ops)} ops, log scale, taller is worse", style="dim")
        for label, values in lines:
            line, lo, hi = sparkline(values, width)
            scale = "" if math.isnan(lo) else f"  {lo:.1e}..{hi:.1e}"
            yield Text(f"{label:<{LABEL_WIDTH}}") + Text(line, style="yellow") + Text(scale, style="dim")
        first = next((i for i, op in enumerate(ops) if op.flagged(self.cosine_threshold)), None)
        if first is not None:
            column = first * width // len(ops) if len(ops) > width else first
            op = ops[first]
            yield Text(" " * (LABEL_WIDTH + column) + "^ ", style="bold red") + Text(
                f"first flagged: step {op.step} #{op.exec_index} {op.name} ({op.direction})")
