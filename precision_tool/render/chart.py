"""A compact terminal chart of a comparison along execution order: where error enters and grows.

Two sparklines, one character per bucket of consecutive ops, the worst op of
each bucket shown: ``1 - cosine`` and ``max abs err`` (statistics only: the
relative norm difference and the lower bound of max abs err), both on a log
scale and both taller when worse. ``×`` marks an undefined cosine (one side all zeros),
``·`` an exact zero (a log scale has no place for it), a blank an op without
the value (statistics only), ``┊`` the first op of each step after the first,
and ``^`` the first flagged op; a legend names the marks shown. It draws the
same `PlotData` as the SVG and PNG plots.
"""

from __future__ import annotations

import math

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from precision_tool.compare.report import CompareReport

BARS = "▁▂▃▄▅▆▇█"
UNDEFINED = "×"
ZERO = "·"  # an exact zero: no bar, since a log scale has no place for it
STEP = "┊"
LABEL_WIDTH = 12
FLOOR = 1e-12  # nonzero values at or below this draw the lowest bar


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
    drawn = [max(v, FLOOR) for v in buckets if v is not None and not math.isnan(v) and v != 0]
    if not drawn:
        return "".join(" " if v is None else ZERO if v == 0 else UNDEFINED for v in buckets), math.nan, math.nan
    lo, hi = math.log10(min(drawn)), math.log10(max(drawn))
    chars = []
    for value in buckets:
        if value is None:
            chars.append(" ")
        elif math.isnan(value):
            chars.append(UNDEFINED)
        elif value == 0:
            chars.append(ZERO)
        else:
            level = 0 if hi == lo else (math.log10(max(value, FLOOR)) - lo) / (hi - lo)
            chars.append(BARS[min(len(BARS) - 1, int(level * len(BARS)))])
    return "".join(chars), min(drawn), max(drawn)


def _one_minus(cosine: float | None) -> float | None:
    if cosine is None or math.isnan(cosine):
        return cosine
    return max(0.0, 1.0 - cosine)


class ExecutionChart:
    """A rich renderable: the two sparklines of the report's `PlotData`, as wide as the console allows."""

    def __init__(self, report: CompareReport, cosine_threshold: float):
        from precision_tool.render.plot import PlotData  # imports the dump layer (h5py): not at shell start-up

        self.data = PlotData.of(report, cosine_threshold)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        points = self.data.points
        if not points:
            return
        n = len(points)
        width = max(8, min(n, options.max_width - LABEL_WIDTH - 2))
        if any(p.cosine is not None for p in points):
            lines = [("1-cosine", [_one_minus(p.cosine) for p in points]), ("max abs", [p.error for p in points])]
        else:  # statistics only: what they prove (lower bounds of rel_euclidean and max abs err)
            lines = [("Δnorm/norm", [p.norm_diff for p in points]), ("max abs >=", [p.abs_bound for p in points])]
        yield Text(f"along execution order: {n} ops, log scale, taller is worse", style="dim")
        marks = set()
        for label, values in lines:
            line, lo, hi = sparkline(values, width)
            marks |= set(line) & {UNDEFINED, ZERO}
            scale = "" if math.isnan(lo) else f"  {lo:.1e}..{hi:.1e}"
            yield Text(f"{label:<{LABEL_WIDTH}}") + Text(line, style="yellow") + Text(scale, style="dim")

        def column(index: int) -> int:
            return index * width // n if n > width else index

        if self.data.step_starts:
            row = [" "] * min(n, width)  # as long as the sparklines
            for index, _ in self.data.step_starts:
                row[min(len(row) - 1, column(index))] = STEP
            first_step = points[0].label.split()[1]
            last_step = self.data.step_starts[-1][1]
            yield Text(f"{'steps':<{LABEL_WIDTH}}") + Text("".join(row), style="dim") + Text(
                f"  {first_step}..{last_step}", style="dim")
        if self.data.first_flagged is not None:
            first = self.data.first_flagged
            yield Text(" " * (LABEL_WIDTH + column(first)) + "^ ", style="bold red") + Text(
                f"first flagged: {points[first].label}")
        legend = [f"{UNDEFINED} undefined (one side all zeros)" if UNDEFINED in marks else "",
                  f"{ZERO} exact zero" if ZERO in marks else "",
                  f"{STEP} a step begins" if self.data.step_starts else ""]
        if any(legend):
            yield Text("  ".join(x for x in legend if x), style="dim")
