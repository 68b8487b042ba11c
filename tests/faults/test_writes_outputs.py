"""Outputs never destroy an input, and a failed write leaves the old output as it was."""

import os

import pytest

from tests.faults.writes_helpers import assert_outcome, build, digests, no_leftovers, run_limited


@pytest.fixture
def dumps(tmp_path):
    golden = build(tmp_path / "golden.h5", role="golden")
    target = build(tmp_path / "target.h5", noise=0.6)
    baseline = tmp_path / "baseline.json"
    return golden, target, baseline


def _baseline(run_cli, golden, target, baseline):
    assert run_cli("baseline", golden, target, "-o", baseline).status == 0
    return baseline


@pytest.mark.parametrize("args, victim", [
    (("compare", "{g}", "{t}", "-o", "{g}"), "{g}"),
    (("compare", "{g}", "{t}", "--format", "csv", "-o", "{t}"), "{t}"),
    (("compare", "{g}", "{t}", "--format", "json", "-o", "{g}"), "{g}"),
    (("compare", "{g}", "{t}", "--plot", "{svg}"), "{svg}"),  # a hard link to the golden dump
    (("check", "{g}", "{t}", "--junit", "{t}"), "{t}"),
    (("check", "{g}", "{t}", "--baseline", "{b}", "--junit", "{b}"), "{b}"),
    (("baseline", "{g}", "{t}", "-o", "{g}"), "{g}"),
    (("baseline", "{g}", "{t}", "-o", "{link}"), "{link}"),  # a symbolic link to the target dump
], ids=["compare-table", "compare-csv", "compare-json", "compare-plot-hardlink", "check-junit",
        "check-junit-over-baseline", "baseline", "baseline-symlink"])
def test_an_output_over_an_input_is_refused(run_cli, dumps, tmp_path, args, victim):
    golden, target, baseline = dumps
    _baseline(run_cli, golden, target, baseline)
    os.link(golden, tmp_path / "golden.svg")
    os.symlink(target, tmp_path / "target-link.json")
    names = {"g": golden, "t": target, "b": baseline, "svg": tmp_path / "golden.svg",
             "link": tmp_path / "target-link.json"}
    before = digests(golden, target, baseline)
    result = run_cli(*(a.format(**names) for a in args))
    assert_outcome(result.status, result.stderr, 2, before, says="is an input of this command")
    assert victim.format(**names) in result.stderr
    assert no_leftovers(tmp_path) == []


def test_two_options_writing_one_file_are_refused(run_cli, dumps, tmp_path):
    golden, target, _ = dumps
    before = digests(golden, target)
    result = run_cli("compare", golden, target, "-o", tmp_path / "out.svg", "--plot", tmp_path / "out.svg")
    assert_outcome(result.status, result.stderr, 2, before, says="both write")
    assert not (tmp_path / "out.svg").exists()


def test_collect_refuses_to_write_over_its_fusion_switch_file(run_cli, tmp_path):
    switch = tmp_path / "fusion.json"
    switch.write_text('{"Switch": {"GraphFusion": {"ALL": "off"}}}')
    before = digests(switch)
    for extra in ((), ("--force",)):
        result = run_cli("collect", "mlp", "--steps", "1", "--fusion-switch", switch, "-o", switch, *extra)
        assert_outcome(result.status, result.stderr, 2, before, says=str(switch))
    assert no_leftovers(tmp_path) == []


def test_collect_refuses_to_write_over_its_model_file(run_cli, tmp_path):
    model = tmp_path / "tiny.py"
    model.write_text(TINY_MODEL)
    before = digests(model)
    result = run_cli("collect", f"{model}:build", "--steps", "1", "-o", model, "--force")
    assert_outcome(result.status, result.stderr, 2, before, says="is an input of this command")
    assert run_cli("collect", f"{model}:build", "--steps", "1", "-o", tmp_path / "tiny.h5").status == 0


TINY_MODEL = '''
from precision_tool.engine.layers import DataSpec, Dense, Model


class Tiny(Model):
    def __init__(self, rng):
        self.data = DataSpec("features", (6,), "regression", output_dim=1)
        self.out = Dense(6, 1, rng=rng)

    def forward(self, x):
        return self.out(x)


def build(rng):
    return Tiny(rng)
'''


@pytest.mark.parametrize("args, name", [
    (("compare", "{g}", "{t}", "--format", "csv", "-o", "{out}"), "out.csv"),
    (("compare", "{g}", "{t}", "--format", "json", "-o", "{out}"), "out.json"),
    (("compare", "{g}", "{t}", "--all", "-o", "{out}"), "out.txt"),
    (("compare", "{g}", "{t}", "--plot", "{out}"), "out.svg"),
    (("check", "{g}", "{t}", "--min-cosine", "-1", "--junit", "{out}"), "out.xml"),
    (("baseline", "{g}", "{t}", "-o", "{out}"), "out.json"),
], ids=["csv", "json", "table", "plot", "junit", "baseline"])
def test_a_full_disk_keeps_the_previous_output(dumps, tmp_path, args, name):
    golden, target, _ = dumps
    out = tmp_path / name
    out.write_text("the previous output\n")
    before = digests(golden, target, out)
    names = {"g": golden, "t": target, "out": out}
    result = run_limited(*(a.format(**names) for a in args), max_file_bytes=64)
    assert_outcome(result.returncode, result.stderr, 2, before, says=f"{out}: cannot write: file too large")
    assert no_leftovers(tmp_path) == []


def test_an_output_replaces_the_old_one_whole(run_cli, dumps, tmp_path):
    golden, target, _ = dumps
    out = tmp_path / "out.csv"
    out.write_text("old\n")
    os.chmod(out, 0o640)
    before = digests(golden, target)
    result = run_cli("compare", golden, target, "--format", "csv", "-o", out)
    assert_outcome(result.status, result.stderr, 0, before, says=f"wrote {out}")
    assert out.read_text().startswith("status,step") and oct(out.stat().st_mode & 0o777) == oct(0o640)
    assert no_leftovers(tmp_path) == []
