"""The optional C extension `precision_tool._native`, or None where it is not in use.

`pip install` builds it where a C compiler is available (setup.py); without
one, or with ``PRECISION_TOOL_KERNEL=numpy`` in the environment, `extension`
is None and its callers (compare's metrics, the collector's statistics) take
their numpy paths, which compute the same float64 sums more slowly.
"""

from __future__ import annotations

import os


def _load():
    if os.environ.get("PRECISION_TOOL_KERNEL", "c") == "numpy":
        return None
    try:
        from precision_tool import _native
    except ImportError:  # built without a C compiler
        return None
    return _native


extension = _load()
