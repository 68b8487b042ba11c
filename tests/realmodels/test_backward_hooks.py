"""Modules with full backward hooks of their own, at module level. torch runs such a module on copies of its
arguments that autograd routes through the hooks: the copies' gradients are the module's own path's share (the
residual around a BERT intermediate dense is not in it), taken before the hooks change them. Recorded on the
copies, a hook that does nothing failed `check` on a clean run (cosine 0.33 at the dense's input gradient), and
a hook doubling the input gradient of a module whose input no other module reads went unseen (where another
reads it too, the gradient recorded is their sum, and the module's share is not told apart). The arguments the module was called with are recorded now.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_bert_classifier

pytestmark = [pytest.mark.slow, pytest.mark.torch]

DENSE = "BertForSequenceClassification/bert/encoder/layer.1/output/dense"  # its input read by it alone


def _train(path, mode: str, hook=None, module: str = "intermediate") -> None:
    model = tiny_bert_classifier()
    if hook is not None:
        hooked = model.bert.encoder.layer[1].attention.self if module == "attention" else \
            getattr(model.bert.encoder.layer[1], module).dense
        hooked.register_full_backward_hook(hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(100)
    batches = [(torch.randint(3, 64, (3, 10), generator=generator), torch.randint(0, 3, (3,), generator=generator))
               for _ in range(2)]
    fit(path, model, optimizer, lambda model, b: model(input_ids=b[0], labels=b[1]).loss, batches, mode,
        level="module")


def test_a_backward_hook_that_does_nothing_leaves_the_run_clean(tmp_path):
    from precision_tool.cli.main import main

    _train(tmp_path / "golden.h5", "dump")
    _train(tmp_path / "target.h5", "dump", lambda module, grad_input, grad_output: None)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
    assert main(["check", str(tmp_path / "golden.h5"), str(tmp_path / "target.h5")]) == 0


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_backward_hook_doubling_the_input_gradient_is_named(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode)
    _train(tmp_path / "target.h5", mode, lambda module, grad_input, grad_output: (grad_input[0] * 2,), "output")
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == ("kernel_bug", DENSE, 0, "backward")


def test_a_backward_hook_on_a_parent_leaves_its_children_s_records_alone(tmp_path):
    """A hook on a layer's self-attention, whose input the residual reads too: its children (the query, key and
    value) run on torch's copies of that input, whose gradients are the self-attention's own share; they are
    recorded on the input the self-attention was called with (check failed at the query's input gradient)."""
    from precision_tool.cli.main import main

    _train(tmp_path / "golden.h5", "dump")
    _train(tmp_path / "target.h5", "dump", lambda module, grad_input, grad_output: None, "attention")
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
    assert main(["check", str(tmp_path / "golden.h5"), str(tmp_path / "target.h5")]) == 0
