"""Label smoothing in a bfloat16 autocast target only (a Llama, its loss written in the training loop), from
statistics. Full dumps name the smoothing's first op; statistics got `none`: a backward group that runs other ops
than golden's was judged from statistics in float32 runs only, where no rounding surfaces in what it computes. A
16-bit run's rounding surfaces there by a few percent at most; the smoothing moves the loss's gradient 10 %, its
inputs within 1e-5. From GROUP_FLOOR_16 (5 %) such a group is judged in 16-bit runs too.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool, mode: str, smoothing: float) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    config = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = "eager"
    model = tf.LlamaForCausalLM(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(100)
    batches = [torch.randint(3, 64, (3, 10), generator=generator) for _ in range(2)]

    def loss_of(model, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
            logits = model(input_ids=ids).logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids[:, 1:].reshape(-1),
                                                 label_smoothing=smoothing)

    fit(path, model, optimizer, loss_of, batches, mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_label_smoothing_in_a_bfloat16_target_only_is_named_at_the_loss(tmp_path, mode):
    _train(tmp_path / "golden.h5", False, mode, 0.0)
    _train(tmp_path / "target.h5", True, mode, 0.1)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step) == ("kernel_bug", None, 0), verdict.evidence
    assert verdict.evidence[1].startswith("in backward of the ops outside every module, golden ran ")


def test_the_same_bfloat16_run_without_smoothing_is_clean_from_statistics(tmp_path):
    _train(tmp_path / "golden.h5", False, "stats", 0.0)
    _train(tmp_path / "target.h5", True, "stats", 0.0)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
