"""Model families, clean conditions and faults a fourth red-team probe added (tests/realmodels/cases.py).

Families: Mistral with grouped-query attention (4 query heads, 2 key/value heads); Qwen2 likewise, biases on q/k/v;
BART (encoder-decoder, cross attention, learned positions); ALBERT (one layer's weights shared by all layers,
factorised embeddings); GPT-NeoX with partial rotary (a quarter of each head); MobileNetV2 (depthwise
convolutions, ReLU6, BatchNorm) under SGD with momentum; Wav2Vec2's encoder (a convolutional front end with group
norm, a convolutional position embedding, CTC loss); DeBERTa-v2 (disentangled relative attention).

Clean conditions (right verdict "none"): bf16 autocast, simulated mixed precision and force_fp16, float16 autocast
with a GradScaler on each; simulate_npu's allow_mix_precision_bf16, allow_fp32_to_fp16, allow_fp32_to_bf16 and
force_fp32 in a float32 target (`CONDITIONS`); the target's loss computed in the training loop from the logits where
golden's model computes it (``loss-outside``). Mistral and Qwen2 under force_fp16 are not clean: their RMSNorm's
float32 upcast is computed in float16 and the rsqrt's backward saturates, as llama's does (`NOT_CLEAN`).

Faults (right verdict names the place): repeat_kv tiling the key/value heads (h0 h1 h0 h1) instead of repeating each;
the rotary embedding computed for positions + 1; a shared ALBERT layer's activation 5 % off on its second use in
each forward; label smoothing 0.1 in the model's own loss, and in a loss the target computes in its training loop;
a GroupNorm's eps; the faults of plant.py and probed2.py on these families' activations, attentions (self and cross),
norms, embeddings, projections, convolutions and BatchNorms.

What the probe first got wrong, and the mechanism that fixed it (precision_tool/analysis): a loss golden's model
computes and the target's training loop computes with label smoothing was "none" under float32 and bf16 autocast (the
logits' gradient 10 % off, written in each run by ops with no partner in the other: `departures`, ``_unpaired``); the
same loss moved out of the model, clean, was kernel_bug at the model (its call returns (loss, logits) in golden and
logits alone in the target, compared slot by slot: `attribution`, ``_outputs_by_shape``).

ALBERT under force_fp32 (``npu-fp32``) was precision_loss at embedding_hidden_mapping_in's addmm, "computing in
float16 in a run that declares float32": force_fp32's Cube ops read float16 by design (reference/NUMERICS.md), so the
mode no longer declares float32 throughout (`omissions.declares_float32`). (First seen only in the scoreboard's
process and thought order-dependent; it is not.)

Not named, and why: ReLU6's clip dropped in MobileNetV2 (the probed ReLU6 reads at most 3.49: no value changes).

Imports of cases.py happen inside the functions: cases.py imports this module at its end.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn


def _tf():
    from tests.realmodels.cases import _quiet_transformers

    return _quiet_transformers()


def _run(model, batch, optimizer=None):
    from tests.realmodels.cases import Run, _hf_loss

    return Run(model, optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def _lm_batch(vocab: int = 64, length: int = 16) -> dict:
    ids = torch.randint(1, vocab, (4, length))
    return {"input_ids": ids, "labels": ids}


# ---- families ----------------------------------------------------------------------------------

def mistral(attn: str = "eager", **_):
    """Mistral, 2 layers, width 32, 4 query heads sharing 2 key/value heads, SiLU MLP, RMSNorm."""
    tf = _tf()
    config = tf.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                              attn_implementation=attn, tie_word_embeddings=False, head_dim=8)
    return _run(tf.MistralForCausalLM(config), _lm_batch())


def qwen2(attn: str = "sdpa", **_):
    """Qwen2, 2 layers, width 32, grouped-query attention (4 heads, 2 kv heads), biases on q/k/v, tied embeddings."""
    tf = _tf()
    config = tf.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                            attn_implementation=attn, tie_word_embeddings=True)
    return _run(tf.Qwen2ForCausalLM(config), _lm_batch())


def bart(attn: str = "eager", **_):
    """BART, 1 encoder and 1 decoder layer, width 32, cross attention, labels shifted into decoder inputs."""
    tf = _tf()
    config = tf.BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, attn_implementation=attn)
    model = tf.BartForConditionalGeneration(config)
    ids = torch.randint(3, 64, (4, 12))
    return _run(model, {"input_ids": ids, "labels": torch.randint(3, 64, (4, 10))})


def albert(**_):
    """ALBERT, 3 layers sharing one layer's weights, embeddings of 16 projected to 32, sequence classification."""
    tf = _tf()
    config = tf.AlbertConfig(vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                             num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
                             num_labels=4, attn_implementation="eager")
    model = tf.AlbertForSequenceClassification(config)
    ids = torch.randint(1, 64, (4, 16))
    return _run(model, {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 3])})


