"""Collection: a session hook that records what a mode asks for to an HDF5 dump.

    from precision_tool.collect import collect_to
    with collect_to("run.h5", mode="dump") as collector:
        Session(config, hooks=[collector]).run()
"""

from precision_tool.collect.collector import Collector, collect_to
from precision_tool.collect.modes import MODES, parse_modes
from precision_tool.collect.selection import Selection, parse_steps

__all__ = ["MODES", "Collector", "Selection", "collect_to", "parse_modes", "parse_steps"]
