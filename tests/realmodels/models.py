"""The real-model suite's models: tiny-config, random-init Hugging Face models and small torch modules, each a
builder returning a `Run`, and ``MODELS``: name -> (builder, arguments, the dotted paths of its roles).

cases.py imports these names (more.py, unseen.py and probed.py register more families into ``MODELS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

@dataclass
class Run:
    """A model, its optimizer, one batch and the loss of a forward pass."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: dict
    loss: Callable[[nn.Module, dict], torch.Tensor]
    clip: float | None = None  # clip_grad_norm_ to this before each update
    accumulate: int = 1  # micro-batches a step accumulates gradients over (the batch split along dim 0) ...
    divide: bool = True  # ... each micro-batch's loss divided by their number
    steps: int = 0  # optimizer steps both runs take (0: STEPS)
    scaler: dict | None = None  # amp16 targets: GradScaler arguments beyond init_scale 2^10


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _hf_loss(model, batch):
    return model(**batch).loss


def gpt2(attn: str, offset: float = 0.0, qk_scale: float = 1.0) -> Run:
    tf = _quiet_transformers()
    config = tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    model = tf.GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.wpe.weight.add_(offset)
        for block in model.transformer.h:  # c_attn packs q, k, v along its output columns
            block.attn.c_attn.weight[:, :64].mul_(qk_scale)
    ids = torch.randint(0, 64, (4, 16))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}, _hf_loss)


def bert(attn: str, offset: float = 0.0, qk_scale: float = 1.0) -> Run:
    tf = _quiet_transformers()
    config = tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, num_labels=4, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation=attn)
    model = tf.BertForSequenceClassification(config)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.add_(offset)
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.weight.mul_(qk_scale)
            layer.attention.self.key.weight.mul_(qk_scale)
    ids = torch.randint(1, 64, (4, 16))
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[1, 12:] = 0  # padding: exercises the additive attention mask
    mask[3, 9:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def vit(attn: str = "sdpa", offset: float = 0.0, qk_scale: float = 1.0) -> Run:
    tf = _quiet_transformers()
    config = tf.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, attn_implementation=attn)
    model = tf.ViTForImageClassification(config)
    with torch.no_grad():
        model.vit.embeddings.patch_embeddings.projection.bias.add_(offset)
        for layer in model.vit.layers:
            layer.attention.q_proj.weight.mul_(qk_scale)
            layer.attention.k_proj.weight.mul_(qk_scale)
    batch = {"pixel_values": torch.randn(4, 3, 16, 16), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def resnet(**_) -> Run:
    tf = _quiet_transformers()
    config = tf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                             layer_type="basic", num_labels=4)
    model = tf.ResNetForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batch, _hf_loss)


def llama(**_) -> Run:
    """RMSNorm (upcast to float32 by the model), SiLU-gated MLP, rotary positions, grouped-query attention."""
    tf = _quiet_transformers()
    config = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = tf.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (4, 16))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": ids}, _hf_loss)


def distilbert(offset: float = 0.0, **_) -> Run:
    tf = _quiet_transformers()
    config = tf.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, num_labels=4,
                                 dropout=0.0, attention_dropout=0.0, max_position_embeddings=32)
    model = tf.DistilBertForSequenceClassification(config)
    with torch.no_grad():
        model.distilbert.embeddings.word_embeddings.weight.add_(offset)
    batch = {"input_ids": torch.randint(1, 64, (4, 16)), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def convnext(**_) -> Run:
    """Depthwise convolutions, channels-last LayerNorm, GELU, layer scale."""
    tf = _quiet_transformers()
    config = tf.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_labels=4, num_stages=2)
    model = tf.ConvNextForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def t5(**_) -> Run:
    """Encoder-decoder, relative position bias, RMS-style layer norm without a mean, ReLU MLP."""
    tf = _quiet_transformers()
    config = tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                         decoder_start_token_id=0)
    model = tf.T5ForConditionalGeneration(config)
    ids = torch.randint(1, 64, (4, 12))
    batch = {"input_ids": ids, "labels": ids[:, :8].contiguous()}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


class GRUTagger(nn.Module):
    """Embedding -> two-layer GRU -> Linear -> tanh -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.GRU(width, width, num_layers=2, batch_first=True)
        self.proj = nn.Linear(width, width)
        self.act = nn.Tanh()
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.act(self.proj(self.rnn(self.embed(ids))[0])))


def gru(**_) -> Run:
    model = GRUTagger()
    ids = torch.randint(0, 64, (4, 12))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": ids}, loss)


class LSTMLanguageModel(nn.Module):
    """Embedding -> two-layer LSTM -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


def lstm(**_) -> Run:
    model = LSTMLanguageModel()
    ids = torch.randint(0, 64, (4, 12))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": ids}, loss)


