"""Statistics-only dumps of a float32 Llama whose parameters or buffers differ before any op: an attention output
projection's weight doubled, a rotary base of 500 for 10000. Full dumps name the op reading the changed value
("a value no op of step 0 wrote"); from statistics it was `none`, "accumulated rounding", in a float32 run."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, change) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))
    if change is not None:
        with torch.no_grad():
            change(model)
    batches = list(torch.randint(3, 64, (2, 3, 10), generator=torch.Generator().manual_seed(5)))
    fit(path, model, torch.optim.Adam(model.parameters(), lr=1e-3), lambda m, ids: m(input_ids=ids, labels=ids).loss,
        batches, "stats")


def _doubled(model):
    model.model.layers[1].self_attn.o_proj.weight.mul_(2.0)


def _rotary_base(model):
    rotary = model.model.rotary_emb
    rotary.inv_freq.copy_(1.0 / 500.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))


@pytest.mark.parametrize("change, op", [
    (_doubled, "LlamaForCausalLM/model/layers.1/self_attn/o_proj/aten.mm_0"),
    (_rotary_base, "LlamaForCausalLM/model/rotary_emb/aten.mul_0")], ids=["weight", "buffer"])
def test_a_value_changed_before_any_op_is_named_from_statistics(change, op, tmp_path):
    _train(tmp_path / "golden.h5", None)
    _train(tmp_path / "target.h5", change)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", op, 0, "forward")
    assert "a value no op of step 0 wrote" in verdict.evidence[0]


def test_one_embedding_row_drawn_otherwise_is_named_from_statistics(tmp_path):
    # one row of BERT's word embedding initialised otherwise in the target (float32): its statistics move 1.6e-3,
    # under what counts where values are compared; but no op before the embedding rounded anything, so any
    # difference of a value no op wrote is one (`leaves._unlike_golden`)
    from tests.realmodels.cases import Case, run_case

    verdict = run_case(Case("bert-eager", "fp32", "embedding_row", "embed", "kernel_bug", "forward"), tmp_path,
                       mode="stats").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "BertForSequenceClassification/bert/embeddings/word_embeddings/aten.embedding_0", 0, "forward")
    assert verdict.evidence[0].endswith("reads input_0, a value no op of step 0 wrote (a parameter, buffer or the "
                                        "data), at least 0.0016 from golden's: its statistics are not golden's, while "
                                        "every op before it in the step wrote golden's values to the last bit")
