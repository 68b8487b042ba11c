"""`precision-tool zoom MODEL`: statistics first, full tensors of the divergent region only, the same verdict."""

from __future__ import annotations

import json

import pytest

SENSOR = ("sensor", "--precision-mode", "force_fp16", "--steps", "3")


def _verdict(run_cli, golden, target) -> tuple:
    result = run_cli("diagnose", golden, target, "--format", "json")
    assert result.status == 0, result.stderr
    verdict = json.loads(result.stdout)["verdict"]
    return verdict["op"], verdict["class"], verdict["step"], verdict["direction"]


def test_zoom_finds_the_full_dump_verdict_in_smaller_dumps(run_cli, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    for role, device in (("golden", ["--device", "golden"]), ("target", [])):
        argv = ["collect", *SENSOR, *device, "-o", full / f"{role}.h5"]
        if role == "golden":
            argv.remove("--precision-mode"), argv.remove("force_fp16")
        assert run_cli(*argv).status == 0
    expected = _verdict(run_cli, full / "golden.h5", full / "target.h5")
    assert expected == ("norm/LayerNormFused", "fusion", 0, "forward")

    out = tmp_path / "zoom"
    result = run_cli("zoom", *SENSOR, "-o", out)
    assert result.status == 0, result.stderr
    names = ["stats-golden.h5", "stats-target.h5", "zoom-golden.h5", "zoom-target.h5"]
    assert sorted(p.name for p in out.iterdir()) == names
    text = " ".join(result.stdout.split())
    assert "Zoomed into step 0, every op in module norm (forward only): first divergent op norm/LayerNormFused" in text
    assert "Verdict: fusion" in text and "Op: norm/LayerNormFused (step 0, forward, LayerNormFused)" in text
    assert "sizes: statistics" in text and "+ region tensors" in text
    assert _verdict(run_cli, out / "zoom-golden.h5", out / "zoom-target.h5") == expected
    zoomed = sum((out / name).stat().st_size for name in names)
    assert zoomed < sum(p.stat().st_size for p in full.iterdir())
    inspect = json.loads(run_cli("inspect", out / "zoom-target.h5", "--format", "json").stdout)
    assert inspect["metadata"]["selection"] == {"steps": [0], "ops": [], "modules": ["norm"], "op_types": None,
                                                "backward": False}
    assert inspect["command"] == (f"precision-tool collect sensor --output {out / 'zoom-target.h5'} --device npu "
                                  "--mode dump --steps 3 --precision-mode force_fp16 --dump-steps 0 --modules norm "
                                  "--no-backward")  # collect's own line: the phase-2 run parsed the printed command


def test_zoom_stops_after_phase_one_when_nothing_diverges(run_cli, tmp_path):
    result = run_cli("zoom", "mlp", "--steps", "1", "-o", tmp_path / "z")
    assert result.status == 0, result.stderr
    assert "nothing to zoom into" in " ".join(result.stdout.split())
    assert sorted(p.name for p in (tmp_path / "z").iterdir()) == ["stats-golden.h5", "stats-target.h5"]


@pytest.mark.parametrize("selection", [["--dump-steps", "5"], ["--op-types", "Nope"]])
def test_a_selection_that_records_nothing_is_no_all_clear(run_cli, tmp_path, selection):
    """Statistics of no op (steps beyond the run's, a type it has not) compare nothing: that is an input error,
    not "no op diverges ... nothing to zoom into" with exit 0."""
    result = run_cli("zoom", "sensor", "--steps", "2", "--precision-mode", "force_fp16", *selection,
                     "-o", tmp_path / "z")
    assert result.status == 2 and "nothing to zoom into" not in result.stdout
    assert result.stderr == (f"precision-tool: error: {tmp_path / 'z' / 'stats-target.h5'}: no op of the statistics "
                             f"phase pairs with one of golden's ({tmp_path / 'z' / 'stats-golden.h5'}): nothing to "
                             "zoom into; does the selection (--dump-steps, --ops, --modules, --op-types) pick ops "
                             "the run has?\n")


@pytest.mark.parametrize("args, message", [
    (["sensor", "--device", "npu"], "No such option '--device'"),
    (["sensor", "--steps", "0"], "Invalid value for '--steps'"),
    (["nosuchmodel"], "unknown model"),
    ([], "give MODEL, or a script command after -- (see"),  # (it said "not both")
    (["sensor", "--", "python", "x.py"], "give MODEL, or a script command after --, not both"),
    (["--steps", "2", "--", "python", "x.py"], "--steps is a collect option"),
    (["sensor", "--fusion-switch", "nofile.json"], "nofile.json"),
])
def test_bad_input_is_one_line_and_writes_nothing(run_cli, tmp_path, args, message):
    result = run_cli("zoom", "-o", tmp_path / "z", *args)
    assert result.status == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "z").exists()


def test_existing_dumps_are_kept_without_force(run_cli, tmp_path):
    (tmp_path / "zoom-target.h5").write_bytes(b"keep")
    result = run_cli("zoom", "sensor", "-o", tmp_path)
    assert result.status == 2 and "zoom-target.h5: already exists" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoom-target.h5"]