def neox(**_):
    """GPT-NeoX, 2 layers, width 32, rotary on a quarter of each head, parallel residual."""
    tf = _tf()
    config = tf.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=32, rotary_pct=0.25,
                              hidden_dropout=0.0, attention_dropout=0.0, attn_implementation="eager")
    return _run(tf.GPTNeoXForCausalLM(config), _lm_batch())


def mobilenet(**_):
    """MobileNetV2 at depth multiplier 0.35 on 32x32 images, SGD with momentum 0.9."""
    tf = _tf()
    config = tf.MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.35, num_labels=4,
                                  classifier_dropout_prob=0.0)
    model = tf.MobileNetV2ForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return _run(model, batch, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))


def wav2vec2(**_):
    """Wav2Vec2 for CTC: 2 convolutional feature layers (group norm), 2 transformer layers, width 32."""
    tf = _tf()
    config = tf.Wav2Vec2Config(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                               num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, hidden_dropout=0.0,
                               attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                               final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, pad_token_id=0,
                               ctc_loss_reduction="mean", attn_implementation="eager")
    model = tf.Wav2Vec2ForCTC(config)
    batch = {"input_values": torch.randn(4, 400), "labels": torch.randint(1, 16, (4, 8))}
    return _run(model, batch)


def deberta(**_):
    """DeBERTa-v2, 2 layers, width 32, disentangled relative attention (c2p and p2c), sequence classification."""
    tf = _tf()
    config = tf.DebertaV2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=32, relative_attention=True,
                                position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"],
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=4,
                                pooler_dropout=0.0)
    model = tf.DebertaV2ForSequenceClassification(config)
    ids = torch.randint(1, 64, (4, 16))
    return _run(model, {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 3])})


def _families() -> dict:
    P = functools.partial
    return {"mistral": mistral, "mistral-sdpa": P(mistral, "sdpa"), "qwen2": qwen2, "bart": bart,
            "albert": albert, "neox": neox, "mobilenet": mobilenet, "wav2vec2": wav2vec2, "deberta": deberta,
            "albert-outside": _loss_outside(albert), "mobilenet-outside": _loss_outside(mobilenet)}


_ROLES = {
    "mistral": {"act": "model.layers.1.mlp.act_fn", "attn": "model.layers.1.self_attn",
                "ln": "model.layers.1.post_attention_layernorm", "fc": "model.layers.0.mlp.down_proj",
                "kproj": "model.layers.0.self_attn.k_proj", "attn0": "model.layers.0.self_attn",
                "rope": "model.rotary_emb"},
    "mistral-sdpa": {"act": "model.layers.1.mlp.act_fn", "attn": "model.layers.0.self_attn"},
    "qwen2": {"rope": "model.rotary_emb", "act": "model.layers.0.mlp.act_fn", "attn": "model.layers.1.self_attn",
              "ln": "model.layers.0.input_layernorm", "embed": "model.embed_tokens"},
    "bart": {"act": "model.decoder.layers.0.activation_fn", "cross": "model.decoder.layers.0.encoder_attn",
             "ln": "model.encoder.layers.0.final_layer_norm", "attn": "model.encoder.layers.0.self_attn",
             "fc": "model.decoder.layers.0.fc1"},
    "albert": {"act": "albert.encoder.albert_layer_groups.0.albert_layers.0.activation",
               "attn": "albert.encoder.albert_layer_groups.0.albert_layers.0.attention",
               "proj": "albert.encoder.embedding_hidden_mapping_in",
               "ln": "albert.embeddings.LayerNorm"},
    "neox": {"rope": "gpt_neox.rotary_emb", "act": "gpt_neox.layers.1.mlp.act", "attn": "gpt_neox.layers.0.attention",
             "ln": "gpt_neox.layers.1.post_attention_layernorm"},
    "mobilenet": {"act": "mobilenet_v2.layer.1.expand_1x1.activation",
                  "bn": "mobilenet_v2.layer.2.conv_3x3.normalization",
                  "conv": "mobilenet_v2.layer.2.conv_3x3.convolution"},
    "wav2vec2": {"gn": "wav2vec2.feature_extractor.conv_layers.0.layer_norm",
                 "act": "wav2vec2.encoder.layers.1.feed_forward.intermediate_act_fn",
                 "posconv": "wav2vec2.encoder.pos_conv_embed.conv",
                 "ln": "wav2vec2.encoder.layers.0.layer_norm", "attn": "wav2vec2.encoder.layers.0.attention"},
    "albert-outside": {}, "mobilenet-outside": {},
    "deberta": {"act": "deberta.encoder.layer.1.intermediate.intermediate_act_fn",
                "attn": "deberta.encoder.layer.0.attention.self",
                "ln": "deberta.encoder.layer.0.output.LayerNorm"},
}
# force_fp16 computes RMSNorm's float32 upcast in float16: the rsqrt's backward saturates, as llama's does
NOT_CLEAN = {("mistral", "fp16"), ("mistral-sdpa", "fp16"), ("qwen2", "fp16")}
MODELS: dict = {}  # filled by register (the builders need cases.py)

