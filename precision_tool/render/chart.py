"""A compact terminal chart of a comparison along execution order: where error enters and grows.

Two sparklines, one character per bucket of consecutive ops, the worst op of
each bucket shown: ``1 - cosine`` and ``max abs err`` (statistics only: the
relative norm difference and the lower bound of max abs err), both on a log
scale and both taller when worse. ``×`` marks an undefined cosine (one side all zeros),
``·`` an exact zero (a log scale has no place for it), a blank an op without
the value (statistics only, or no output judged: `TensorRow.skip`), ``┊`` the first op of each step after the first,
and ``^`` the first flagged op; a legend names the marks shown. It draws the
same `PlotData` as the SVG and PNG plots.
"""

from __future__ import annotations

import math

import numpy as np

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text


BARS = "▁▂▃▄▅▆▇█"
UNDEFINED = "×"
ZERO = "·"  # an exact zero: no bar, since a log scale has no place for it
STEP = "┊"
LABEL_WIDTH = 12
SCALE_WIDTH = 20  # "  1.2e-07..1.5e+00" beside a sparkline, with room for a three-digit exponent
FLOOR = 1e-12  # nonzero values at or below this draw the lowest bar


class Column:
    """One value per op as arrays (a streamed comparison's, `compare.digest.ChartColumns`): NaN where undefined,
    anything where ``missing`` (the lists' None)."""

    def __init__(self, values, missing):
        self.values, self.missing = values, missing

    def __len__(self) -> int:
        return len(self.values)

    def as_list(self) -> list[float | None]:
        return [None if gone else value for value, gone in zip(self.values.tolist(), self.missing.tolist())]


def _bucket_worst(values, width: int) -> list[float | None]:
    """``values`` (a list, or a `Column`) cut into ``width`` consecutive buckets; each keeps its largest value
    (NaN wins)."""
    n = len(values)
    if n <= width:
        return values.as_list() if isinstance(values, Column) else list(values)
    buckets = []
    for i in range(width):
        lo, hi = i * n // width, (i + 1) * n // width
        if isinstance(values, Column):
            part = values.values[lo:hi][~values.missing[lo:hi]]
            buckets.append(None if not len(part) else math.nan if np.isnan(part).any() else float(part.max()))
            continue
        part = [v for v in values[lo:hi] if v is not None]
        if not part:
            buckets.append(None)
        elif any(math.isnan(v) for v in part):
            buckets.append(math.nan)
        else:
            buckets.append(max(part))
    return buckets


def sparkline(values, width: int) -> tuple[str, float, float]:
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


def _caret(at: int, label: str, max_width: int) -> list[Text]:
    """``^`` under column ``at`` with ``label`` beside it: after it when that fits, else before it, else below."""
    caret = Text("^", style="bold red")
    if at + 2 + len(label) <= max_width:
        return [Text(" " * at) + caret + Text(" " + label)]
    if len(label) + 1 <= at:
        return [Text(" " * (at - len(label) - 1) + label + " ") + caret]
    return [Text(" " * at) + caret, Text(label)]


def _one_minus(cosine: float | None) -> float | None:
    if cosine is None or math.isnan(cosine):
        return cosine
    return max(0.0, 1.0 - cosine)


class ExecutionChart:
    """A rich renderable: the two sparklines of the report's `PlotData` (a streamed report's `ChartColumns`), as
    wide as the console allows."""

    def __init__(self, report, cosine_threshold: float):
        columns = getattr(report, "chart_columns", None)
        if columns is not None:
            self._columns(columns(cosine_threshold))
            return
        from precision_tool.render.plot import PlotData  # imports the dump layer (h5py): not at shell start-up

        self.data = data = PlotData.of(report, cosine_threshold)
        points = data.points
        self.n, self.step_starts, self.first = len(points), data.step_starts, data.first_flagged
        self.first_step = points[0].label.split()[1] if points else ""
        self.first_label = points[self.first].label if self.first is not None else ""
        if any(p.cosine is not None for p in points):
            self.lines = [("1-cosine", [_one_minus(p.cosine) for p in points]), ("max abs", [p.error for p in points])]
        else:  # statistics only: what they prove (lower bounds of rel_euclidean and max abs err)
            self.lines = [("Δnorm/norm", [p.norm_diff for p in points]), ("max abs >=", [p.abs_bound for p in points])]

    def _columns(self, c) -> None:
        self.n, self.step_starts, self.first = len(c.cosine), c.step_starts, c.first_flagged
        self.first_step = str(c.first_step)
        op = c.first_flagged_op
        self.first_label = f"step {op.step} #{op.exec_index} {op.name} ({op.direction})" if op is not None else ""
        if not c.cosine_missing.all():
            self.lines = [("1-cosine", Column(np.maximum(0.0, 1.0 - c.cosine), c.cosine_missing)),
                          ("max abs", Column(c.error, c.error_missing))]
        else:
            self.lines = [("Δnorm/norm", Column(c.norm_diff, c.norm_diff_missing)),
                          ("max abs >=", Column(c.abs_bound, c.abs_bound_missing))]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        n = self.n
        if not n:
            return
        width = max(8, min(n, options.max_width - LABEL_WIDTH - SCALE_WIDTH))  # the scale fits on the line
        yield Text(f"along execution order: {n} ops, log scale, taller is worse", style="dim")
        marks = set()
        for label, values in self.lines:
            line, lo, hi = sparkline(values, width)
            marks |= set(line) & {UNDEFINED, ZERO}
            scale = "" if math.isnan(lo) else f"  {lo:.1e}..{hi:.1e}"
            yield Text(f"{label:<{LABEL_WIDTH}}") + Text(line, style="yellow") + Text(scale, style="dim")

        def column(index: int) -> int:
            return index * width // n if n > width else index

        if self.step_starts:
            row = [" "] * min(n, width)  # as long as the sparklines
            for index, _ in self.step_starts:
                row[min(len(row) - 1, column(index))] = STEP
            last_step = self.step_starts[-1][1]
            yield Text(f"{'steps':<{LABEL_WIDTH}}") + Text("".join(row), style="dim") + Text(
                f"  {self.first_step}..{last_step}", style="dim")
        if self.first is not None:
            yield from _caret(LABEL_WIDTH + column(self.first), f"first flagged: {self.first_label}",
                              options.max_width)
        legend = [f"{UNDEFINED} undefined (one side all zeros)" if UNDEFINED in marks else "",
                  f"{ZERO} exact zero" if ZERO in marks else "",
                  f"{STEP} a step begins" if self.step_starts else ""]
        if any(legend):
            yield Text("  ".join(x for x in legend if x), style="dim")
