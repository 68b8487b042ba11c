"""The documents' examples run as written and print what they show."""

from __future__ import annotations

import shlex
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
PROMPT = "PrecisionTool > "


def _same_line(printed: str, shown: str) -> bool:
    """The line the document shows, each number to within 3 units of its last printed digit: the engine's
    float16 kernels run on numpy's BLAS, whose last bits differ between CPUs (a ratio of 49.06 printed where
    another machine prints 49.08)."""
    if printed == shown:
        return True
    ours, theirs = printed.split(), shown.split()
    return len(ours) == len(theirs) and all(map(_same_token, ours, theirs))


def _same_token(printed: str, shown: str) -> bool:
    if printed == shown:
        return True
    try:
        a, b = float(printed), float(shown)
    except ValueError:
        return False
    digits = shown.lower().split("e")[0]
    places = len(digits.split(".")[1]) if "." in digits else 0
    exponent = int(shown.lower().split("e")[1]) if "e" in shown.lower() else 0
    return abs(a - b) <= 3 * 10.0 ** (exponent - places)


def _session(doc: str, heading: str) -> list[str]:
    """The lines of the first code block under ``heading`` in ``doc``."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    after = text[text.index(heading):]
    start = after.index("```\n") + 4
    return after[start:after.index("```", start)].splitlines()


def test_the_shell_session_in_docs_shell_md_prints_what_it_shows(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "110")
    lines = _session("shell.md", "## A session")
    files = []
    for i, line in enumerate(lines):
        if line.startswith("$ precision-tool collect "):
            assert run_cli(*shlex.split(line)[2:]).status == 0
        elif line.startswith("$ precision-tool shell "):
            files = shlex.split(line)[3:]
        elif line.startswith(PROMPT) and line != PROMPT + "exit":
            shown = []
            for follow in lines[i + 1:]:
                if follow.startswith(PROMPT):
                    break
                shown.append(follow)
            result = run_cli("shell", *files, "-c", line[len(PROMPT):])
            printed = [out.rstrip() for out in (result.stdout + result.stderr).splitlines()]
            assert len(printed) >= len(shown) and all(map(_same_line, printed, shown)), (line, printed, shown)
