"""An invalid operation whose NaN a saturation mode wrote as a number: reported as what it is."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.analysis import overflow_report  # noqa: E402
from precision_tool.analysis.attribution import makes_nan_hidden  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402


def _run(path, values, overflow_mode):
    x = torch.tensor(values)
    with ptt.simulate_npu("force_fp16", overflow_mode), ptt.dump(path, mode="dump"):
        torch.sqrt(x)
        torch.exp(x * 8)
        ptt.step()


def test_a_square_root_of_negatives_saturated_to_zero_is_said_to_make_nan(tmp_path):
    _run(tmp_path / "s.h5", [-4.0, 1.0, 4.0], "saturation")
    with open_dump(tmp_path / "s.h5") as dump:
        sqrt, exp = [r for r in dump.ops() if r.type in ("aten.sqrt", "aten.exp")]
        assert sqrt.overflow and sqrt.tensor("output_0").stats.nan == 0 and sqrt.tensor("output_0").stats.min == 0
        assert makes_nan_hidden(dump, sqrt) and not makes_nan_hidden(dump, exp)  # exp(32) saturates: no NaN
        entry = overflow_report(dump).entries[0]
        assert entry.name == sqrt.name and entry.hint == (
            "aten.sqrt makes NaN from these finite inputs (an invalid operation: the square root or log of a "
            "negative value, 0/0), which the saturation mode wrote as numbers: check its inputs' range")
        assert entry.invalid and not overflow_report(dump).entries[1].invalid


def test_the_shell_says_a_hidden_nan_was_written_as_numbers(tmp_path):
    # it said "the overflow is inside the kernel" above the hint that the op makes NaN
    from precision_tool.render import shell_views
    from tests.repl.test_views import text

    _run(tmp_path / "s.h5", [-4.0, 1.0, 4.0], "saturation")
    with open_dump(tmp_path / "s.h5") as dump:
        out = " ".join(text(shell_views.overflow_report(overflow_report(dump))).split())
    sqrt, exp = out.split("[2]")
    assert "no output holds inf, nan or a saturated value: the NaN it makes was written as numbers" in sqrt
    assert "inside the kernel" not in out and "outputs hold 1 saturated, 0 inf, 0 nan values" in exp


def test_a_nan_kept_as_nan_is_no_hidden_one(tmp_path):
    _run(tmp_path / "n.h5", [-4.0, 1.0, 4.0], "inf_nan")
    with open_dump(tmp_path / "n.h5") as dump:
        sqrt = next(r for r in dump.ops() if r.type == "aten.sqrt")
        assert sqrt.tensor("output_0").stats.nan == 1 and not makes_nan_hidden(dump, sqrt)
