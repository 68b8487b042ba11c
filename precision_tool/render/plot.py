"""``compare --plot FILE``: cosine and max abs error along execution order, as SVG or PNG.

SVG is written by hand (no dependency). PNG needs matplotlib, the ``plot``
extra; without it a ConfigError says to install ``precision-tool[plot]`` or
use a ``.svg`` name. Each op is one x position (execution order); its worst
output cosine goes in the top panel (with the threshold dashed), its largest
output max abs error in the bottom one on a log scale. A red line marks the
first flagged op; red crosses mark undefined cosines (one side all zeros).
"""

from __future__ import annotations

import math
from pathlib import Path
from xml.sax.saxutils import escape

from precision_tool.compare.report import CompareReport
from precision_tool.errors import ConfigError
from precision_tool.outputs import replacing, write_text

WIDTH, HEIGHT = 960, 480
LEFT, RIGHT, TOP, GAP, BOTTOM = 80, 20, 40, 50, 40
PANEL = (HEIGHT - TOP - GAP - BOTTOM) / 2
ERR_FLOOR = 1e-12


def _series(report: CompareReport):
    cosines = [op.worst_output_cosine for op in report.ops]
    errors = [op.max_output_abs_err for op in report.ops]
    return cosines, errors


def _first_flagged(report: CompareReport, threshold: float) -> int | None:
    return next((i for i, op in enumerate(report.ops) if op.flagged(threshold)), None)


def write_plot(report: CompareReport, path, cosine_threshold: float, inputs=()) -> Path:
    """Write the chart to ``path`` (never over one of ``inputs``); the suffix (.svg or .png) picks the format."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        write_text(path, to_svg(report, cosine_threshold), inputs)
    elif suffix == ".png":
        _write_png(report, path, cosine_threshold, inputs)
    else:
        raise ConfigError(f"--plot {path}: use a .svg or .png file name")
    return path


def _x(i: int, n: int) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * (i / (n - 1) if n > 1 else 0.5)


def _polylines(points: list[tuple[float, float] | None], colour: str) -> list[str]:
    """One polyline per run of consecutive points (None breaks the line)."""
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
        if len(run) == 1:
            out.append(f'<circle cx="{run[0][0]:.1f}" cy="{run[0][1]:.1f}" r="2" fill="{colour}"/>')
        else:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
    return out


def _axis(top: float, label: str, ticks: list[tuple[float, str]]) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{top:.1f}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL:.1f}" '
           f'fill="none" stroke="#888"/>',
           f'<text x="{LEFT}" y="{top - 6:.1f}" font-size="13" font-weight="bold">{escape(label)}</text>']
    for y, text in ticks:
        out.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#888"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{escape(text)}</text>')
    return out


def to_svg(report: CompareReport, cosine_threshold: float) -> str:
    """The chart as an SVG document."""
    cosines, errors = _series(report)
    n = len(report.ops)
    finite_cos = [c for c in cosines if c is not None and not math.isnan(c)]
    cos_lo = min(finite_cos + [cosine_threshold]) if finite_cos else cosine_threshold
    cos_lo = min(cos_lo, 1.0 - 1e-6)
    top1, top2 = TOP, TOP + PANEL + GAP

    def y_cos(c: float) -> float:
        return top1 + PANEL * (1.0 - (c - cos_lo) / (1.0 - cos_lo))

    finite_err = [max(e, ERR_FLOOR) for e in errors if e is not None]
    e_lo = math.floor(math.log10(min(finite_err))) if finite_err else -12
    e_hi = math.ceil(math.log10(max(finite_err))) if finite_err else 0
    e_hi = e_hi if e_hi > e_lo else e_lo + 1

    def y_err(e: float) -> float:
        return top2 + PANEL * (1.0 - (math.log10(max(e, ERR_FLOOR)) - e_lo) / (e_hi - e_lo))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<title>{escape(report.target.path)} vs {escape(report.golden.path)}</title>']
    parts += _axis(top1, "worst output cosine", [(y_cos(v), f"{v:.4g}") for v in (cos_lo, cosine_threshold, 1.0)])
    parts += _axis(top2, "max abs error (log)", [(y_err(10.0 ** k), f"1e{k}") for k in range(e_lo, e_hi + 1)])
    if cos_lo < cosine_threshold < 1.0:
        y = y_cos(cosine_threshold)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#d62728" '
                     f'stroke-dasharray="5,4"/>')
    cos_points = [(_x(i, n), y_cos(c)) if c is not None and not math.isnan(c) else None for i, c in enumerate(cosines)]
    err_points = [(_x(i, n), y_err(e)) if e is not None else None for i, e in enumerate(errors)]
    parts += _polylines(cos_points, "#1f77b4") + _polylines(err_points, "#ff7f0e")
    for i, c in enumerate(cosines):
        if c is not None and math.isnan(c):
            x, y = _x(i, n), top1 + PANEL - 6
            parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="12" fill="#d62728" text-anchor="middle">×</text>')
    first = _first_flagged(report, cosine_threshold)
    if first is not None:
        x, op = _x(first, n), report.ops[first]
        parts.append(f'<line x1="{x:.1f}" y1="{top1}" x2="{x:.1f}" y2="{top2 + PANEL:.1f}" stroke="#d62728"/>')
        parts.append(f'<text x="{min(x + 4, WIDTH - 300):.1f}" y="{top1 + 14}" font-size="11" fill="#d62728">'
                     f'first flagged: {escape(op.name)} ({op.direction}, step {op.step})</text>')
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 10}" font-size="12" '
                 f'text-anchor="middle">ops in execution order ({n})</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _write_png(report: CompareReport, path: Path, cosine_threshold: float, inputs) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(f"--plot {path}: PNG needs matplotlib; install precision-tool[plot] "
                          f"or use a .svg file name") from None
    cosines, errors = _series(report)
    xs = list(range(len(report.ops)))
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 5))
    top.plot(xs, [math.nan if c is None else c for c in cosines], color="#1f77b4")
    top.axhline(cosine_threshold, color="#d62728", linestyle="--", linewidth=1)
    top.set_ylabel("worst output cosine")
    bottom.semilogy(xs, [math.nan if e is None else max(e, ERR_FLOOR) for e in errors], color="#ff7f0e")
    bottom.set_ylabel("max abs error")
    bottom.set_xlabel(f"ops in execution order ({len(xs)})")
    first = _first_flagged(report, cosine_threshold)
    if first is not None:
        for axis in (top, bottom):
            axis.axvline(first, color="#d62728", linewidth=1)
        top.set_title(f"first flagged: {report.ops[first].name}", fontsize=9, color="#d62728")
    figure.tight_layout()
    try:
        with replacing(path, inputs) as temporary:
            figure.savefig(temporary, dpi=100, format="png")  # the temporary's name has no .png
    finally:
        plt.close(figure)
