"""The layers: lower ones never import higher ones, and the core imports no UI library or torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "precision_tool"
RANK = {"errors": 0, "outputs": 0, "defaults": 0, "native": 0, "_native": 0, "engine": 1, "session": 2, "dump": 3, "collect": 3, "compare": 4,
        "analysis": 5, "render": 6, "torch": 3, "cli": 7, "repl": 7}
CORE = ("engine", "session", "dump", "collect", "compare", "analysis")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


@pytest.mark.parametrize("layer", sorted(RANK))
def test_a_layer_imports_only_layers_at_or_below_it(layer):
    paths = [PACKAGE / f"{layer}.py"] if (PACKAGE / f"{layer}.py").exists() else sorted((PACKAGE / layer).rglob("*.py"))
    for path in paths:
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] == "precision_tool" and len(parts) > 1 and parts[1] in RANK:
                assert RANK[parts[1]] <= RANK[layer], f"{path.relative_to(PACKAGE)} imports {module}"
            if layer in CORE:
                assert parts[0] not in ("click", "rich", "prompt_toolkit", "torch"), \
                    f"{path.relative_to(PACKAGE)} imports {module}"


def test_importing_the_core_and_the_cli_loads_no_torch():
    code = ("import sys, pkgutil, importlib, precision_tool\n"
            "for layer in ('engine', 'session', 'dump', 'collect', 'compare', 'analysis', 'render', 'cli', 'repl'):\n"
            "    package = importlib.import_module(f'precision_tool.{layer}')\n"
            "    for m in pkgutil.walk_packages(package.__path__, f'precision_tool.{layer}.'):\n"
            "        importlib.import_module(m.name)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
