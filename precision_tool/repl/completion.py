"""The pure completion engine: what to suggest at the end of a partly typed line.

`suggest` looks at the text before the cursor and returns typed suggestions
(what kind of word is expected); `complete` turns them into concrete
candidates from a `Catalog` of names. Neither imports prompt_toolkit:
`precision_tool.repl.completer` is the thin adapter, and the tests call these
directly.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import click

from precision_tool.commands.options import NameType, StepType
from precision_tool.repl.parsing import split_commands
from precision_tool.repl.tensors import SIDES

# What a word names (an op, a tensor, a type, a pass, a step) is read from the type of the parameter it fills
# (`NameType`, `StepType` in commands/options.py): there is no table of which command takes what.
MAX_COMPLETIONS = 200


@dataclass(frozen=True)
class CommandName:
    prefix: str


@dataclass(frozen=True)
class OptionName:
    command: str
    prefix: str


@dataclass(frozen=True)
class OptionValue:
    choices: tuple[str, ...]
    prefix: str


@dataclass(frozen=True)
class OpName:
    prefix: str


@dataclass(frozen=True)
class TypeName:
    prefix: str


@dataclass(frozen=True)
class PassName:
    prefix: str


@dataclass(frozen=True)
class TensorName:
    prefix: str


@dataclass(frozen=True)
class StepName:
    prefix: str


@dataclass(frozen=True)
class Candidate:
    """One completion: replace the last ``len(prefix)`` characters with ``text``."""

    text: str
    replace: int  # characters before the cursor to replace
    meta: str = ""


@dataclass
class Catalog:
    """The names completion draws from."""

    commands: dict[str, click.Command | None]  # name -> option spec (None: takes nothing)
    ops: list[str] = field(default_factory=list)
    slots: dict[str, tuple[str, ...]] = field(default_factory=dict)
    types: list[str] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


def suggest(text: str, commands: dict[str, click.Command | None]) -> list:
    """What kind of word the cursor is in: a command, an option, an op, a tensor, a value."""
    segment = split_commands(text + "\0")[-1][:-1] if text.strip() else ""
    words, current = _words(segment)
    if not words:
        return [CommandName(current)]
    name = words[0]
    if name == "help":
        return [CommandName(current)] if len(words) == 1 else []
    spec = commands.get(name)
    if spec is None:
        return []
    if current.startswith("-"):
        return [OptionName(name, current)]
    option = _option(spec, words[-1]) if len(words) > 1 else None
    if option is not None and not option.is_flag:
        return _option_value(option, current)
    arguments = [p for p in spec.params if isinstance(p, click.Argument)]
    position = _positional_index(spec, words[1:])
    named = _named(arguments[position].type, current) if position < len(arguments) else []
    if named:
        return named
    return [OptionName(name, current)] if _options(spec) else []


def _positional_index(spec: click.Command, words: list[str]) -> int:
    """How many positional arguments the finished ``words`` (after the command name) filled."""
    count, value_next = 0, False
    for word in words:
        if value_next:
            value_next = False
        elif word.startswith("-") and len(word) > 1:
            option = _option(spec, word.split("=", 1)[0])
            value_next = option is not None and not option.is_flag and "=" not in word
        else:
            count += 1
    return count


def complete(text: str, catalog: Catalog) -> list[Candidate]:
    """Concrete candidates for the end of ``text``: prefix matches first, then substring matches."""
    candidates: list[Candidate] = []
    for suggestion in suggest(text, catalog.commands):
        candidates.extend(_MATCHERS[type(suggestion)](suggestion, catalog))
    return candidates[:MAX_COMPLETIONS]


def _words(segment: str) -> tuple[list[str], str]:
    """The finished words and the word being typed ('' after a space)."""
    try:
        lexer = shlex.shlex(segment, posix=True, punctuation_chars=False)
        lexer.whitespace_split = True
        lexer.commenters = ""
        words = list(lexer)
    except ValueError:  # an open quote: the rest is the word being typed
        words = segment.split()
    if not segment or segment[-1].isspace():
        return words, ""
    return words[:-1], (words[-1] if words else "")


def _options(spec: click.Command) -> list[click.Option]:
    return [p for p in spec.params if isinstance(p, click.Option)]


def _option(spec: click.Command, word: str) -> click.Option | None:
    for option in _options(spec):
        if word in option.opts or word in option.secondary_opts:
            return option
    return None


def _option_value(option: click.Option, current: str) -> list:
    if isinstance(option.type, click.Choice):
        return [OptionValue(tuple(str(c) for c in option.type.choices), current)]
    return _named(option.type, current)


def _named(kind: click.ParamType, current: str) -> list:
    """What a parameter of `NameType` or `StepType` names, as a suggestion (none for other types)."""
    if not isinstance(kind, (NameType, StepType)):
        return []
    return {"op": [OpName(current)], "tensor": [TensorName(current)], "type": [TypeName(current)],
            "pass": [PassName(current)], "step": [StepName(current)]}.get(kind.kind, [])


def _ranked(prefix: str, names, meta: str) -> list[Candidate]:
    """Names starting with ``prefix``, then names holding it (case-insensitive)."""
    low = prefix.lower()
    starts = [n for n in names if n.lower().startswith(low)]
    seen = set(starts)
    inside = [n for n in names if n not in seen and low in n.lower()] if low else []
    return [Candidate(n, len(prefix), meta) for n in starts + inside]


BUILTIN_SUMMARIES = {"help": "list the commands, or one command's options", "exit": "leave the shell",
                     "quit": "leave the shell"}
META_WIDTH = 48  # the completion menu's description column


def command_summary(spec: click.Command | None) -> str:
    """What a command does, in the completion menu: its help's first line, cut to the menu's width."""
    text = (spec.short_help or (spec.help or "").strip().split("\n")[0]) if spec is not None else ""
    return text if len(text) <= META_WIDTH else text[:META_WIDTH - 1].rstrip() + "…"


def _command_names(s: CommandName, catalog: Catalog) -> list[Candidate]:
    names = {**{name: command_summary(spec) or "command" for name, spec in catalog.commands.items()},
             **BUILTIN_SUMMARIES}
    return [Candidate(n, len(s.prefix), meta) for n, meta in names.items() if n.startswith(s.prefix)]


def _option_names(s: OptionName, catalog: Catalog) -> list[Candidate]:
    spec = catalog.commands.get(s.command)
    flags = [o for option in _options(spec) for o in option.opts] if spec else []
    return [Candidate(f, len(s.prefix), "option") for f in flags if f.startswith(s.prefix)]


def _option_values(s: OptionValue, catalog: Catalog) -> list[Candidate]:
    return [Candidate(c, len(s.prefix), "value") for c in s.choices if c.startswith(s.prefix)]


def _tensor_names(s: TensorName, catalog: Catalog) -> list[Candidate]:
    side, rest = "", s.prefix
    for name in SIDES:
        if rest.startswith(name + ":"):
            side, rest = name + ":", rest[len(name) + 1:]
            break
    op, _, slot = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if op and op in catalog.slots:  # the op is typed in full: offer its slots
        return [Candidate(f"{side}{op}:{t}", len(s.prefix), "tensor")
                for t in catalog.slots[op] if t.startswith(slot)]
    sides = [Candidate(f"{n}:", len(s.prefix), "side") for n in SIDES if not side and n.startswith(rest)]
    ops = [Candidate(side + c.text + ":", len(s.prefix), "op") for c in _ranked(rest, catalog.ops, "op")]
    return sides + ops


_MATCHERS = {
    CommandName: _command_names,
    OptionName: _option_names,
    OptionValue: _option_values,
    OpName: lambda s, c: _ranked(s.prefix, c.ops, "op"),
    TypeName: lambda s, c: _ranked(s.prefix, c.types, "type"),
    PassName: lambda s, c: _ranked(s.prefix, c.passes, "pass"),
    TensorName: _tensor_names,
    StepName: lambda s, c: [Candidate(str(n), len(s.prefix), "step") for n in c.steps if str(n).startswith(s.prefix)],
}
