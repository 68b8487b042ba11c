"""The documents' examples run as written and print what they show."""

from __future__ import annotations

import shlex
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
PROMPT = "PrecisionTool > "


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
            assert printed[:len(shown)] == shown, line
