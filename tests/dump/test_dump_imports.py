"""The dump and collect layers import no front-end library, and reading a dump does not need the session."""

import subprocess
import sys


def test_dump_and_collect_import_no_front_end():
    code = (
        "import sys\n"
        "import precision_tool.dump.reader, precision_tool.dump.writer, precision_tool.dump.summary\n"
        "import precision_tool.collect, precision_tool.collect.run\n"
        "bad = [m for m in ('click', 'rich', 'prompt_toolkit') if m in sys.modules]\n"
        "print('FRONT:' + ','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "FRONT:"
