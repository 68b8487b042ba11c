"""The fusion switch file, in the spirit of Ascend's ``fusion_switch.cfg``.

Accepted shapes::

    {"GraphFusion": {"ALL": "off"}}
    {"GraphFusion": {"MatMulBiasAddGeluFusionPass": "off"}}
    {"Switch": {"GraphFusion": {...}, "UBFusion": {...}}}

Every value is "on" or "off"; a pass not named stays on. ``ALL`` applies to
every pass, and a named pass overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from precision_tool.errors import InputError
from precision_tool.inputs import read_json

_SECTIONS = ("GraphFusion", "UBFusion")


@dataclass(frozen=True)
class FusionSwitch:
    """Which fusion passes are off; ``all_off`` turns every pass off."""

    all_off: bool = False
    off: frozenset[str] = field(default_factory=frozenset)

    def enabled(self, pass_name: str) -> bool:
        return not self.all_off and pass_name not in self.off

    def describe(self) -> dict:
        return {"all_off": self.all_off, "off": sorted(self.off)}


def parse_fusion_switch(spec, source: str = "fusion switch") -> FusionSwitch:
    """A FusionSwitch from the parsed JSON ``spec``; errors name ``source``."""
    from precision_tool.engine.fusion.base import PASSES

    known = {p.name for p in PASSES}
    if isinstance(spec, dict) and "Switch" in spec:
        spec = spec["Switch"]
    if not isinstance(spec, dict) or not spec or set(spec) - set(_SECTIONS):
        raise InputError(source, f"expected an object with {' and/or '.join(_SECTIONS)} sections")
    all_off = False
    explicit: dict[str, str] = {}
    for section in spec.values():
        if not isinstance(section, dict):
            raise InputError(source, "each section maps pass names to \"on\" or \"off\"")
        for name, state in section.items():
            if state not in ("on", "off"):
                raise InputError(source, f"{name}: expected \"on\" or \"off\", got {state!r}")
            if name == "ALL":
                all_off = state == "off"
            elif name not in known:
                raise InputError(source, f"unknown fusion pass {name!r}; valid: ALL, {', '.join(sorted(known))}")
            else:
                explicit[name] = state
    if all_off:
        off = known - {n for n, s in explicit.items() if s == "on"}
    else:
        off = {n for n, s in explicit.items() if s == "off"}
    return FusionSwitch(all_off=all_off and not any(s == "on" for s in explicit.values()),
                        off=frozenset(off))


def load_fusion_switch(path) -> FusionSwitch:
    """Read a fusion switch file; a bad file raises InputError naming it."""
    return parse_fusion_switch(read_json(path), str(path))
