"""The thin prompt_toolkit adapter over the pure completion engine."""

from __future__ import annotations

from prompt_toolkit.completion import Completer, Completion

from precision_tool.repl.completion import Catalog, complete


def build_catalog(runner) -> Catalog:
    """Command specs from the runner's table, names from the session's primary dump index."""
    commands = {name: command.spec for name, command in runner.commands.items()}
    role = runner.session.primary_role
    if role is None:
        return Catalog(commands)
    index = runner.session.index(role)
    steps = sorted({step for recorded in index.steps.values() for step in recorded})
    return Catalog(commands, ops=index.names, slots=index.slots, types=index.types, passes=index.passes, steps=steps)


class ShellCompleter(Completer):
    """Completes commands, options, op and tensor names; the catalog is built on first use."""

    def __init__(self, runner):
        self.runner = runner
        self._catalog: Catalog | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = build_catalog(self.runner)
        return self._catalog

    def get_completions(self, document, complete_event):
        for candidate in complete(document.text_before_cursor, self.catalog):
            yield Completion(candidate.text, start_position=-candidate.replace, display_meta=candidate.meta)
