"""A zoom region (`precision_tool.analysis.zoom`): what `compare` shows under a statistics comparison, and its JSON."""

from __future__ import annotations

import dataclasses

from rich.console import Group
from rich.text import Text


def region_words(region) -> str:
    """``step 3, module norm (its ops) and the ops ... (forward only)``: what the region records."""
    steps = region.selection()["steps"]
    parts = [f"step {steps[0]}" if len(steps) == 1 else
             f"steps {', '.join(map(str, steps[:-1]))} and {steps[-1]}"]
    if region.modules:
        parts.append("every op in module " + ", ".join(region.modules))
    if region.ops:
        parts.append(f"{'and ' if region.modules else ''}the ops " + ", ".join(region.ops))
    return ", ".join(parts) + ("" if region.backward else " (forward only)")


def zoom_view(region) -> Group:
    """The first divergent op, the region around it, and the commands that re-collect it with full tensors."""
    title = Text("Zoom: ", style="bold")
    title.append(f"first divergent op {region.op} ({region.type}, {region.direction}) at step {region.step}",
                 style="bold red")
    lines = [title, Text(f"  {'; '.join(region.reasons)}"),
             Text(f"  re-collect full tensors of {region_words(region)}:")]
    for side in region.recollect:
        if side.command or side.call:
            lines.append(Text(f"  {side.role}: ", style="bold"))
            lines[-1].append(side.command or side.call)
        else:
            lines.append(Text(f"  {side.role}: {side.source} {side.note}", style="yellow"))
    sides = [side for side in region.recollect if side.output != side.source]
    if sides:
        golden = next(s.output for s in region.recollect if s.role == "golden")
        target = next(s.output for s in region.recollect if s.role == "target")
        lines.append(Text(f"  then: precision-tool diagnose {golden} {target}", style="dim"))
    return Group(*lines)


def zoom_dict(region) -> dict | None:
    """The JSON form (``zoom`` in compare's document); None when there is no region."""
    if region is None:
        return None
    document = dataclasses.asdict(region)
    document["region"] = region_words(region)
    return document

