"""Splitting a shell line into commands and words, and parsing words with click.

A line is split on unquoted ``;`` into commands, and each command into words
with `shlex` (POSIX quoting: ``ni "a b"`` passes one word). The words are
parsed by the command's own `click.Command`, the same option spec as its
batch twin, so help, validation and defaults cannot drift; a click error
becomes a one-line `ShellUsageError` and never leaves the shell.
"""

from __future__ import annotations

import shlex
import shutil

import click

from precision_tool.errors import PrecisionToolError

HELP_FLAGS = ("-h", "--help")


class ShellUsageError(PrecisionToolError):
    """A line or a command's arguments could not be parsed."""


def split_commands(line: str) -> list[str]:
    """Split on ``;`` outside quotes; empty commands are dropped."""
    commands, current, quote, escaped = [], [], None, False
    for char in line:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\" and quote != "'":
            current.append(char)
            escaped = True
        elif quote:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'\"":
            current.append(char)
            quote = char
        elif char == ";":
            commands.append("".join(current))
            current = []
        else:
            current.append(char)
    commands.append("".join(current))
    return [c.strip() for c in commands if c.strip()]


def split_words(command: str) -> list[str]:
    """Split one command into words with POSIX shell quoting."""
    try:
        return shlex.split(command, comments=False, posix=True)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise ShellUsageError(f"cannot split {command!r}: {str(exc).lower()}") from None


def wants_help(args: list[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in args)


def parse_args(spec: click.Command, name: str, args: list[str]) -> dict:
    """Parse ``args`` with ``spec``'s click parser; returns the parameter values."""
    try:
        with spec.make_context(name, list(args), resilient_parsing=False) as ctx:
            return dict(ctx.params)
    except click.exceptions.Exit:  # an eager option such as --version; nothing to run
        raise ShellUsageError(f"{name}: nothing to run") from None
    except click.ClickException as exc:
        raise ShellUsageError(f"{name}: {exc.format_message()}") from None


def help_text(spec: click.Command, name: str) -> str:
    """The usage text click generates for ``spec``, as its batch twin would show it."""
    width = min(shutil.get_terminal_size((80, 24)).columns, 100) - 2  # rendered as is: never rewrapped
    settings = {"max_content_width": width, "terminal_width": width, **spec.context_settings}
    ctx = click.Context(spec, info_name=name, **settings)
    return spec.get_help(ctx)
