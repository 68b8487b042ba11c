"""A gradient scaled 5 % by a custom autograd Function (identity forward) in a bfloat16 run, from statistics.

The rewritten backward group's results depart from golden's by 5 %, at the floor a 16-bit run's group is judged
from (GROUP_FLOOR_16: its incoming gradient's noise can surface there): `none`. The op the target inserts shows it
exactly in its own statistics (`analysis.inserted`): its output is its input times 1.05.
"""

from __future__ import annotations

import pytest

from tests.realmodels.cases import Case, run_case

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.mark.parametrize("model,module", [("resnet", "resnet/encoder/stages.1/layers.0/layer/0/activation"),
                                          ("swin", "swin/encoder/layers.1/blocks.0/mlp/activation_fn")])
def test_a_gradient_scaled_by_an_inserted_op_is_named_from_statistics(tmp_path, model, module):
    verdict = run_case(Case(model, "bf16", "backward_only", "act", "kernel_bug", "backward"), tmp_path,
                       mode="stats").verdict
    assert (verdict.cls, verdict.type, verdict.step, verdict.direction) == ("kernel_bug", "aten.mul", 0, "backward")
    assert verdict.op.endswith(f"{module}/aten.view_0/aten.mul_0") and verdict.module.endswith(module)
    assert verdict.evidence[1] == (f"{verdict.op} (aten.mul), which golden's backward does not run, writes the "
                                   "gradient it reads times 1.05: every statistic of its output is its input's, scaled")


def test_a_layernorm_written_by_hand_is_no_gradient_scaled_from_statistics(tmp_path):
    # its backward runs other ops than golden's native_layer_norm_backward, among them a mul by 2 (the chain rule
    # through the variance's square): another implementation, not golden's ops with a scaling inserted
    from tests.realmodels.cases import bert_layernorm_by_hand, diagnosis_of

    bert_layernorm_by_hand(tmp_path / "golden.h5", False, 2, mode="stats")
    bert_layernorm_by_hand(tmp_path / "target.h5", True, 2, mode="stats")
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
