"""`dump`'s op, module, type and step filters, and what `precision-tool zoom` sets through the environment."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from precision_tool.collect import zoom_env as zoom  # noqa: E402
from .torch_helpers import make_mlp, train  # noqa: E402


def _names(path, step=0):
    with open_dump(path) as dump:
        return [(op.name, op.direction) for op in dump.ops(step=step)], dump.metadata


def test_a_module_glob_records_the_ops_inside_and_the_module_call(tmp_path):
    with ptt.dump(tmp_path / "m.h5", modules=["MLP/fc2"], backward=False):
        train(make_mlp())
    names, metadata = _names(tmp_path / "m.h5")
    assert names == [("MLP/fc2/aten.addmm_0", "forward"), ("MLP/fc2", "forward")]
    assert metadata["selection"] == {"steps": None, "ops": [], "modules": ["MLP/fc2"], "op_types": None,
                                     "backward": False}


@pytest.mark.parametrize("steps, chosen", [("10", [10]), ("0,5-7", [0, 5, 6, 7]), (2, [2]), (range(3), [0, 1, 2]),
                                           ([4, 1], [1, 4]), ("all", None)])
def test_steps_take_the_forms_collect_takes(steps, chosen, tmp_path):
    """A string is read as `collect --dump-steps` reads it ("10" used to be steps 1 and 0), a number as one step."""
    selected = ptt.dump(tmp_path / "s.h5", steps=steps).steps
    assert (sorted(selected) if selected is not None else None) == chosen


@pytest.mark.parametrize("steps", [[1.5], ["a"], [True], 1.5, object()])
def test_steps_that_are_not_step_numbers_are_refused(steps, tmp_path):
    from precision_tool.errors import ConfigError

    with pytest.raises(ConfigError, match="bad step selection .*; expected whole step numbers, or step numbers and "
                                          "ranges"):
        ptt.dump(tmp_path / "s.h5", steps=steps)
    assert not (tmp_path / "s.h5").exists()


def test_op_globs_and_module_globs_add_up_and_types_narrow(tmp_path):
    with ptt.dump(tmp_path / "o.h5", ops=["MLP/act/*"], modules=["MLP/fc2"], op_types=["aten.relu", "aten.addmm"],
                  steps=[1]):
        train(make_mlp(), steps=2)
    names, metadata = _names(tmp_path / "o.h5", step=1)
    assert names == [("MLP/act/aten.relu_0", "forward"), ("MLP/fc2/aten.addmm_0", "forward")]
    assert metadata["selection"]["steps"] == [1] and metadata["steps_filter"] == [1]


def test_an_op_type_without_its_namespace_is_an_aten_type(tmp_path):
    """op_types=["relu"] recorded nothing, silently: an op's name says "aten.relu_0", its type "aten.relu"."""
    with ptt.dump(tmp_path / "t.h5", ops=["MLP/*"], op_types="relu,aten.addmm", backward=False):
        train(make_mlp())
    names, metadata = _names(tmp_path / "t.h5")
    assert names == [("MLP/fc1/aten.addmm_0", "forward"), ("MLP/act/aten.relu_0", "forward"),
                     ("MLP/fc2/aten.addmm_0", "forward")]
    assert metadata["selection"]["op_types"] == ["aten.addmm", "aten.relu"]


def test_module_records_stay_switchable_with_a_boolean(tmp_path):
    with ptt.dump(tmp_path / "n.h5", modules=False, ops=["MLP/fc2/*"], backward=False):
        train(make_mlp())
    assert _names(tmp_path / "n.h5")[0] == [("MLP/fc2/aten.addmm_0", "forward")]


def test_zoom_environment_overrides_path_mode_role_and_filters(tmp_path, monkeypatch):
    assert ptt.zoom_role() is None
    monkeypatch.setenv(zoom.PHASE, "tensors")
    monkeypatch.setenv(zoom.ROLE, "target")
    monkeypatch.setenv(zoom.DIR, str(tmp_path))
    monkeypatch.setenv(zoom.REGION, json.dumps({"steps": [0], "ops": [], "modules": ["MLP/fc2"], "backward": False}))
    assert ptt.zoom_role() == "target"
    with ptt.dump(tmp_path / "ignored.h5", mode="stats"):
        train(make_mlp())
    assert not (tmp_path / "ignored.h5").exists()
    names, metadata = _names(tmp_path / "zoom-target.h5")
    assert names == [("MLP/fc2/aten.addmm_0", "forward"), ("MLP/fc2", "forward")]
    assert (metadata["mode"], metadata["role"]) == ("dump", "target")
    monkeypatch.setenv(zoom.PHASE, "stats")
    monkeypatch.setenv(zoom.ROLE, "golden")
    with ptt.dump(tmp_path / "ignored.h5", ops=["nothing"]):  # phase 1 keeps the script's own filters
        train(make_mlp())
    with open_dump(tmp_path / "stats-golden.h5") as dump:
        assert (dump.mode, dump.role, dump.ops()) == ("stats", "golden", [])


@pytest.mark.parametrize("environ, message", [
    ({zoom.PHASE: "both", zoom.ROLE: "golden", zoom.DIR: "d"}, "phases: stats, tensors"),
    ({zoom.PHASE: "stats", zoom.DIR: "d"}, "needs PRECISION_TOOL_ZOOM_ROLE"),
    ({zoom.PHASE: "tensors", zoom.ROLE: "golden", zoom.DIR: "d", zoom.REGION: "{"}, "is not JSON"),
])
def test_a_malformed_zoom_environment_is_refused(environ, message):
    with pytest.raises(ValueError, match=message):
        zoom.zoom_settings(environ)
