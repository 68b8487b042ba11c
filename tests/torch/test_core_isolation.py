"""Nothing outside precision_tool.torch imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

CORE = ["precision_tool.engine.executor", "precision_tool.engine.device", "precision_tool.dump.reader",
        "precision_tool.dump.writer", "precision_tool.compare", "precision_tool.compare.comparator",
        "precision_tool.analysis", "precision_tool.cli.main"]


def test_the_core_package_never_imports_torch():
    code = ("import importlib, sys\n"
            f"for name in {CORE!r}:\n"
            "    importlib.import_module(name)\n"
            "from precision_tool.cli.main import main\n"
            "main(['--help'])\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
