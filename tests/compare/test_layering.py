import subprocess
import sys


def test_the_comparator_imports_no_front_end_library():
    code = ("import sys, pkgutil, importlib, precision_tool.compare as c\n"
            "for m in pkgutil.iter_modules(c.__path__): importlib.import_module(f'precision_tool.compare.{m.name}')\n"
            "print(','.join(m for m in ('click', 'rich', 'prompt_toolkit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
