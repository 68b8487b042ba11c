"""Device profiles: the golden CPU reference and the simulated NPU."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from precision_tool.engine.formats import FLOAT32, FLOAT64, Format, check_overflow_mode, get_format
from precision_tool.engine.fusion.switch import FusionSwitch, load_fusion_switch
from precision_tool.engine.precision import MixLists, Policy, load_mixlist, policy_for

DEVICES = ("golden", "npu")


@dataclass(frozen=True)
class DeviceProfile:
    """How every op computes: formats, overflow mode, fusion.

    Build one with `golden()` or `npu()`; both validate their arguments.
    """

    kind: str  # "golden" or "npu"
    origin: Format = FLOAT32  # the graph's own float format
    precision_mode: str | None = None
    precision_mode_v2: str | None = None
    overflow_mode: str = "inf_nan"
    mixlists: MixLists = field(default_factory=MixLists)
    fusion: FusionSwitch = field(default_factory=lambda: FusionSwitch(all_off=True))

    @property
    def policy(self) -> Policy | None:
        """The lowering policy; None on golden, where everything stays in origin."""
        if self.kind == "golden":
            return None
        return policy_for(self.precision_mode, self.precision_mode_v2)

    @property
    def effective_precision_mode(self) -> str:
        """The mode in force, naming the default when none was set."""
        if self.kind == "golden":
            return "golden_" + self.origin.name
        return self.precision_mode_v2 or self.precision_mode or "allow_fp32_to_fp16"

    def with_precision(self, precision_mode: str | None, precision_mode_v2: str | None) -> "DeviceProfile":
        """The same device with another precision mode (accelerate_train_mode switches)."""
        policy_for(precision_mode, precision_mode_v2)
        return replace(self, precision_mode=precision_mode, precision_mode_v2=precision_mode_v2)

    def describe(self) -> dict:
        """Plain metadata for dumps and reports."""
        return {
            "device": self.kind,
            "origin_dtype": self.origin.name,
            "precision_mode": self.precision_mode or "",
            "precision_mode_v2": self.precision_mode_v2 or "",
            "effective_precision_mode": self.effective_precision_mode,
            "overflow_mode": self.overflow_mode,
            "fusion": self.fusion.describe(),
            "modify_mixlist": {name: sorted(getattr(self.mixlists, name)) for name in ("white", "black", "gray")},
        }


def device_from_description(description: dict) -> DeviceProfile:
    """The profile `DeviceProfile.describe` wrote (a checkpoint's or dump's); ValueError if it cannot be one."""
    kind = description.get("device")
    if kind not in DEVICES:
        raise ValueError(f"unknown device {kind!r}; valid: {', '.join(DEVICES)}")
    origin = get_format(description.get("origin_dtype", FLOAT32.name))
    if kind == "golden":
        return DeviceProfile("golden", origin)
    policy_for(description.get("precision_mode") or None, description.get("precision_mode_v2") or None)
    overflow_mode = description.get("overflow_mode", "saturation")
    check_overflow_mode(overflow_mode)
    fusion = description.get("fusion") or {}
    lists = description.get("modify_mixlist") or {}
    mixlists = MixLists(**{name: frozenset(lists.get(name, ())) for name in ("white", "black", "gray")})
    return DeviceProfile("npu", origin, description.get("precision_mode") or None,
                         description.get("precision_mode_v2") or None, overflow_mode, mixlists,
                         FusionSwitch(all_off=bool(fusion.get("all_off", False)),
                                      off=frozenset(fusion.get("off", ()))))


def golden(float64: bool = False) -> DeviceProfile:
    """The reference: IEEE float32 (or float64) throughout, no fusion."""
    return DeviceProfile("golden", FLOAT64 if float64 else FLOAT32)


def npu(precision_mode: str | None = None, precision_mode_v2: str | None = None,
        overflow_mode: str = "saturation", modify_mixlist: str | Path | None = None,
        fusion_switch: FusionSwitch | str | Path | None = None) -> DeviceProfile:
    """The simulated NPU.

    ``fusion_switch`` is a `FusionSwitch`, a path to a ``fusion_switch.cfg``
    JSON file, or None for every pass on.
    """
    policy_for(precision_mode, precision_mode_v2)
    check_overflow_mode(overflow_mode)
    mixlists = MixLists()
    if modify_mixlist is not None:
        from precision_tool.engine.ops import REGISTRY

        mixlists = load_mixlist(modify_mixlist, set(REGISTRY))
    if fusion_switch is None:
        fusion_switch = FusionSwitch()
    elif not isinstance(fusion_switch, FusionSwitch):
        fusion_switch = load_fusion_switch(fusion_switch)
    return DeviceProfile("npu", FLOAT32, precision_mode, precision_mode_v2, overflow_mode,
                         mixlists, fusion_switch)