# ---- faults ------------------------------------------------------------------------------------

def _module(run, path):
    from tests.realmodels.cases import module

    return module(run.model, path)


def _patched_global(module_name: str, name: str, replacement):
    """A fault: while the role's module runs, ``module_name.name`` is ``replacement``."""
    def plant(run, path: str) -> None:
        import importlib

        namespace = importlib.import_module(module_name)
        mod = _module(run, path)
        forward = mod.forward

        def patched(*args, **kwargs):
            saved = getattr(namespace, name)
            setattr(namespace, name, replacement)
            try:
                return forward(*args, **kwargs)
            finally:
                setattr(namespace, name, saved)

        mod.forward = patched
    return plant


def _tiled_kv(hidden, n_rep: int):
    """repeat_kv gone wrong: the key/value heads tiled (h0 h1 h0 h1) instead of each repeated (h0 h0 h1 h1)."""
    return hidden if n_rep == 1 else hidden.repeat(1, n_rep, 1, 1)


def rotary_positions_off(run, path: str) -> None:
    """The rotary embedding is computed for positions + 1."""
    rope = _module(run, path)
    forward = rope.forward
    rope.forward = lambda x, position_ids, *args, **kwargs: forward(x, position_ids + 1, *args, **kwargs)


def scaled_on_second_call(run, path: str) -> None:
    """The module's output is 5 % too large on its second call of each forward (a shared layer's second use)."""
    mod = _module(run, path)
    forward, calls = mod.forward, [0]

    def scaled(*args, **kwargs):
        calls[0] += 1
        out = forward(*args, **kwargs)
        return out * 1.05 if calls[0] % 3 == 2 else out

    mod.forward = scaled


def label_smoothing(run, path: str) -> None:
    """The model's own cross-entropy loss smooths its labels by 0.1 (golden's does not)."""
    inner = run.loss

    def loss(model, batch):
        saved = nn.functional.cross_entropy
        nn.functional.cross_entropy = lambda *args, **kwargs: saved(*args, **{**kwargs, "label_smoothing": 0.1})
        try:
            return inner(model, batch)
        finally:
            nn.functional.cross_entropy = saved

    run.loss = loss


def _outside_loss(smoothing: float = 0.0):
    """Cross-entropy of the model's logits computed in the training loop, with ``smoothing``."""
    def loss(model, batch):
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                                           label_smoothing=smoothing)
    return loss


def loss_outside_smoothed(run, path: str) -> None:
    """The target computes the loss itself from the logits (outside the model), with label smoothing 0.1."""
    run.loss = _outside_loss(0.1)


def loss_outside(run, path: str) -> None:
    """The target computes the loss itself from the logits (outside the model), as golden's model does."""
    run.loss = _outside_loss()


def _loss_outside(builder):
    def build(**kwargs):
        run = builder(**kwargs)
        run.loss = _outside_loss()
        return run
    return build


def relu_for_relu6(run, path: str) -> None:
    """ReLU6's clip at 6 dropped: a plain ReLU."""
    from tests.realmodels.cases import _patch_forward

    _patch_forward(_module(run, path), nn.functional.relu)


def group_norm_eps(run, path: str) -> None:
    _module(run, path).eps = 1e-2


FAULTS: dict = {"tiled_kv": _patched_global("transformers.models.mistral.modeling_mistral", "repeat_kv", _tiled_kv),
                "rope_off": rotary_positions_off, "second_call": scaled_on_second_call, "smoothing": label_smoothing, "outside_smoothed": loss_outside_smoothed, "outside": loss_outside,
                "relu_for_relu6": relu_for_relu6, "gn_eps": group_norm_eps}


def fault_cases() -> list:
    """The faults the test suite runs (`bench_cases` adds more to the scoreboard)."""
    from tests.realmodels.cases import Case

    # missed before, a loss smoothed in the target's training loop: test_mechanisms asserts its exact verdict
    return [Case("deberta", "fp32", "outside_smoothed", "", "kernel_bug", "backward")]


