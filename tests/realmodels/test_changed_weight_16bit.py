"""A weight changed before training (doubled: loaded or initialised otherwise) in a bfloat16 autocast Llama, from
statistics. Full dumps name the first op reading it ("a value no op of step 0 wrote"); statistics got `none`: the
check for a changed parameter or buffer ran in float32 runs only, where no rounding moves an unrecognised slice's
statistics 1 %. A 16-bit run's first step moves them more, never by a quarter: beyond that it now runs there too.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool, mode: str, doubled: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    config = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=64, max_position_embeddings=64,
                            tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = tf.LlamaForCausalLM(config)
    if doubled:
        with torch.no_grad():
            model.model.layers[1].self_attn.o_proj.weight.mul_(2.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(100)
    batches = [torch.randint(3, 64, (3, 10), generator=generator) for _ in range(2)]

    def loss_of(model, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
            return model(input_ids=ids, labels=ids).loss

    fit(path, model, optimizer, loss_of, batches, mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_weight_doubled_in_a_bfloat16_run_is_named_where_it_is_first_read(tmp_path, mode):
    _train(tmp_path / "golden.h5", False, mode, False)
    _train(tmp_path / "target.h5", True, mode, True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step) == \
        ("kernel_bug", "LlamaForCausalLM/model/layers.1/self_attn/o_proj", 0)
    assert "a value no op of step 0 wrote (a parameter, buffer or the data), 1 from golden's" in verdict.evidence[0]


def test_the_same_bfloat16_run_from_statistics_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", False, "stats", False)
    _train(tmp_path / "target.h5", True, "stats", False)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
