"""Build the optional C extension precision_tool._native; everything else is in pyproject.toml.

The extension is optional: where it cannot be built (no C compiler), the
install still succeeds, and the comparator's metrics and the collector's
statistics take their numpy paths, which compute the same float64 sums
more slowly (see the top of precision_tool/_native.c).
"""

import sys

from setuptools import Extension, setup

# -ffinite-math-only lets GCC vectorise the max reductions; the loops never see
# a non-finite value (see the top of _native.c). The other flags let it split sums
# across vector lanes and skip errno.
GCC_FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only", "-fno-signed-zeros",
             "-fassociative-math"]

setup(
    ext_modules=[
        Extension(
            "precision_tool._native",
            sources=["precision_tool/_native.c"],
            extra_compile_args=[] if sys.platform == "win32" else GCC_FLAGS,
            optional=True,
        )
    ],
)
