"""Build the optional C kernel of the comparator; everything else is in pyproject.toml.

The extension is optional: where it cannot be built (no C compiler), the
install still succeeds and `precision_tool.compare.metrics` uses its numpy
path, which gives the same metrics about four times slower.
"""

import sys

from setuptools import Extension, setup

# -ffinite-math-only lets GCC vectorise the max reductions; the kernel never sees
# a non-finite value (see the top of _kernel.c). The other flags let it split sums
# across vector lanes and skip errno.
GCC_FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only", "-fno-signed-zeros",
             "-fassociative-math"]

setup(
    ext_modules=[
        Extension(
            "precision_tool.compare._kernel",
            sources=["precision_tool/compare/_kernel.c"],
            extra_compile_args=[] if sys.platform == "win32" else GCC_FLAGS,
            optional=True,
        )
    ],
)
