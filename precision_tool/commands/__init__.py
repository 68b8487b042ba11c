"""What the commands return: one dataclass per result, shared by the batch CLI, the shell and the renderers.

Below `precision_tool.render` (which draws these types, chosen by type) and
above the core (compare, analysis, dump), so that `cli/` and `repl/` both
build on it and neither needs the other.
"""
