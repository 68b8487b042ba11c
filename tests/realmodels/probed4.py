"""Model families a fifth probe added (tests/realmodels/cases.py), on which the diagnosis was right from the start.

Families: OPT (learned positions offset by two, ReLU, the decoder called past its parent module); Gemma (RMSNorm
scaling by 1 + w, embeddings multiplied by sqrt(width) in the compute dtype, tanh GELU, no biases); Phi (partial
rotary, attention and MLP in parallel off one LayerNorm); Falcon (fused query-key-value, parallel attention);
RoBERTa (positions offset by the padding index); CLIP (text and vision towers, a contrastive loss through
``logit_scale.exp()``); Whisper (a convolutional front end on mel features, encoder-decoder with cross attention).

Clean: bf16 autocast, simulated mixed precision and force_fp16, float16 autocast with a GradScaler, on each.
Faults: an activation 2 % off (float32 and mixed targets; in CLIP's text tower and Whisper's encoder too), its
gradient alone 5 % off, a LayerNorm's eps, attention scaled by 1/d, a Linear's bias dropped, noise after
Whisper's second convolution.

Hugging Face initialises every Linear bias to zero: a dropped bias changes no forward value at step 0, and the
first difference is the bias's missing gradient, so the verdict names the Linear in backward.

Imports of cases.py happen inside the functions: cases.py imports this module at its end.
"""

from __future__ import annotations

import torch


def _tf():
    from tests.realmodels.cases import _quiet_transformers

    return _quiet_transformers()


def _run(model, batch):
    from tests.realmodels.cases import Run, _hf_loss

    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def _lm_batch(vocab: int = 64, length: int = 16) -> dict:
    ids = torch.randint(1, vocab, (4, length))
    return {"input_ids": ids, "labels": ids}


def opt(**_):
    tf = _tf()
    config = tf.OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                          max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, word_embed_proj_dim=32,
                          attn_implementation="eager")
    return _run(tf.OPTForCausalLM(config), _lm_batch())


def gemma(**_):
    tf = _tf()
    config = tf.GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
                            attn_implementation="eager")
    return _run(tf.GemmaForCausalLM(config), _lm_batch())


def phi(**_):
    tf = _tf()
    config = tf.PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=32, resid_pdrop=0.0, embd_pdrop=0.0,
                          attention_dropout=0.0, partial_rotary_factor=0.5, attn_implementation="eager")
    return _run(tf.PhiForCausalLM(config), _lm_batch())


def falcon(**_):
    tf = _tf()
    config = tf.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             hidden_dropout=0.0, attention_dropout=0.0, new_decoder_architecture=False,
                             parallel_attn=True, alibi=False, bias=True)
    return _run(tf.FalconForCausalLM(config), _lm_batch())


def roberta(**_):
    tf = _tf()
    config = tf.RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=40, num_labels=3, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, attn_implementation="eager")
    batch = {"input_ids": torch.randint(3, 64, (4, 16)), "labels": torch.tensor([0, 1, 2, 1])}
    return _run(tf.RobertaForSequenceClassification(config), batch)


def clip(**_):
    tf = _tf()
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    config = tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    config._attn_implementation = "eager"
    batch = {"input_ids": torch.randint(1, 64, (4, 12)), "pixel_values": torch.randn(4, 3, 32, 32),
             "return_loss": True}
    return _run(tf.CLIPModel(config), batch)


def whisper(**_):
    tf = _tf()
    config = tf.WhisperConfig(vocab_size=64, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=32,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                              decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, dropout=0.0,
                              attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, decoder_start_token_id=1,
                              eos_token_id=2, bos_token_id=1, suppress_tokens=None, begin_suppress_tokens=None,
                              attn_implementation="eager")
    batch = {"input_features": torch.randn(4, 16, 32), "labels": torch.randint(3, 64, (4, 8))}
    return _run(tf.WhisperForConditionalGeneration(config), batch)


_FAMILIES = {"opt": opt, "gemma": gemma, "phi": phi, "falcon": falcon, "roberta": roberta, "clip": clip,
             "whisper": whisper}
_ROLES = {
    "opt": {"act": "model.decoder.layers.1.activation_fn", "ln": "model.decoder.layers.0.final_layer_norm",
            "attn": "model.decoder.layers.0.self_attn", "fc": "model.decoder.layers.1.fc1"},
    "gemma": {"act": "model.layers.1.mlp.act_fn", "attn": "model.layers.0.self_attn"},
    "phi": {"act": "model.layers.1.mlp.activation_fn", "ln": "model.layers.0.input_layernorm",
            "attn": "model.layers.1.self_attn", "fc": "model.layers.0.mlp.fc1"},
    "falcon": {"act": "transformer.h.1.mlp.act", "ln": "transformer.h.1.input_layernorm",
               "fc": "transformer.h.0.mlp.dense_h_to_4h"},
    "roberta": {"act": "roberta.encoder.layer.1.intermediate.intermediate_act_fn",
                "ln": "roberta.encoder.layer.0.output.LayerNorm", "fc": "roberta.encoder.layer.0.intermediate.dense"},
    "clip": {"act": "vision_model.encoder.layers.1.mlp.activation_fn",
             "tact": "text_model.encoder.layers.0.mlp.activation_fn", "ln": "text_model.encoder.layers.1.layer_norm1",
             "fc": "text_model.encoder.layers.1.mlp.fc2"},
    "whisper": {"act": "model.decoder.layers.0.activation_fn", "eact": "model.encoder.layers.1.activation_fn",
                "conv": "model.encoder.conv2", "ln": "model.encoder.layers.0.final_layer_norm",
                "attn": "model.decoder.layers.1.encoder_attn", "fc": "model.decoder.layers.1.fc2"},
}
MODELS: dict = {}  # filled by register (the builders need cases.py)


def fault_cases() -> list:
    """The faults the test suite runs (`bench_cases` adds more to the scoreboard)."""
    from tests.realmodels.cases import Case

    return [Case("whisper", "fp32", "conv_noise", "conv", "kernel_bug", "forward")]


def clean_cases() -> list:
    """The clean runs the test suite runs: CLIP's contrastive loss under a GradScaler."""
    from tests.realmodels.cases import Case

    return [Case("clip", "amp16")]


def bench_cases() -> list:
    """Faults and clean runs of this probe the scoreboard runs and the test suite does not."""
    from tests.realmodels.cases import Case

    K = "kernel_bug"
    cases = []
    for model, roles in _ROLES.items():
        cases += [Case(model, target) for target in ("bf16", "mix", "fp16", "amp16")
                  if (model, target) not in {(c.model, c.target) for c in clean_cases()}]
        cases += [Case(model, "fp32", "scale", "act", K, "forward"), Case(model, "mix", "scale", "act", K, "forward"),
                  Case(model, "fp32", "backward_only", "act", K, "backward")]
        cases += [Case(model, "fp32", "scale", role, K, "forward") for role in ("tact", "eact") if role in roles]
        if "ln" in roles:
            cases.append(Case(model, "fp32", "ln_eps", "ln", K, "forward"))
        if "attn" in roles:
            cases.append(Case(model, "fp32", "attn_scale", "attn", K, "forward"))
        if "fc" in roles:
            cases.append(Case(model, "bf16", "drop_bias", "fc", K))
    return cases


def register(models: dict, faults: dict, not_clean: set) -> None:
    """Add this module's families and roles to cases.py's tables."""
    for name, builder in _FAMILIES.items():
        MODELS[name] = (builder, {}, _ROLES[name])
    models.update(MODELS)