def clean_cases() -> list:
    """The clean runs the test suite runs (`bench_cases` adds more to the scoreboard)."""
    from tests.realmodels.cases import Case

    # blamed before, at the model: golden's call returns (loss, logits), the target's (logits) alone
    return [Case("deberta", "bf16", condition="loss-outside"),
            # blamed before: a matmul reading float16 under force_fp32, which is what the mode does
            Case("albert", "fp32", condition="npu-fp32")]


def bench_cases() -> list:
    """Faults and clean runs of this probe the scoreboard runs and the test suite does not."""
    from tests.realmodels.cases import Case

    K = "kernel_bug"
    return [
        Case("mistral", "fp32", "attn_unscaled", "attn", K, "forward"),
        Case("mistral", "bf16", "tiled_kv", "attn0", K, "forward"),
        Case("mistral", "fp32", "rope_off", "rope", K, "forward"),
        Case("mistral", "fp32", "backward_only", "act", K, "backward"),
        Case("qwen2", "fp32", "frozen_weight", "ln", K, "backward"),
        Case("qwen2", "mix", "scale5", "act", K, "forward"),
        Case("qwen2", "fp32", "padding_idx", "embed", K, "forward"),
        Case("bart", "fp32", "attn_unscaled", "cross", K, "forward"),
        Case("bart", "bf16", "ln_eps_1e3", "ln", K, "forward"),
        Case("bart", "fp32", "smoothing", "", K),
        Case("albert", "fp32", "second_call", "act", K, "forward"),
        Case("albert", "bf16", "outside_smoothed", "", K, "backward"),
        Case("albert", "fp32", "outside_smoothed", "", K, "backward"),
        Case("neox", "mix", "rope_off", "rope", K, "forward"),
        Case("neox", "fp32", "gelu_tanh", "act", K, "forward"),
        Case("mobilenet", "fp32", "bn_eval", "bn", K, "forward"),
        Case("wav2vec2", "bf16", "gn_eps", "gn", K, "forward"),
        Case("wav2vec2", "fp32", "conv_noise", "posconv", K, "forward"),
        Case("deberta", "fp32", "backward_only", "act", K, "backward"),
    ] + [Case(model, target) for model, target in (
        ("mistral", "bf16"), ("mistral", "mix"), ("qwen2", "amp16"), ("bart", "fp16"), ("bart", "amp16"),
        ("albert", "fp16"), ("neox", "fp16"), ("wav2vec2", "mix"), ("deberta", "fp16"), ("deberta", "mix"))] + [
        Case(model, "fp32", condition=condition) for model, condition in (
            ("deberta", "npu-bf16mix"), ("bart", "npu-matrix16"), ("qwen2", "npu-matrixbf16"),
            ("deberta", "loss-outside"), ("albert", "loss-outside"), ("gpt2-sdpa", "npu-fp32"),
            ("bert-eager", "npu-fp32"), ("resnet", "npu-fp32"))] + [
        # a fault under force_fp32, whose matmuls read float16: still named
        Case(model, "fp32", "scale", "act", K, condition="npu-fp32") for model in ("gpt2-sdpa", "vit")]


# ---- conditions --------------------------------------------------------------------------------

def _npu(mode: str):
    def context():
        import precision_tool.torch as ptt

        return ptt.simulate_npu(mode)
    return context


def _conditions() -> dict:
    from tests.realmodels.probed import _nothing

    none = contextlib.nullcontext
    # name -> (golden's context, the target's context, the target's set-up); the target's precision "fp32"
    return {"npu-bf16mix": (none, _npu("allow_mix_precision_bf16"), _nothing),
            "npu-matrix16": (none, _npu("allow_fp32_to_fp16"), _nothing),
            "npu-matrixbf16": (none, _npu("allow_fp32_to_bf16"), _nothing),
            "npu-fp32": (none, _npu("force_fp32"), _nothing),
            "npu-origin": (none, _npu("must_keep_origin_dtype"), _nothing),
            "loss-outside": (none, none, lambda run: loss_outside(run, ""))}


def register(models: dict, faults: dict, not_clean: set) -> None:
    """Add this module's families, roles and faults to cases.py's tables."""
    from tests.realmodels import probed

    probed.CONDITIONS.update(_conditions())
    for name, builder in _families().items():
        MODELS[name] = (builder, {}, _ROLES[name])
    models.update(MODELS)
    faults.update(FAULTS)
    not_clean.update(NOT_CLEAN)
