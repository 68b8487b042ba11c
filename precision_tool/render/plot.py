"""``compare --plot FILE``: cosine and max abs error along execution order, as SVG or PNG (and the terminal's
sparklines, `precision_tool.render.chart`, from the same `PlotData`).

Both formats draw the same `PlotData`: each compared op is one x position
(its index in execution order, integer ticks), its worst output cosine in the
top panel (the threshold dashed), its largest output max abs error in the
bottom one on a log scale. Nothing is drawn at a value it does not have: an
undefined (NaN) cosine is a red cross on the panel's floor, an exact-zero
error a green triangle on its floor, both in the legend; the log axis spans
the nonzero errors only. Dotted lines separate the steps, a red line marks
the first flagged op, and module records (``module.<Class>``) get diamonds
of their own. In the SVG every point carries its op's name as a ``<title>``
(a hover tip); the worst ops are named beside their points in both.

SVG is written by hand (no dependency). PNG needs matplotlib, the ``plot``
extra; without it a ConfigError says to install ``precision-tool[plot]`` or
use a ``.svg`` name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from precision_tool.compare.report import CompareReport, worst_output_stat
from precision_tool.dump.records import MODULE_TYPE_PREFIX
from precision_tool.errors import ConfigError
from precision_tool.outputs import replacing, write_text

WIDTH, HEIGHT = 960, 520
LEFT, RIGHT, TOP, GAP, BOTTOM = 80, 20, 40, 50, 80
PANEL = (HEIGHT - TOP - GAP - BOTTOM) / 2
NAMED_WORST = 3  # the ops with the lowest cosines are named beside their points
MAX_LOG_LABELS = 6  # the log axis labels every k-th decade so that at most this many labels show
MIN_TICK_GAP = 14  # pixels: a tick label closer than this to another one is left out
HOVER_POINTS = 5000  # above this many ops only flagged and module points carry a hover title
NAN_COLOUR, ZERO_COLOUR, COS_COLOUR, ERR_COLOUR, MODULE_COLOUR = "#d62728", "#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd"


@dataclass(frozen=True)
class PlotPoint:
    index: int
    label: str  # step, execution index, name, direction
    cosine: float | None  # None: not available (statistics only); NaN: undefined
    error: float | None  # None: not available; 0.0: exact
    module: bool
    flagged: bool
    norm_diff: float | None = None  # statistics only: the relative norm difference (a lower bound of rel_euclidean)
    abs_bound: float | None = None  # statistics only: the lower bound of max abs err


@dataclass(frozen=True)
class PlotData:
    """What both formats draw: the points, where steps begin, the first flagged and the worst ops."""

    points: list[PlotPoint]
    step_starts: list[tuple[int, int]]  # (index, step) of each step's first op, the first step left out
    first_flagged: int | None
    worst: list[int]
    threshold: float
    title: str

    @classmethod
    def of(cls, report: CompareReport, threshold: float) -> "PlotData":
        points, step_starts = [], []
        for i, op in enumerate(report.ops):
            if i and op.step != report.ops[i - 1].step:
                step_starts.append((i, op.step))
            points.append(PlotPoint(i, f"step {op.step} #{op.exec_index} {op.name} ({op.direction})",
                                    op.worst_output_cosine, op.max_output_abs_err,
                                    op.type.startswith(MODULE_TYPE_PREFIX), op.flagged(threshold),
                                    _worst_stat(op, "rel_norm_diff"), _worst_stat(op, "max_abs_err_bound")))
        first = next((p.index for p in points if p.flagged), None)
        ranked = sorted((p for p in points if _finite(p.cosine) and p.cosine < 1.0), key=lambda p: p.cosine)
        title = f"{report.target.path} vs {report.golden.path}"
        return cls(points, step_starts, first, [p.index for p in ranked[:NAMED_WORST]], threshold, title)

    @property
    def cosine_floor(self) -> float:
        values = [p.cosine for p in self.points if _finite(p.cosine)]
        return min(min(values + [self.threshold]), 1.0 - 1e-6)

    @property
    def decades(self) -> tuple[int, int]:
        """The log axis: whole decades around the nonzero errors (zeros are markers, not values)."""
        values = [p.error for p in self.points if _finite(p.error) and p.error > 0]
        if not values:
            return -1, 0
        lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        return lo, hi if hi > lo else lo + 1


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _worst_stat(op, name: str) -> float | None:
    return worst_output_stat(op, name)


def write_plot(report: CompareReport, path, cosine_threshold: float, inputs=()) -> Path:
    """Write the chart to ``path`` (never over one of ``inputs``); the suffix (.svg or .png) picks the format."""
    suffix = Path(path).suffix.lower()  # the name as given goes on: Path() would drop a trailing "/"
    if suffix == ".svg":
        write_text(path, to_svg(report, cosine_threshold), inputs)
    elif suffix == ".png":
        _write_png(PlotData.of(report, cosine_threshold), path, inputs)
    else:
        raise ConfigError(f"--plot {path}: use a .svg or .png file name")
    return Path(path)


def integer_ticks(n: int, most: int = 8) -> list[int]:
    """Op indices to label on an axis of ``n`` ops: round steps (1, 2, 5 x 10^k), at most ``most`` + 1."""
    if n <= 1:
        return [0]
    raw = (n - 1) / most
    step = min(b * 10 ** p for b in (1, 2, 5) for p in range(15) if b * 10 ** p >= raw)
    return list(range(0, n, step))


# ---- SVG ------------------------------------------------------------------------------------------

class _Svg:
    def __init__(self, data: PlotData):
        self.data, self.n = data, len(data.points)
        self.top1, self.top2 = TOP, TOP + PANEL + GAP
        self.cos_lo = data.cosine_floor
        self.e_lo, self.e_hi = data.decades
        self.parts: list[str] = []

    def x(self, i: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * (i / (self.n - 1) if self.n > 1 else 0.5)

    def y_cos(self, c: float) -> float:
        return self.top1 + PANEL * (1.0 - (c - self.cos_lo) / (1.0 - self.cos_lo))

    def y_err(self, e: float) -> float:
        return self.top2 + PANEL * (1.0 - (math.log10(e) - self.e_lo) / (self.e_hi - self.e_lo))

    def render(self) -> str:
        data = self.data
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
                      f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">',
                      '<rect width="100%" height="100%" fill="white"/>', f'<title>{escape(data.title)}</title>']
        cos_ticks = [(self.y_cos(v), f"{v:.4g}") for v in (1.0, data.threshold, self.cos_lo)]
        span = self.e_hi - self.e_lo
        every = max(1, math.ceil((span + 1) / MAX_LOG_LABELS))
        err_ticks = [(self.y_err(10.0 ** k), f"1e{k}") for k in range(self.e_lo, self.e_hi + 1)
                     if (k - self.e_lo) % every == 0]
        self._panel(self.top1, "worst output cosine", cos_ticks)
        self._panel(self.top2, "max abs error (log)", err_ticks)
        self._x_axis()
        self._steps()
        if self.cos_lo < data.threshold < 1.0:
            y = self.y_cos(data.threshold)
            self.parts.append(f'<line class="threshold" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                              f'stroke="{NAN_COLOUR}" stroke-dasharray="5,4"/>')
        self._series()
        self._first_flagged()
        self._legend()
        self.parts.append("</svg>")
        return "\n".join(self.parts) + "\n"

    def _panel(self, top: float, label: str, ticks: list[tuple[float, str]]) -> None:
        self.parts += [f'<rect x="{LEFT}" y="{top:.1f}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL:.1f}" '
                       f'fill="none" stroke="#888"/>',
                       f'<text x="{LEFT}" y="{top - 6:.1f}" font-size="13" font-weight="bold">{escape(label)}</text>']
        shown: list[float] = []
        for y, text in ticks:
            self.parts.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#888"/>')
            if all(abs(y - other) >= MIN_TICK_GAP for other in shown):
                shown.append(y)
                self.parts.append(f'<text class="ytick" x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" '
                                  f'text-anchor="end">{escape(text)}</text>')

    def _x_axis(self) -> None:
        bottom = self.top2 + PANEL
        for i in integer_ticks(self.n):
            x = self.x(i)
            self.parts.append(f'<line x1="{x:.1f}" y1="{bottom:.1f}" x2="{x:.1f}" y2="{bottom + 4:.1f}" stroke="#888"/>')
            self.parts.append(f'<text class="xtick" x="{x:.1f}" y="{bottom + 16:.1f}" font-size="11" '
                              f'text-anchor="middle">{i}</text>')
        self.parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{bottom + 32:.1f}" font-size="12" '
                          f'text-anchor="middle">ops in execution order ({self.n})</text>')

    def _steps(self) -> None:
        for index, step in self.data.step_starts:
            x = (self.x(index - 1) + self.x(index)) / 2
            self.parts.append(f'<line class="step" x1="{x:.1f}" y1="{self.top1}" x2="{x:.1f}" '
                              f'y2="{self.top2 + PANEL:.1f}" stroke="#bbb" stroke-dasharray="2,3"/>')
            self.parts.append(f'<text x="{x + 3:.1f}" y="{self.top1 + PANEL + 12:.1f}" font-size="10" '
                              f'fill="#888">step {step}</text>')

    def _series(self) -> None:
        data, points = self.data, self.data.points
        cos = [(self.x(p.index), self.y_cos(p.cosine)) if _finite(p.cosine) else None for p in points]
        err = [(self.x(p.index), self.y_err(p.error)) if _finite(p.error) and p.error > 0 else None for p in points]
        self.parts += _polylines(cos, COS_COLOUR, "cosine") + _polylines(err, ERR_COLOUR, "error")
        hover = self.n <= HOVER_POINTS
        floor1, floor2 = self.top1 + PANEL, self.top2 + PANEL
        for p in points:
            x, tip = self.x(p.index), escape(p.label)
            if p.cosine is not None and math.isnan(p.cosine):
                self.parts.append(_cross(x, floor1 - 5, f"{tip}: cosine undefined (NaN)"))
            elif _finite(p.cosine) and (hover or p.flagged or p.module):
                shape = _diamond if p.module else _dot
                self.parts.append(shape(x, self.y_cos(p.cosine), MODULE_COLOUR if p.module else COS_COLOUR,
                                        f"{tip}: cosine {p.cosine:.6g}", "module" if p.module else "point"))
            if p.error == 0.0:
                self.parts.append(_triangle(x, floor2 - 5, f"{tip}: max abs error exactly 0"))
            elif _finite(p.error) and (hover or p.flagged):
                self.parts.append(_dot(x, self.y_err(p.error), ERR_COLOUR, f"{tip}: max abs error {p.error:.4g}",
                                       "point"))
        for rank, index in enumerate(data.worst):
            p = points[index]
            x, y = self.x(index), self.y_cos(p.cosine)
            self.parts.append(f'<text class="worst" x="{min(x + 5, WIDTH - 240):.1f}" y="{y + 4 + 12 * rank:.1f}" '
                              f'font-size="10" fill="#333">{escape(p.label)}</text>')

    def _first_flagged(self) -> None:
        first = self.data.first_flagged
        if first is None:
            return
        x, p = self.x(first), self.data.points[first]
        self.parts.append(f'<line class="first" x1="{x:.1f}" y1="{self.top1}" x2="{x:.1f}" '
                          f'y2="{self.top2 + PANEL:.1f}" stroke="{NAN_COLOUR}"/>')
        self.parts.append(f'<text x="{min(x + 4, WIDTH - 320):.1f}" y="{self.top1 + 14}" font-size="11" '
                          f'fill="{NAN_COLOUR}">first flagged: {escape(p.label)}</text>')

    def _legend(self) -> None:
        entries = [("line", COS_COLOUR, "worst output cosine"), ("dash", NAN_COLOUR, "cosine threshold"),
                   ("line", ERR_COLOUR, "max abs error"), ("cross", NAN_COLOUR, "cosine undefined (NaN)"),
                   ("triangle", ZERO_COLOUR, "error exactly 0"), ("line", NAN_COLOUR, "first flagged op"),
                   ("dots", "#bbb", "step boundary")]
        if any(p.module for p in self.data.points):
            entries.append(("diamond", MODULE_COLOUR, "module output"))
        y = HEIGHT - 18
        x = LEFT
        self.parts.append('<g class="legend">')
        for kind, colour, text in entries:
            if kind == "cross":
                self.parts.append(_cross(x + 8, y, None))
            elif kind == "triangle":
                self.parts.append(_triangle(x + 8, y, None))
            elif kind == "diamond":
                self.parts.append(_diamond(x + 8, y - 1, colour, None, "legend"))
            else:
                dash = {"dash": ' stroke-dasharray="5,4"', "dots": ' stroke-dasharray="2,3"'}.get(kind, "")
                self.parts.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" stroke="{colour}" '
                                  f'stroke-width="1.5"{dash}/>')
            self.parts.append(f'<text x="{x + 20}" y="{y}" font-size="11">{escape(text)}</text>')
            x += 28 + 6 * len(text)
        self.parts.append("</g>")


def _title(tip: str | None) -> str:
    return f"<title>{tip}</title>" if tip else ""


def _dot(x: float, y: float, colour: str, tip: str | None, cls: str) -> str:
    return f'<circle class="{cls}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}">{_title(tip)}</circle>'


def _diamond(x: float, y: float, colour: str, tip: str | None, cls: str) -> str:
    return (f'<polygon class="{cls}" points="{x:.1f},{y - 4:.1f} {x + 4:.1f},{y:.1f} {x:.1f},{y + 4:.1f} '
            f'{x - 4:.1f},{y:.1f}" fill="{colour}">{_title(tip)}</polygon>')


def _cross(x: float, y: float, tip: str | None) -> str:
    return (f'<path class="nan" d="M{x - 4:.1f},{y - 4:.1f} L{x + 4:.1f},{y + 4:.1f} M{x - 4:.1f},{y + 4:.1f} '
            f'L{x + 4:.1f},{y - 4:.1f}" stroke="{NAN_COLOUR}" stroke-width="2">{_title(tip)}</path>')


def _triangle(x: float, y: float, tip: str | None) -> str:
    return (f'<polygon class="zero" points="{x - 4:.1f},{y - 3:.1f} {x + 4:.1f},{y - 3:.1f} {x:.1f},{y + 4:.1f}" '
            f'fill="{ZERO_COLOUR}">{_title(tip)}</polygon>')


def _polylines(points: list[tuple[float, float] | None], colour: str, cls: str) -> list[str]:
    """One polyline per run of consecutive points (None breaks the line: nothing drawn where no value is)."""
    runs, current = [], []
    for point in points + [None]:
        if point is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(point)
    out = []
    for run in runs:
        if len(run) > 1:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            out.append(f'<polyline class="{cls}" fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
    return out


def to_svg(report: CompareReport, cosine_threshold: float) -> str:
    """The chart as an SVG document."""
    return _Svg(PlotData.of(report, cosine_threshold)).render()


# ---- PNG ------------------------------------------------------------------------------------------

def _write_png(data: PlotData, path: Path, inputs) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise ConfigError(f"--plot {path}: PNG needs matplotlib; install precision-tool[plot] "
                          f"or use a .svg file name") from None
    points = data.points
    xs = [p.index for p in points]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 5.5))
    top.plot(xs, [p.cosine if _finite(p.cosine) else math.nan for p in points], color=COS_COLOUR,
             label="worst output cosine")
    top.axhline(data.threshold, color=NAN_COLOUR, linestyle="--", linewidth=1, label="cosine threshold")
    top.set_ylim(data.cosine_floor - (1.0 - data.cosine_floor) * 0.05, 1.0 + (1.0 - data.cosine_floor) * 0.05)
    nan_x = [p.index for p in points if p.cosine is not None and math.isnan(p.cosine)]
    if nan_x:
        top.plot(nan_x, [data.cosine_floor] * len(nan_x), "x", color=NAN_COLOUR, label="cosine undefined (NaN)")
    modules = [p for p in points if p.module and _finite(p.cosine)]
    if modules:
        top.plot([p.index for p in modules], [p.cosine for p in modules], "D", markersize=3, color=MODULE_COLOUR,
                 label="module output")
    for rank, index in enumerate(data.worst):
        top.annotate(points[index].label, (index, points[index].cosine), fontsize=7, xytext=(6, 4 + 10 * rank),
                     textcoords="offset points")
    top.set_ylabel("worst output cosine")
    lo, hi = data.decades
    bottom.semilogy(xs, [p.error if _finite(p.error) and p.error > 0 else math.nan for p in points],
                    color=ERR_COLOUR, label="max abs error")
    bottom.set_ylim(10.0 ** lo, 10.0 ** hi)
    zero_x = [p.index for p in points if p.error == 0.0]
    if zero_x:
        bottom.plot(zero_x, [10.0 ** lo] * len(zero_x), "v", color=ZERO_COLOUR, label="error exactly 0",
                    clip_on=False)
    bottom.set_ylabel("max abs error")
    bottom.set_xlabel(f"ops in execution order ({len(xs)})")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for index, step in data.step_starts:
        for axis in (top, bottom):
            axis.axvline(index - 0.5, color="#bbb", linestyle=":", linewidth=1)
        top.text(index - 0.5, 1.0, f" step {step}", fontsize=7, color="#888", va="bottom")
    if data.first_flagged is not None:
        for axis in (top, bottom):
            axis.axvline(data.first_flagged, color=NAN_COLOUR, linewidth=1)
        top.set_title(f"first flagged: {points[data.first_flagged].label}", fontsize=9, color=NAN_COLOUR)
    handles = [h for axis in (top, bottom) for h in axis.get_legend_handles_labels()[0]]
    labels = [label for axis in (top, bottom) for label in axis.get_legend_handles_labels()[1]]
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    try:
        with replacing(path, inputs) as temporary:
            figure.savefig(temporary, dpi=100, format="png")  # the temporary's name has no .png
    finally:
        plt.close(figure)
