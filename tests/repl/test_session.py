"""Session state, roles, the op index and where history lives."""

from pathlib import Path

import pytest

from precision_tool.errors import InputError
from precision_tool.repl import app
from precision_tool.repl.session import MissingDumpError, ShellSession, _assign, _role_of, build_index

from .shell_fakes import FakeDump, sample_dumps


def test_index_lists_names_steps_slots_types_and_passes(session):
    index = session.index("target")
    assert index.names == ["fused/MatMulRelu", "fc2/MatMul"]
    assert index.steps[("fc2/MatMul", "backward")] == [0, 1]
    assert index.first_step == 0
    assert index.slots["fc2/MatMul"] == ("input_0", "input_1", "output_0")
    assert index.types == ["FusedMatMulRelu", "MatMul"] and index.passes == ["MatMulReluFusionPass"]


def test_two_sessions_share_nothing():
    first, second = ShellSession(sample_dumps()), ShellSession(sample_dumps())
    first.compare()
    assert first.comparison is not None and second.comparison is None


def test_comparison_is_computed_once_and_cached():
    calls = []
    session = ShellSession(sample_dumps(), compare_fn=lambda g, t: calls.append(1) or object())
    report = session.compare()
    assert session.compare() is report and calls == [1]
    assert session.compare(refresh=True) is not report and calls == [1, 1]


def test_missing_role_is_one_line():
    session = ShellSession({"target": FakeDump("t.h5", "target")})
    with pytest.raises(MissingDumpError, match="^fu needs a golden dump; start the shell with --golden FILE"):
        session.dump("golden", "fu")


def test_role_comes_from_metadata_and_duplicates_are_refused():
    dumps = {}
    _assign(dumps, _role_of(FakeDump("g.h5", "golden"), "g.h5"), FakeDump("g.h5", "golden"), "g.h5")
    with pytest.raises(InputError, match="^g2.h5: a second golden dump .*give one with --golden"):
        _assign(dumps, "golden", FakeDump("g2.h5", "golden"), "g2.h5")
    with pytest.raises(InputError, match="metadata names no role"):
        _role_of(FakeDump("x.h5", "mystery"), "x.h5")


def test_describe_and_primary_role(session):
    assert session.describe() == [("golden", "golden.h5"), ("target", "target.h5")]
    assert session.primary_role == "target"
    assert ShellSession({}).primary_role is None and ShellSession({}).op_names() == []


def test_close_closes_every_dump():
    dumps = sample_dumps()
    with ShellSession(dumps):
        pass
    assert all(d.closed for d in dumps.values())


def test_history_lives_under_xdg_data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert app.history_path() == tmp_path / "data" / "precision-tool" / "history"
    history = app.create_history()
    history.append_string("ls -t MatMul")
    assert (tmp_path / "data" / "precision-tool" / "history").read_text().strip().endswith("+ls -t MatMul")


def test_history_falls_back_to_local_share(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert app.history_path() == Path(tmp_path) / ".local" / "share" / "precision-tool" / "history"


def test_build_index_of_nothing():
    index = build_index([])
    assert index.names == [] and index.first_step is None


def test_a_selection_gets_a_comparison_of_its_own_cached_beside_the_whole_runs():
    from precision_tool.commands.sources import compare_options

    calls = []
    session = ShellSession(sample_dumps(), compare_fn=lambda g, t, options=None: calls.append(options) or object())
    whole = session.compare()
    steps = compare_options(frozenset({0}))
    first = session.compare(steps)
    assert first is not whole and session.compare(compare_options(frozenset({0}), jobs=4)) is first  # jobs: same
    assert session.comparison is whole and calls == [None, steps]
