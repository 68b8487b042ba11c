"""Faults probed on shapes and training loops the rest of the suite does not use (tests/realmodels/cases.py).

Families here are the named ones at other sizes: GPT-2 with 3 layers, width 48, 3 heads, dropout 0.1, AdamW with
weight decay and a step learning-rate schedule; BERT with 3 layers, 6 heads, token types, padding and dropout 0.1
under SGD with momentum; ViT with 3 layers on 24x24 images; ResNet with three stages under AdamW; a 3-layer
nn.LSTM with dropout and a stack of single-layer LSTMs under SGD with momentum. Dropout draws the same masks in
both runs (cases.build seeds each run alike).

Faults each probe of this file first found missed (and the mechanism that names them now, in
precision_tool/analysis): a LayerNorm called without its affine weight and bias, or with the two swapped
(`omissions`); parameters left out of the optimizer (`omissions`); an LSTM's forget-gate bias initialised
differently (`omissions`); a gradient scaled between a batch-first LSTM and its time-major kernel (`rewrites`, the
incoming gradient measured where golden's writer wrote it); a module run in float16 inside a float32 run
(`omissions`); a 3 % scale under bfloat16 autocast (`rewrites`); a BatchNorm's momentum changed (`arguments`, read
although the op's output agrees). And faults of kinds the suite did not hold that
were named from the start: attention mask ignored, position ids shifted, softmax over the wrong axis, reflect
padding, average pooling for max pooling, a clipped LSTM output, one param group's learning rate changed.

Imports of cases.py happen inside the functions: cases.py imports this module at its end.
"""

from __future__ import annotations

import torch
from torch import nn


def _with_schedule(run):
    """The optimizer's learning rate decays by 0.7 after each step (a StepLR called after every update)."""
    schedule = torch.optim.lr_scheduler.StepLR(run.optimizer, step_size=1, gamma=0.7)
    step = run.optimizer.step

    def stepped(*args, **kwargs):
        result = step(*args, **kwargs)
        schedule.step()
        return result

    run.optimizer.step = stepped
    return run


def gpt2_deep(**_):
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.GPT2Config(n_layer=3, n_embd=48, n_head=3, vocab_size=80, n_positions=24, resid_pdrop=0.1,
                           embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = tf.GPT2LMHeadModel(config)
    ids = torch.randint(0, 80, (3, 10))
    return _with_schedule(Run(model, torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05),
                              {"input_ids": ids, "labels": ids}, _hf_loss))


def bert_deep(**_):
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.BertConfig(vocab_size=70, hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                           intermediate_size=96, max_position_embeddings=40, num_labels=3, hidden_dropout_prob=0.1,
                           attention_probs_dropout_prob=0.1, attn_implementation="eager")
    model = tf.BertForSequenceClassification(config)
    ids = torch.randint(1, 70, (5, 12))
    mask = torch.ones(5, 12, dtype=torch.long)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    types = torch.zeros(5, 12, dtype=torch.long)
    types[:, 6:] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": torch.tensor([0, 1, 2, 1, 0])}
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batch, _hf_loss)


def vit_deep(**_):
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.ViTConfig(image_size=24, patch_size=6, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                          intermediate_size=96, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                          attn_implementation="eager")
    model = tf.ViTForImageClassification(config)
    batch = {"pixel_values": torch.randn(3, 3, 24, 24), "labels": torch.tensor([0, 4, 2])}
    return _with_schedule(Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss))


def resnet_deep(**_):
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16, 24], depths=[2, 1, 1],
                             layer_type="basic", num_labels=5)
    model = tf.ResNetForImageClassification(config)
    batch = {"pixel_values": torch.randn(6, 3, 28, 28), "labels": torch.tensor([0, 1, 2, 3, 4, 0])}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


