"""Option types shared by the batch commands and the shell: bad numbers are refused at parse time.

click's FloatRange lets NaN through (every comparison with NaN is false), and
a NaN threshold turns every test it takes part in into a pass: ``check
--min-cosine nan`` would pass anything. `FiniteFloat` accepts only finite
numbers within its bounds.
"""

from __future__ import annotations

import math

import click

from precision_tool.defaults import COSINE_THRESHOLD, LIST_LIMIT


class FiniteFloat(click.ParamType):
    """A finite float within [min, max] (either bound may be None)."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None, above_min: bool = False):
        self.min, self.max = min, max
        self.above_min = above_min  # the minimum itself is out (a learning rate of 0)

    def convert(self, value, param, ctx):
        if isinstance(value, float) and math.isfinite(value) and self._inside(value):
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number{self._range_text()}", param, ctx)
        if not self._inside(number):
            self.fail(f"{value!r} is not{self._range_text()}", param, ctx)
        return number

    def _inside(self, number: float) -> bool:
        return (self.min is None or number > self.min or (number == self.min and not self.above_min)) and \
            (self.max is None or number <= self.max)

    def _range_text(self) -> str:
        if self.min is not None and self.max is not None:
            return f" in the range {self.min:g} to {self.max:g}" + (f", above {self.min:g}" if self.above_min else "")
        if self.min is not None:
            return f" {'>' if self.above_min else '>='} {self.min:g}"
        if self.max is not None:
            return f" <= {self.max:g}"
        return ""

    def __repr__(self) -> str:
        return f"FiniteFloat({self.min!r}, {self.max!r})"


COSINE = FiniteFloat(-1.0, 1.0)  # a cosine similarity threshold
TOLERANCE = FiniteFloat(min=0.0)  # an absolute or relative error bound
SEED = click.IntRange(0, 2**64 - 1)  # numpy seeds any size; the dump stores it as a 64-bit unsigned integer


# -c and -l of the batch `compare` and the shell's `vcs`: one definition, (declarations, attributes) each
COSINE_OPTION = (("-c", "--cosine"), {"type": COSINE, "default": None,
                                      "help": "Flag an op when an output's cosine is at or below this "
                                              f"(default {COSINE_THRESHOLD})."})
LIMIT_OPTION = (("-l", "--limit"), {"type": click.IntRange(min=0), "default": None,
                                    "help": f"Show at most this many flagged ops, in execution order "
                                            f"(default {LIST_LIMIT}; 0: all)."})


def listing_params() -> list[click.Option]:
    """The shell's -c and -l, as click parameters."""
    return [click.Option(list(decls), **attrs) for decls, attrs in (COSINE_OPTION, LIMIT_OPTION)]


class NameType(click.ParamType):
    """Text naming something a dump holds (``kind``: op, tensor, type, pass): the shell completes it from its
    dumps, so which argument takes what is said once, in the command's own parameters."""

    def __init__(self, kind: str):
        self.kind = kind
        self.name = kind

    def convert(self, value, param, ctx):
        return value if isinstance(value, str) else str(value)

    def __repr__(self) -> str:
        return f"NameType({self.kind!r})"


OP_NAME, TENSOR_NAME, TYPE_NAME, PASS_NAME = NameType("op"), NameType("tensor"), NameType("type"), NameType("pass")


class StepType(click.IntRange):
    """A step number (>= 0): the shell completes it from the steps its dumps recorded."""

    name = "step"
    kind = "step"

    def __init__(self):
        super().__init__(min=0)

    def __repr__(self) -> str:
        return "StepType()"


STEP = StepType()

class OutputFolder(click.Path):
    """A folder a command writes into; an empty name is refused, where pathlib would read it as the current
    folder: `--workdir ""` wrote the demo's dumps among the user's files instead of failing as `-o ""` does."""

    def __init__(self, **kwargs):
        super().__init__(file_okay=False, **kwargs)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:
            self.fail("the folder name is empty; give the folder to write into", param, ctx)
        return super().convert(value, param, ctx)


class RunFolder(click.Path):
    """The run directory `ranks` reads; a single dump file given instead is named as such (click said only
    "Directory 'x.h5' is a file")."""

    def __init__(self):
        super().__init__(path_type=str)

    def convert(self, value, param, ctx):
        import os

        if isinstance(value, str) and os.path.isfile(value):
            self.fail(f"{value} is one dump; ranks reads a run directory (rank0.h5, rank1.h5, ... and run.json, "
                      "as collect --ranks writes it)", param, ctx)
        return super().convert(value, param, ctx)


# -- what the dump-reading commands share -------------------------------------------------------------------
DUMP = click.Path(path_type=str)  # a dump the batch command reads: a file, or an msprobe directory or dump.json
READ_FILE = click.Path(dir_okay=False, path_type=str)  # another file a command reads (check --baseline)
OUT_FILE = click.Path(dir_okay=False, writable=True, path_type=str)


def _steps_callback(ctx, param, value):
    from precision_tool.compare.selection import parse_steps
    from precision_tool.errors import ConfigError

    try:
        return parse_steps(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


def _plot_callback(ctx, param, value):
    import importlib.util
    from pathlib import Path

    if value is None:
        return None
    suffix = Path(value).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise click.BadParameter(f"{value}: use a .svg or .png file name")
    if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
        raise click.BadParameter(f"{value}: PNG needs matplotlib; install precision-tool[plot] or use .svg")
    return value


def option(*decls, **attrs) -> click.Option:
    return click.Option(list(decls), **attrs)


def _scheduler_callback(ctx, param, value):
    if value is None:
        return None
    from precision_tool.compare.cluster import check_address
    from precision_tool.errors import ConfigError

    try:
        return check_address(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc).removeprefix("--scheduler ")) from None


def scheduler_param() -> click.Option:
    return option("--scheduler", metavar="ADDRESS", default=None, callback=_scheduler_callback,
                  help="Score the tensor pairs on the dask.distributed cluster at ADDRESS (e.g. tcp://host:8786); "
                       "the dumps must sit on storage every worker sees at the same path.")


def selection_params() -> list[click.Option]:
    """--steps, --ops, --jobs and --scheduler: which tensors to compare, and on how many threads or workers."""
    from precision_tool.defaults import COMPARE_JOBS

    return [option("--steps", metavar="LIST", default=None, callback=_steps_callback,
                   help="Only these steps, e.g. 0,5-7 (default: all)."),
            option("--ops", "op_glob", metavar="GLOB", type=OP_NAME, default=None,
                   help="Only ops whose name, or a name they were fused from, matches GLOB."),
            option("--jobs", type=click.IntRange(min=1), default=None,
                   help=f"Threads scoring tensor pairs (default {COMPARE_JOBS})."),
            scheduler_param()]


def format_param(formats=("table", "json"), help_text: str = "A table, or JSON.") -> click.Option:
    return option("--format", "fmt", type=click.Choice(list(formats)), default="table", show_default=True,
                  help=help_text)


def output_param(help_text: str = "Write the chosen format to FILE.", **attrs) -> click.Option:
    return option("-o", "--output", type=OUT_FILE, help=help_text, **attrs)  # no default: -o may be required


def plot_param() -> click.Option:
    return option("--plot", type=click.Path(dir_okay=False, path_type=str), default=None, callback=_plot_callback,
                  help="Also draw cosine and max abs error along execution order to FILE (.svg, or .png with "
                       "matplotlib).")


def allow_incomplete_param() -> click.Option:
    return option("--allow-incomplete", is_flag=True,
                  help="Accept a golden or target run that is incomplete (killed, or still being written): only "
                       "its committed steps are compared. Without it that is an error (exit 2).")
