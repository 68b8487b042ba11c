"""Where PyTorch is not installed, ``import torch`` must fail here, so the tests skip saying why.

This folder is named ``torch``: were ``tests/`` ever on ``sys.path`` (a test
layout without ``__init__.py`` files), ``import torch`` would find this folder
as a namespace package and ``pytest.importorskip("torch")`` would not skip.
"""

import importlib.util
import sys

_spec = importlib.util.find_spec("torch")
if _spec is None or _spec.origin is None:  # not installed (at most this folder, as a namespace package)
    sys.modules["torch"] = None