class DeepLSTM(nn.Module):
    """Embedding -> three-layer nn.LSTM with dropout 0.1 between layers -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 50, width: int = 24):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, num_layers=3, batch_first=True, dropout=0.1)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


class StackedLSTM(nn.Module):
    """Embedding -> two single-layer nn.LSTMs -> Linear over the vocabulary (each layer a module of its own)."""

    def __init__(self, vocab: int = 50, width: int = 24):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.l0 = nn.LSTM(width, width, batch_first=True)
        self.l1 = nn.LSTM(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.l1(self.l0(self.embed(ids))[0])[0])


def _language_model(model):
    from tests.realmodels.cases import Run

    ids = torch.randint(0, 50, (3, 9))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), {"ids": ids}, loss)


def lstm_deep(**_):
    return _language_model(DeepLSTM())


def lstm_stacked(**_):
    return _language_model(StackedLSTM())


_G, _B, _V, _S = "transformer.h", "bert.encoder.layer", "vit.layers", "resnet.encoder.stages"
MODELS = {
    "gpt2-deep": (gpt2_deep, {}, {"ln": f"{_G}.2.ln_2", "lnf": "transformer.ln_f", "act": f"{_G}.1.mlp.act",
                                  "attn": f"{_G}.1.attn", "mlp": f"{_G}.1.mlp", "block": f"{_G}.2"}),
    "bert-deep": (bert_deep, {}, {"ln": f"{_B}.2.attention.output.LayerNorm", "self": f"{_B}.1.attention.self",
                                  "embeddings": "bert.embeddings", "pooler": "bert.pooler"}),
    "vit-deep": (vit_deep, {}, {"mlp": f"{_V}.1.mlp", "attn": f"{_V}.2.attention"}),
    "resnet-deep": (resnet_deep, {}, {"layer": f"{_S}.1.layers.0", "conv": f"{_S}.1.layers.0.layer.1.convolution",
                                      "pool": "resnet.embedder.pooler",
                                      "bn": f"{_S}.0.layers.0.layer.0.normalization"}),
    "lstm-deep": (lstm_deep, {}, {"rnn": "rnn"}),
    "lstm-stacked": (lstm_stacked, {}, {"l0": "l0", "l1": "l1"}),
}


# ---- faults ------------------------------------------------------------------------------------

def _first(out, change):
    return (change(out[0]), *out[1:]) if isinstance(out, tuple) else change(out)


def _wrap(mod, around) -> None:
    from tests.realmodels.cases import _patch_forward

    original = mod.forward
    _patch_forward(mod, lambda *args, **kwargs: around(original, *args, **kwargs))


def layernorm_without_affine(run, path: str) -> None:
    """The LayerNorm is called without its weight and bias (``elementwise_affine`` lost in a port): at
    initialisation (ones, zeros) its output is golden's; its parameters get no gradient and never train."""
    from tests.realmodels.cases import module

    ln = module(run.model, path)
    _wrap(ln, lambda original, x: nn.functional.layer_norm(x, ln.normalized_shape, None, None, ln.eps))


def layernorm_affine_swapped(run, path: str) -> None:
    """The LayerNorm is called with its bias as weight and its weight as bias."""
    from tests.realmodels.cases import module

    ln = module(run.model, path)
    _wrap(ln, lambda original, x: nn.functional.layer_norm(x, ln.normalized_shape, ln.bias, ln.weight, ln.eps))


def left_out_of_optimizer(run, path: str) -> None:
    """The module's parameters are left out of the optimizer's param groups: they get gradients, never updates."""
    from tests.realmodels.cases import module

    mine = {id(p) for p in module(run.model, path).parameters()}
    group = run.optimizer.param_groups[0]
    group["params"] = [p for p in group["params"] if id(p) not in mine]


def group_lr(run, path: str) -> None:
    """The module's parameters get a param group of their own with twice the learning rate."""
    from tests.realmodels.cases import module

    mine = {id(p) for p in module(run.model, path).parameters()}
    group = run.optimizer.param_groups[0]
    params = group["params"]
    group["params"] = [p for p in params if id(p) not in mine]
    run.optimizer.add_param_group({"params": [p for p in params if id(p) in mine], "lr": group["lr"] * 2})


def forget_bias(run, path: str) -> None:
    """The second layer's forget-gate bias starts at +1 in the target (an initialisation golden does not make)."""
    from tests.realmodels.cases import module

    rnn = module(run.model, path)
    with torch.no_grad():
        rnn.bias_hh_l1[rnn.hidden_size:2 * rnn.hidden_size] += 1.0


