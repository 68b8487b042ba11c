"""A forward pre-hook scaling a module's input (GPT-2's first MLP, x2, float32). Its op runs in the module's scope,
so the module's ops are not golden's; full dumps replay the call and name it. From statistics nothing replays it,
and the verdict was another op of a later block: a module called with an input far from golden's, while the op
that wrote that input agrees with its own partner, had its input changed on the way in.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch]

MLP = "GPT2LMHeadModel/transformer/h.0/mlp"


def _train(path, mode: str, scale: float | None = None) -> None:
    model = tiny_gpt2()
    if scale is not None:
        model.transformer.h[0].mlp.register_forward_pre_hook(lambda module, args: (args[0] * scale, *args[1:]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = token_batches(2)
    fit(path, model, optimizer, lambda model, ids: model(input_ids=ids, labels=ids).loss, batches, mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_pre_hook_scaling_a_module_s_input_is_named_at_the_module(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode)
    _train(tmp_path / "target.h5", mode, 2.0)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step) == ("kernel_bug", MLP, 0), verdict.evidence


def test_a_pre_hook_that_changes_nothing_leaves_the_run_clean_from_statistics(tmp_path):
    _train(tmp_path / "golden.h5", "stats")
    _train(tmp_path / "target.h5", "stats", 1.0)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_an_attention_called_with_other_arguments_by_another_backend_is_no_pre_hook(tmp_path):
    """Llama's eager attention against SDPA (float32, statistics): the calls' argument lists differ (the mask left
    out), so an input paired by position is another argument, written outside the call: not changed on entry."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    for name, attention in (("golden.h5", "eager"), ("target.h5", "sdpa")):
        torch.manual_seed(1)
        config = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
        config._attn_implementation = attention
        model = tf.LlamaForCausalLM(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(100)
        batches = [torch.randint(3, 64, (3, 10), generator=generator) for _ in range(2)]
        fit(tmp_path / name, model, optimizer, lambda model, ids: model(input_ids=ids, labels=ids).loss, batches,
            "stats")
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
