"""The pure completion engine, without prompt_toolkit."""

import click
import pytest

from precision_tool.repl.commands import build_commands
from precision_tool.repl.completion import (Catalog, CommandName, OpName, OptionName, OptionValue, TensorName,
                                            TypeName, complete, suggest)

SPECS = {name: command.spec for name, command in build_commands().items()}
CATALOG = Catalog(SPECS, ops=["fc1/MatMul", "act/Relu", "fc2/MatMul", "block1/attn/Softmax"],
                  slots={"fc1/MatMul": ("input_0", "input_1", "output_0"), "act/Relu": ("input_0", "output_0")},
                  types=["MatMul", "Relu", "Softmax"], passes=["MatMulReluFusionPass"])


def texts(line):
    return [c.text for c in complete(line, CATALOG)]


@pytest.mark.parametrize("line, expected", [
    ("", [CommandName("")]),
    ("v", [CommandName("v")]),
    ("ls; n", [CommandName("n")]),
    ("ls -", [OptionName("ls", "-")]),
    ("ls -t Mat", [TypeName("Mat")]),
    ("ls -n ", [OpName("")]),
    ("ni fc", [OpName("fc")]),
    ("rerun --device ", [OptionValue(("npu", "golden"), "")]),
    ("ni x -d b", [OptionValue(("forward", "backward", "optimizer"), "b")]),
    ("pt golden:fc1", [TensorName("golden:fc1")]),
    ("cp a:output_0 ", [TensorName("")]),
    ("help ", [CommandName("")]),
    ("frobnicate ", []),
    ("cp -p ", []),
])
def test_suggest(line, expected):
    assert suggest(line, SPECS) == expected


def test_commands_complete_by_prefix():
    assert texts("r") == ["rerun"]
    assert texts("e") == ["exit"]
    assert set(texts("")) >= {"ac", "vcs", "ls", "ni", "pt", "cp", "of", "fu", "rerun", "help", "exit", "quit"}


def test_options_come_from_the_spec():
    assert texts("cp -") == ["-p", "--print", "-al", "--atol", "-rl", "--rtol", "--format"]
    assert "--limit" in texts("vcs --")


def test_op_names_by_prefix_then_substring():
    assert texts("ni fc") == ["fc1/MatMul", "fc2/MatMul"]
    assert texts("ni MatMul") == ["fc1/MatMul", "fc2/MatMul"]
    assert texts("ni soft") == ["block1/attn/Softmax"]


def test_tensor_names_offer_sides_ops_then_slots():
    assert texts("pt g") == ["golden:"]
    assert texts("pt golden:ac") == ["golden:act/Relu:"]
    assert texts("pt fc1/MatMul:") == ["fc1/MatMul:input_0", "fc1/MatMul:input_1", "fc1/MatMul:output_0"]
    assert texts("cp act/Relu:o") == ["act/Relu:output_0"]


def test_candidates_replace_the_word_being_typed():
    [candidate] = complete("pt golden:act/Relu:o", CATALOG)
    assert candidate.replace == len("golden:act/Relu:o")
    assert candidate.text == "golden:act/Relu:output_0"


def test_types_and_passes():
    assert texts("ls -t Re") == ["Relu"]
    assert texts("ls -f Fus") == ["MatMulReluFusionPass"]


def test_open_quote_does_not_break_completion():
    assert isinstance(texts('ni "fc'), list)


def test_the_menu_says_what_each_command_does():
    metas = {c.text: c.meta for c in complete("", CATALOG)}
    assert metas["ac"].startswith("Auto check") and metas["exit"] == "leave the shell"
    assert all(meta and meta != "command" and len(meta) <= 48 for meta in metas.values())


def test_what_an_argument_names_comes_from_the_commands_own_parameters():
    from precision_tool.commands.options import NameType

    spec = {**SPECS, "mine": click.Command("mine", params=[click.Argument(["x"], type=NameType("tensor"))])}
    assert suggest("mine fc", spec) == [TensorName("fc")]
    plain = {**SPECS, "plain": click.Command("plain", params=[click.Argument(["x"])])}
    assert suggest("plain fc", plain) == []
