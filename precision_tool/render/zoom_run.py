"""The end of `precision-tool zoom`: the region, the diagnosis as `diagnose` prints it, and the dumps' sizes."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from precision_tool.render.zoom_view import region_words


def zoom_outcome(run, cosine_threshold=None) -> Group:
    """`precision-tool zoom`'s end: the region and the diagnosis (as `diagnose` prints it), then the sizes; or
    that nothing diverges."""
    from precision_tool.defaults import COSINE_THRESHOLD
    from precision_tool.render.inspect_view import format_size
    from precision_tool.render.shell_views import render

    sizes = run.sizes()
    stats = sum(sizes[path] for path in run.stats.values())
    if run.region is None:
        threshold = COSINE_THRESHOLD if cosine_threshold is None else cosine_threshold
        return Group(Text(f"no op diverges between {run.stats['golden']} and {run.stats['target']} (statistics, "
                          f"relative norm difference > {1 - threshold:.3g}): nothing to zoom into", style="bold green"),
                     Text(f"sizes: statistics {format_size(stats)}", style="dim"))
    zoom = sum(sizes[path] for path in run.zoom.values())
    line = (f"sizes: statistics {format_size(stats)} ({_pair(run.stats, sizes)}) + region tensors "
            f"{format_size(zoom)} ({_pair(run.zoom, sizes)}) = {format_size(stats + zoom)}")
    region = run.region
    which = f"{region.op}, which the statistics' diagnosis names ({region.named})" if region.named else \
        f"first divergent op {region.op}"
    return Group(Text(f"Zoomed into {region_words(region)}: {which}", style="bold"),
                 render(run.diagnosis), Text(line))


def _pair(paths: dict, sizes: dict) -> str:
    from precision_tool.render.inspect_view import format_size

    return " + ".join(f"{role} {format_size(sizes[path])}" for role, path in paths.items())
