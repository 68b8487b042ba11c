"""Showing outcomes: results through the shared renderers, errors as one red line on stderr."""

from __future__ import annotations

from rich.console import Console

from precision_tool.commands.results import Delivered, JsonDocument, TextDocument
from precision_tool.render.shell_views import render
from precision_tool.errors import printable


class Printer:
    """Renders each Outcome; remembers whether any command failed (for `shell -c` exit status)."""

    def __init__(self, out: Console, err: Console, report_internal=None):
        self.out = out
        self.err = err
        self.report_internal = report_internal  # called with the exception of an internal error
        self.failures = 0
        self.internal_failures = 0

    def show(self, outcome) -> None:
        if outcome.error is not None:
            self.failures += 1
            if outcome.internal is not None:
                self.internal_failures += 1
                if self.report_internal is not None:
                    self.report_internal(outcome.internal)
                    return
            self.err.print(f"error: {outcome.error}", style="red", markup=False, highlight=False, soft_wrap=True)
            return
        result = outcome.result
        wrote = result.wrote if isinstance(result, Delivered) else ()
        text = result.shown if isinstance(result, Delivered) else result
        if isinstance(text, (JsonDocument, TextDocument)):  # for machines (JSON, CSV): whole lines, never wrapped
            self.out.print(render(text), soft_wrap=True, markup=False, highlight=False)  # or styled
        elif text is not None:
            self.out.print(render(text))
        for path in wrote:  # said on stderr, as the batch commands say them: what stdout holds parses
            self.err.print(f"wrote {printable(path)}", soft_wrap=True, markup=False, highlight=False)

    def show_all(self, outcomes) -> bool:
        """Show every outcome; True when one of them asked to quit."""
        for outcome in outcomes:
            self.show(outcome)
        return any(outcome.quit for outcome in outcomes)
