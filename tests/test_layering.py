"""The layers: lower ones never import higher ones, and the core imports no UI library or torch."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "precision_tool"
RANK = {"errors": 0, "inputs": 0, "outputs": 0, "defaults": 0, "native": 0, "_native": 0, "engine": 1, "session": 2, "dump": 3,
        "collect": 3, "compare": 4, "analysis": 5, "commands": 5, "render": 6, "torch": 3, "cli": 7, "repl": 7}
CORE = ("engine", "session", "dump", "collect", "compare", "analysis")
# commands/ holds what both front ends share: results, and click parameter types and options (click parses
# both the batch CLI and the shell's lines), but nothing that draws or prompts
UI_FREE = {**{layer: ("click", "rich", "prompt_toolkit", "torch") for layer in CORE},
           "commands": ("rich", "prompt_toolkit", "torch")}


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
            if layer in UI_FREE:
                assert parts[0] not in UI_FREE[layer], f"{path.relative_to(PACKAGE)} imports {module}"


def test_importing_the_core_and_the_cli_loads_no_torch():
    code = ("import sys, pkgutil, importlib, precision_tool\n"
            "for layer in ('engine', 'session', 'dump', 'collect', 'compare', 'analysis', 'render', 'cli', 'repl'):\n"
            "    package = importlib.import_module(f'precision_tool.{layer}')\n"
            "    for m in pkgutil.walk_packages(package.__path__, f'precision_tool.{layer}.'):\n"
            "        importlib.import_module(m.name)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at the top or inside a function (a deferred import that
    only hides a cycle still makes one). A package's ``__init__`` importing its own modules is no edge back."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

    def owner(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("precision_tool"):
                targets |= {owner(f"{node.module}.{alias.name}") for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {owner(a.name) for a in node.names if a.name.startswith("precision_tool")}
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".") and t in modules}
    return graph


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: graph)
    with pytest.raises(AssertionError, match="import cycle: a -> b -> c -> a"):
        test_no_import_cycles_in_the_package()


def test_the_shell_and_the_batch_cli_share_results_without_importing_each_other():
    for path in sorted((PACKAGE / "repl").rglob("*.py")):
        assert not [m for m in _imports(path) if m.startswith("precision_tool.cli")], path.name
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        reaches = [m for m in _imports(path) if m.startswith("precision_tool.repl")]
        assert not reaches or path.name == "shell.py", f"{path.name} imports {reaches}"  # only to start the shell


def test_both_front_ends_build_on_the_command_layer():
    """cli/ and repl/ both take their commands from commands/ (the specs), and neither draws on the other."""
    for front_end in ("cli", "repl"):
        imported = {m for path in (PACKAGE / front_end).rglob("*.py") for m in _imports(path)}
        assert {"precision_tool.commands.spec", "precision_tool.commands.registry"} <= imported, front_end


def test_the_batch_commands_that_read_dumps_are_generated_from_their_specs():
    """No module of cli/ declares one of the registry's commands itself: they all come from the specs."""
    from precision_tool.commands.registry import SPECS

    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "command" and node.args:
                name = getattr(node.args[0], "value", None)
                assert name not in SPECS, f"{path.name} declares {name!r}, which its spec generates"


def test_the_command_layer_imports_neither_front_end_nor_a_ui_library():
    for path in sorted((PACKAGE / "commands").rglob("*.py")):
        for module in _imports(path):
            assert not module.startswith(("precision_tool.cli", "precision_tool.repl", "precision_tool.render",
                                          "rich", "prompt_toolkit")), f"{path.name} imports {module}"


def test_every_result_type_has_a_renderer():
    import dataclasses

    from precision_tool.commands import results
    from precision_tool.render.shell_views import RENDERERS

    top_level = [t for t in vars(results).values() if isinstance(t, type) and dataclasses.is_dataclass(t)
                 and t.__module__ == results.__name__]
    parts = {"TypeCount", "TensorMetric", "SlotView", "Mismatch", "CommandHelp", "RankRow"}  # drawn inside others
    drawn = {name for module, name in RENDERERS if module == results.__name__}
    assert {t.__name__ for t in top_level} - drawn == parts
    for module, name in RENDERERS:  # every key names a real class
        assert isinstance(getattr(importlib.import_module(module), name), type), (module, name)