def gradient_scaled(run, path: str) -> None:
    """The gradient flowing back into the module's output is 10 % too large (a custom Function left in)."""
    from tests.realmodels.cases import ScaledGradient, module

    _wrap(module(run.model, path), lambda original, *args, **kwargs: _first(original(*args, **kwargs),
                                                                            lambda x: ScaledGradient.apply(x, 1.1)))


def clipped_output(run, path: str) -> None:
    """The module's output is clipped to [-0.05, 0.05]."""
    from tests.realmodels.cases import module

    _wrap(module(run.model, path), lambda original, *args, **kwargs: _first(original(*args, **kwargs),
                                                                            lambda y: y.clamp(-0.05, 0.05)))


def _to_float(out):
    if isinstance(out, tuple):
        return tuple(_to_float(o) for o in out)
    return out.float() if torch.is_tensor(out) and out.is_floating_point() else out


def half_module(run, path: str) -> None:
    """The module is converted with ``.half()`` in a float32 run, its input cast to float16 and its output back."""
    from tests.realmodels.cases import module

    mod = module(run.model, path).half()
    _wrap(mod, lambda original, x, *args, **kwargs: _to_float(original(x.half(), *args, **kwargs)))


def bn_momentum(run, path: str) -> None:
    """The BatchNorm's momentum is 0.5 instead of 0.1: training outputs are golden's, the running statistics not."""
    from tests.realmodels.cases import module

    module(run.model, path).momentum = 0.5


def causal_off_by_one(run, path: str) -> None:
    """The attention's causal mask lets each position see one token ahead (``tril(1)`` for ``tril(0)``), written as
    an additive mask at float32's lowest value."""
    from tests.realmodels.cases import module

    def around(original, *args, **kwargs):
        mask = kwargs.get("attention_mask")
        if torch.is_tensor(mask) and mask.dim() == 4:
            allowed = torch.ones(mask.shape[-2], mask.shape[-1], dtype=torch.bool).tril(1)
            lowest = torch.finfo(mask.dtype).min
            kwargs["attention_mask"] = torch.where(allowed, 0.0, lowest).to(mask.dtype).expand_as(mask)
        return original(*args, **kwargs)

    _wrap(module(run.model, path), around)


def mask_ignored(run, path: str) -> None:
    """The attention module is called without the padding mask."""
    from tests.realmodels.cases import module

    def around(original, *args, **kwargs):
        kwargs["attention_mask"] = None
        return original(*args, **kwargs)

    _wrap(module(run.model, path), around)


def positions_shifted(run, path: str) -> None:
    """The embeddings look positions up from 1 instead of 0."""
    from tests.realmodels.cases import module

    def around(original, input_ids=None, **kwargs):
        kwargs["position_ids"] = torch.arange(1, input_ids.shape[1] + 1).unsqueeze(0)
        return original(input_ids=input_ids, **kwargs)

    _wrap(module(run.model, path), around)


def softmax_wrong_dim(run, path: str) -> None:
    """Inside the attention module, softmax normalises over the queries (dim -2) instead of the keys."""
    from tests.realmodels.cases import module

    softmax = nn.functional.softmax

    def wrong(x, dim=-1, *args, **kwargs):
        return softmax(x, -2 if dim in (-1, x.dim() - 1) else dim, *args, **kwargs)

    def around(original, *args, **kwargs):
        nn.functional.softmax = wrong
        try:
            return original(*args, **kwargs)
        finally:
            nn.functional.softmax = softmax

    _wrap(module(run.model, path), around)


def reflect_padding(run, path: str) -> None:
    """The convolution pads by reflection instead of zeros (same shapes)."""
    from tests.realmodels.cases import module

    module(run.model, path).padding_mode = "reflect"


def average_pool(run, path: str) -> None:
    """The stem's 3x3 max pooling is an average pooling."""
    from tests.realmodels.cases import module

    _wrap(module(run.model, path), lambda original, x: nn.functional.avg_pool2d(x, 3, 2, 1))


