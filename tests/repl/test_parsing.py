import click
import pytest

from precision_tool.repl.parsing import ShellUsageError, help_text, parse_args, split_commands, split_words


def test_split_commands_on_unquoted_semicolons():
    assert split_commands('ls; ni "a;b" ;; pt \'x;y\'') == ["ls", 'ni "a;b"', "pt 'x;y'"]
    assert split_commands(r"ni a\;b; ls") == [r"ni a\;b", "ls"]
    assert split_commands("   ") == []


def test_split_words_honours_quotes():
    assert split_words('ni "block 1/MatMul" -s 2') == ["ni", "block 1/MatMul", "-s", "2"]


def test_unclosed_quote_is_one_line_error():
    with pytest.raises(ShellUsageError, match="no closing quotation"):
        split_words('ni "abc')


SPEC = click.Command("demo", add_help_option=False, params=[
    click.Argument(["op"]),
    click.Option(["-l", "--limit"], type=click.IntRange(min=0), default=3),
])


def test_parse_args_returns_params_with_defaults():
    assert parse_args(SPEC, "demo", ["x"]) == {"op": "x", "limit": 3}
    assert parse_args(SPEC, "demo", ["x", "-l", "7"]) == {"op": "x", "limit": 7}


@pytest.mark.parametrize("args, message", [
    ([], "demo: Missing argument 'OP'."),
    (["x", "-l", "-1"], "demo: Invalid value for '-l' / '--limit': -1 is not in the range x>=0."),
])
def test_click_errors_become_one_line(args, message):
    with pytest.raises(ShellUsageError) as error:
        parse_args(SPEC, "demo", args)
    assert str(error.value) == message


def test_unknown_option_is_one_line():
    with pytest.raises(ShellUsageError) as error:
        parse_args(SPEC, "demo", ["x", "--nope"])
    assert str(error.value).startswith("demo: No such option") and "--nope" in str(error.value)
    assert "\n" not in str(error.value)


def test_help_text_comes_from_the_spec():
    text = help_text(SPEC, "demo")
    assert text.startswith("Usage: demo [OPTIONS] OP")
    assert "-l, --limit" in text
