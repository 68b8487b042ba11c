"""`precision-tool demo` finds its planted fault; the sample dumps work in the shell."""

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "sample_dumps"
SAMPLE_FILES = ["golden.h5", "npu.h5", "overflow.h5", "fusion_off.h5"]


def test_demo_diagnoses_the_fused_layer_norm(run_cli, tmp_path):
    result = run_cli("demo", "--workdir", tmp_path, "--steps", "2")
    assert result.status == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "Verdict: fusion" in out
    assert "Op: norm/LayerNormFused (step 0, forward, LayerNormFused)" in out
    assert 'switch off LayerNormFusionPass: put {"GraphFusion": {"LayerNormFusionPass": "off"}}' in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SAMPLE_FILES)


def test_the_commands_to_explore_it_paste_as_they_are(run_cli, tmp_path):
    """Each on one line, whatever the width, its paths quoted: a work directory with spaces used to give
    commands wrapped at 80 columns, their paths split at the spaces."""
    import shlex

    workdir = tmp_path / "d ü 2"
    result = run_cli("demo", "--workdir", workdir, "--steps", "2")
    assert result.status == 0, result.stderr
    lines = result.stdout.splitlines()
    shell, compare = lines[lines.index("Explore it:") + 1:lines.index("Explore it:") + 3]
    assert shlex.split(shell) == ["precision-tool", "shell", *(str(workdir / name) for name in SAMPLE_FILES)]
    assert shlex.split(compare) == ["precision-tool", "compare", str(workdir / "golden.h5"), str(workdir / "npu.h5"),
                                    "--all"]


def test_sample_dumps_are_small_and_hold_the_demo_fault(run_cli):
    paths = [SAMPLES / name for name in SAMPLE_FILES]
    assert sum(p.stat().st_size for p in paths) < 2_000_000
    result = run_cli("diagnose", paths[0], paths[1], "--fusion-off", paths[3], "--format", "json")
    assert result.status == 0, result.stderr
    import json

    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["op"], verdict["class"], verdict["step"]) == ("norm/LayerNormFused", "fusion", 0)


def test_shell_opens_the_sample_dumps_by_role(run_cli):
    result = run_cli("shell", *(SAMPLES / name for name in SAMPLE_FILES), "-c", "fu; of -l 1")
    assert result.status == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "LayerNormFusionPass" in out and "norm/LayerNormFused" in out


def test_a_second_demo_in_the_same_workdir_says_how_to_go_on(run_cli, tmp_path):
    (tmp_path / "golden.h5").write_bytes(b"an earlier demo's")
    result = run_cli("demo", "--workdir", tmp_path, "--steps", "1")
    assert (result.status, result.stdout) == (2, "")
    assert result.stderr == (f"precision-tool: error: {tmp_path}: golden.h5 already exists there, under the names "
                             "the demo writes; --force replaces it, or give another --workdir\n")


def _digests(folder: Path) -> dict:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_demo_replacing_dumps_stopped_midway_leaves_the_earlier_four_as_they_were(run_cli, tmp_path):
    import pytest

    from precision_tool.collect.demo import collect_demo

    assert run_cli("demo", "--workdir", tmp_path, "--steps", "2").status == 0
    before = _digests(tmp_path)

    def stop_after_two(run):
        if run.role == "target":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect_demo(tmp_path, steps=3, on_run=stop_after_two)
    assert _digests(tmp_path) == before  # (golden.h5 and npu.h5 were replaced, beside the earlier two)
    assert sorted(p.name for p in (tmp_path / ".demo-next").iterdir()) == ["golden.h5", "npu.h5"]
    runs = collect_demo(tmp_path, steps=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fusion_off.h5", "golden.h5", "npu.h5", "overflow.h5"]
    assert [run.path for run in runs] == [tmp_path / n for n in ("golden.h5", "npu.h5", "overflow.h5", "fusion_off.h5")]
    after = _digests(tmp_path)
    assert all(after[name] != before[name] for name in before)
    assert run_cli("inspect", tmp_path / "npu.h5").status == 0