def scaled_3pct(run, path: str) -> None:
    """The module's output is 3 % too large."""
    from tests.realmodels.cases import module

    _wrap(module(run.model, path), lambda original, *args, **kwargs: _first(original(*args, **kwargs),
                                                                            lambda y: y * 1.03))


def _at(fault, path: str):
    """``fault`` planted at ``path`` (the verdict names the optimizer, so the case's role stays empty)."""
    return lambda run, _: fault(run, path)


FAULTS = {"ln_noaffine": layernorm_without_affine, "ln_swapped": layernorm_affine_swapped,
          "forget_bias": forget_bias,
          "grad_scaled": gradient_scaled, "clipped": clipped_output, "half_module": half_module,
          "mask_ignored": mask_ignored, "positions": positions_shifted, "softmax_dim": softmax_wrong_dim,
          "reflect_pad": reflect_padding, "bn_momentum": bn_momentum, "avg_pool": average_pool,
          "scale3": scaled_3pct, "causal_off_by_one": causal_off_by_one,
          "unoptimized_lnf": _at(left_out_of_optimizer, "transformer.ln_f"),
          "unoptimized_pooler": _at(left_out_of_optimizer, "bert.pooler"),
          "group_lr_block": _at(group_lr, f"{_G}.2")}


def fault_cases() -> list:
    from tests.realmodels.cases import Case

    K, P = "kernel_bug", "precision_loss"
    return [
        # missed before: the op sequences agree, what the target leaves out or passes differently is the fault
        Case("gpt2-deep", "fp32", "ln_noaffine", "ln", K, "forward"),
        Case("bert-deep", "fp32", "ln_swapped", "ln", K, "forward"),
        Case("gpt2-deep", "fp32", "unoptimized_lnf", "", K, "optimizer"),
        Case("bert-deep", "fp32", "unoptimized_pooler", "", K, "optimizer"),
        Case("lstm-deep", "fp32", "forget_bias", "rnn", K, "forward"),
        # missed before: a gradient scaled between a batch-first LSTM and its time-major kernel
        Case("lstm-stacked", "fp32", "grad_scaled", "l0", K, "backward"),
        # missed before: a module run in float16 inside a float32 run ('none'; or an AdamW overflow later)
        Case("gpt2-deep", "fp32", "half_module", "mlp", P, "forward"),
        Case("resnet-deep", "fp32", "half_module", "layer", P, "forward"),
        # missed before: 3 % under bfloat16 autocast (below bfloat16's 6.25 % noise floor)
        Case("gpt2-deep", "bf16", "scale3", "act", K, "forward"),
        # missed before: a constant that acts only on what the op writes in place (BatchNorm's running statistics)
        Case("resnet-deep", "fp32", "bn_momentum", "bn", K, "forward"),
        # the right module, the wrong class before: a mask constant at float32's lowest, written by an op that
        # reads no float (scalar_tensor), was taken for an overflow
        Case("gpt2-deep", "fp32", "causal_off_by_one", "attn", K, "forward"),
        # named from the start: kinds of fault the suite did not hold
        Case("bert-deep", "fp32", "mask_ignored", "self", K, "forward"),
        Case("bert-deep", "fp32", "positions", "embeddings", K, "forward"),
        Case("vit-deep", "fp32", "softmax_dim", "attn", K, "forward"),
        Case("resnet-deep", "fp32", "reflect_pad", "conv", K, "forward"),
        Case("resnet-deep", "fp32", "avg_pool", "pool", K, "forward"),
        Case("lstm-stacked", "fp32", "clipped", "l0", K, "forward"),
        Case("gpt2-deep", "fp32", "group_lr_block", "", K, "optimizer"),
    ]


def clean_cases() -> list:
    """One clean target a family (cases.clean_cases leaves these families out of its every-target product)."""
    from tests.realmodels.cases import Case

    return [Case("gpt2-deep", "bf16"), Case("bert-deep", "fp16"), Case("resnet-deep", "mix"),
            Case("lstm-deep", "mix"), Case("vit-deep", "bf16")]


def register(models: dict, faults: dict, not_clean: set) -> None:
    """Add this module's families, roles and faults to cases.py's tables."""
    models.update(MODELS)
    faults.update(FAULTS)