def swin(**_) -> Run:
    """Shifted-window attention, patch merging, mean pooling before the head (a bias gradient that cancels)."""
    tf = _quiet_transformers()
    config = tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                           num_labels=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    model = tf.SwinForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


class MLPRegressor(nn.Module):
    """Linear -> LayerNorm -> GELU -> square Linear -> SiLU -> Linear, an MSE loss: no transformers at all."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(20, width)
        self.norm = nn.LayerNorm(width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.SiLU()
        self.fc3 = nn.Linear(width, 1)

    def forward(self, x):
        return self.fc3(self.act2(self.fc2(self.act(self.norm(self.fc1(x))))))


def mlp(**_) -> Run:
    model = MLPRegressor()
    batch = {"x": torch.randn(32, 20), "y": torch.randn(32, 1)}
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), batch,
               lambda model, batch: nn.functional.mse_loss(model(batch["x"]), batch["y"]))


class SmallCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU -> max pool, twice, global average pool, Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.pool(self.act1(self.bn1(self.conv1(x))))
        x = self.act2(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def cnn(**_) -> Run:
    model = SmallCNN()
    batch = {"x": torch.randn(8, 3, 16, 16), "y": torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])}
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batch,
               lambda model, batch: nn.functional.cross_entropy(model(batch["x"]), batch["y"]))


# name -> (builder, keyword arguments, module paths by role)
MODELS: dict[str, tuple[Callable, dict, dict]] = {
    "gpt2-sdpa": (gpt2, {"attn": "sdpa"}, {"act": "transformer.h.1.mlp.act", "ln": "transformer.h.0.ln_1",
                                           "attn": "transformer.h.0.attn"}),
    "gpt2-eager": (gpt2, {"attn": "eager"}, {"act": "transformer.h.1.mlp.act", "ln": "transformer.h.0.ln_1",
                                             "attn": "transformer.h.0.attn", "embed": "transformer.wte",
                                             "fc": "transformer.h.0.mlp.c_fc"}),
    "bert-sdpa": (bert, {"attn": "sdpa"}, {"act": "bert.encoder.layer.1.intermediate.intermediate_act_fn",
                                           "ln": "bert.embeddings.LayerNorm",
                                           "attn": "bert.encoder.layer.0.attention.self"}),
    "bert-eager": (bert, {"attn": "eager"}, {"act": "bert.encoder.layer.1.intermediate.intermediate_act_fn",
                                             "ln": "bert.embeddings.LayerNorm",
                                             "attn": "bert.encoder.layer.0.attention.self",
                                             "ln2": "bert.encoder.layer.1.output.LayerNorm",
                                             "fc": "bert.encoder.layer.1.intermediate.dense",
                                             "embed": "bert.embeddings.word_embeddings"}),
    "vit": (vit, {"attn": "sdpa"}, {"act": "vit.layers.1.mlp.activation_fn", "ln": "vit.layers.0.layernorm_before",
                                    "attn": "vit.layers.0.attention"}),
    "vit-eager": (vit, {"attn": "eager"}, {"act": "vit.layers.1.mlp.activation_fn",
                                           "ln": "vit.layers.0.layernorm_before", "attn": "vit.layers.0.attention"}),
    "resnet": (resnet, {}, {"act": "resnet.encoder.stages.1.layers.0.layer.0.activation",
                            "conv": "resnet.encoder.stages.1.layers.0.layer.0.convolution"}),
    "lstm": (lstm, {}, {"act": "head"}),
    "lstm-nodnn": (lstm, {}, {"act": "head"}),
    "llama": (llama, {}, {"act": "model.layers.1.mlp.act_fn", "norm": "model.norm"}),
    "distilbert": (distilbert, {}, {"act": "distilbert.transformer.layer.1.ffn.activation",
                                    "ln": "distilbert.embeddings.LayerNorm"}),
    "convnext": (convnext, {}, {"act": "convnext.encoder.stages.1.layers.0.act"}),
    "t5": (t5, {}, {"act": "encoder.block.1.layer.1.DenseReluDense.act"}),
    "gru": (gru, {}, {"act": "act", "embed": "embed"}),
    "swin": (swin, {}, {"act": "swin.encoder.layers.1.blocks.0.mlp.activation_fn"}),
    "mlp": (mlp, {}, {"act": "act", "ln": "norm", "fc": "fc2"}),
    "cnn": (cnn, {}, {"act": "act2", "bn": "bn1"}),
}
# Clean targets a model cannot pass, because the precision mode itself breaks it (a genuine verdict, tested in
# test_mechanisms): force_fp16 overrides Llama's float32 upcast in RMSNorm, and rsqrt's backward, x^-1.5 of a
# variance near 4e-4, is 2.8e5 in golden: beyond float16.
NOT_CLEAN = {("llama", "fp16")}
