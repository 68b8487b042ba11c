"""Clean conditions and faults a red-team probe of the five judged families added (tests/realmodels/cases.py).

Clean conditions (right verdict "none"): gradient accumulation in BERT and ResNet; clipping in ResNet and the
LSTM; GradScaler runs whose scale grows at every step, or starts beyond float16 and backs off, with clipping in
BERT; oneDNN's LSTM kernel in one run only (`CONDITIONS`: golden's or the target's ``torch.backends.mkldnn`` off);
packed variable-length sequences through an LSTM; an LSTM carrying its state across steps; a ResNet in
channels_last in the target only; an eval-mode forward after each update; BERT with tied input and output
embeddings (masked LM); a linear warmup schedule; 3 and 4 steps; a wider batch and image, a longer sequence;
another thread count in the target; AdamW with weight-decay param groups.

Faults (right verdict names the place): a ResNet shortcut scaled; a ReLU made LeakyReLU(0.01); a GELU made
SiLU (float32, bfloat16, float16 with a GradScaler); a convolution's dilation changed; a BatchNorm's eps; a
pooler's tanh dropped; label smoothing in BERT; one word-embedding row initialised differently; an LSTM state
clipped between steps; a loss summed instead of averaged; GPT-2's output embedding untied from the input;
Adam's eps 1e-6 for 1e-8; SGD's momentum 0.5 for 0.9; weight decay on biases and norms as well.

What the probe first got wrong, and the mechanism that fixed it (precision_tool/analysis): the LSTM with
oneDNN in golden only was blamed (`rewrites`: results matched from the side with fewer, in the layout that
matches); BERT under a growing GradScaler with clipping was blamed at the clipping norm (`omissions.changed_leaf`:
gradients are written in the step); the weight decay went unseen (`updates`: a replayed update judged relative
to the update); the embedding row got "different seed" (`scan.leaf_mismatch`: not while another random tensor
the first ops read is golden's exactly). In stats mode, the LSTM with oneDNN in the target only under mixed
precision was blamed from a 2.5e-5 lower bound (`rewrites`: REWRITE_FLOOR from statistics as from values).

Imports of cases.py happen inside the functions: cases.py imports this module at its end.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


# ---- families ----------------------------------------------------------------------------------

def _with(builder, **fields):
    """``builder``'s Run with ``fields`` set (clip, accumulate, steps, scaler) in both runs."""
    def build(**kwargs):
        run = builder(**kwargs)
        for name, value in fields.items():
            setattr(run, name, value)
        return run
    return build


def _after_step(run, then) -> None:
    step = run.optimizer.step

    def stepped(*args, **kwargs):
        result = step(*args, **kwargs)
        then()
        return result

    run.optimizer.step = stepped


def resnet_eval(**_):
    """ResNet with a validation forward (eval mode: BatchNorm's running statistics, no gradient) after each update."""
    from tests.realmodels.cases import resnet

    run = resnet()

    def validate():
        run.model.eval()
        with torch.no_grad():
            run.loss(run.model, run.batch)
        run.model.train()

    _after_step(run, validate)
    return run


def gpt2_warmup(**_):
    """GPT-2, 3 steps, the learning rate warmed up linearly over them (LambdaLR)."""
    from tests.realmodels.cases import gpt2

    run = gpt2("sdpa")
    run.steps = 3
    schedule = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: min(1.0, (step + 1) / 3))
    _after_step(run, schedule.step)
    return run


def gpt2_groups(**_):
    """GPT-2 under AdamW with weight decay 0.1 on matrices and none on biases and norms (two param groups)."""
    from tests.realmodels.cases import gpt2

    run = gpt2("sdpa")
    params = list(run.model.parameters())
    run.optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                       {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-3)
    return run


def bert_mlm(**_):
    """BERT masked LM: the decoder's weight is the word embeddings (tied), half the labels ignored (-100)."""
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation="eager")
    model = tf.BertForMaskedLM(config)
    ids = torch.randint(1, 64, (4, 16))
    labels = ids.clone()
    labels[:, ::2] = -100
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), {"input_ids": ids, "labels": labels}, _hf_loss)


def vit_wide(**_):
    """ViT on 32x32 images in 8x8 patches, 2 heads, a batch of 8."""
    from tests.realmodels.cases import Run, _hf_loss, _quiet_transformers

    tf = _quiet_transformers()
    config = tf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=48, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = tf.ViTForImageClassification(config)
    batch = {"pixel_values": torch.randn(8, 3, 32, 32), "labels": torch.randint(0, 3, (8,))}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, _hf_loss)


def _next_token_loss(model, batch, reduction: str = "mean"):
    logits = model(batch["ids"][:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1),
                                       reduction=reduction)


def lstm_long(**_):
    """cases.py's LSTM language model, width 16, a batch of 2 sequences of 25 tokens."""
    from tests.realmodels.cases import LSTMLanguageModel, Run

    model = LSTMLanguageModel(vocab=40, width=16)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": torch.randint(0, 40, (2, 25))},
               _next_token_loss)


class PackedLSTM(nn.Module):
    """Embedding -> two-layer LSTM over packed variable-length sequences -> Linear over the vocabulary."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=ids.shape[1])
        return self.head(out)


def lstm_packed(**_):
    from tests.realmodels.cases import Run

    model = PackedLSTM()
    lengths = torch.tensor([11, 7, 9, 5])

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1], batch["lengths"])
        labels = batch["ids"][:, 1:].clone()
        for row, length in enumerate(batch["lengths"].tolist()):
            labels[row, length:] = -100  # padding
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3),
               {"ids": torch.randint(0, 64, (4, 12)), "lengths": lengths}, loss)


class StatefulLSTM(nn.Module):
    """Embedding -> LSTM -> Linear; (h, c) carried to the next step, detached (truncated backpropagation);
    ``clip``: the carried h clamped to [-clip, clip]."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)
        self.state = None
        self.clip: float | None = None

    def forward(self, ids):
        out, (h, c) = self.rnn(self.embed(ids), self.state)
        if self.clip is not None:
            h = h.clamp(-self.clip, self.clip)
        self.state = (h.detach(), c.detach())
        return self.head(out)


def lstm_stateful(**_):
    from tests.realmodels.cases import Run

    model = StatefulLSTM()
    run = Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": torch.randint(0, 64, (4, 12))},
              _next_token_loss)
    run.steps = 3
    return run


def _families():
    from tests.realmodels import cases

    return {
        "bert-accumulate": _with(cases.bert, accumulate=2),
        "resnet-accumulate": _with(cases.resnet, accumulate=2),
        "resnet-clip": _with(cases.resnet, clip=1.0),
        "lstm-clip": _with(cases.lstm, clip=0.5),
        "vit-growing": _with(cases.vit, steps=3, scaler={"growth_interval": 1}),
        "gpt2-backoff": _with(cases.gpt2, steps=3, scaler={"init_scale": 2.0 ** 30, "growth_interval": 1}),
        "bert-growing-clip": _with(cases.bert, steps=3, clip=1.0, scaler={"init_scale": 2.0 ** 8,
                                                                         "growth_interval": 1}),
        "bert-4steps": _with(cases.bert, steps=4),
        "resnet-eval": resnet_eval, "gpt2-warmup": gpt2_warmup, "gpt2-groups": gpt2_groups, "bert-mlm": bert_mlm,
        "vit-wide": vit_wide, "lstm-long": lstm_long, "lstm-packed": lstm_packed, "lstm-stateful": lstm_stateful,
    }


_R = "resnet.encoder.stages"
_ROLES = {"bert-accumulate": {}, "resnet-accumulate": {}, "resnet-clip": {}, "lstm-clip": {},
          "vit-growing": {"act": "vit.layers.1.mlp.activation_fn"}, "gpt2-backoff": {}, "bert-growing-clip": {},
          "bert-4steps": {}, "resnet-eval": {}, "gpt2-warmup": {}, "gpt2-groups": {}, "bert-mlm": {},
          "vit-wide": {}, "lstm-long": {}, "lstm-packed": {}, "lstm-stateful": {}}
MODELS: dict = {}  # filled by register (the builders need cases.py)


# ---- conditions --------------------------------------------------------------------------------

def _threads(n: int):
    @contextlib.contextmanager
    def context():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)
    return context


def _mkldnn_off():
    return torch.backends.mkldnn.flags(enabled=False)


def _channels_last(run) -> None:
    run.model.to(memory_format=torch.channels_last)
    run.batch = {**run.batch, "pixel_values": run.batch["pixel_values"].contiguous(memory_format=torch.channels_last)}


def _nothing(run) -> None:
    pass


NO_CONDITION = (contextlib.nullcontext, contextlib.nullcontext, _nothing)
# name -> (golden's context, the target's context, the target's set-up): differences a clean port makes
CONDITIONS = {
    "dnn-target": (_mkldnn_off, contextlib.nullcontext, _nothing),  # oneDNN's LSTM kernel in the target only
    "dnn-golden": (contextlib.nullcontext, _mkldnn_off, _nothing),  # ... in golden only
    "channels-last": (contextlib.nullcontext, contextlib.nullcontext, _channels_last),
    "threads": (_threads(1), _threads(2), _nothing),
}


# ---- faults ------------------------------------------------------------------------------------

def _replace_forward(function):
    """A fault that makes the module at the role's path compute ``function(x)`` instead."""
    def plant(run, path: str) -> None:
        from tests.realmodels.cases import _patch_forward, module

        _patch_forward(module(run.model, path), function)
    return plant


def shortcut_halved(run, path: str) -> None:
    """The residual shortcut (an identity) is halved: ``x + 0.5 * shortcut`` where golden adds it whole."""
    from tests.realmodels.cases import scale_output

    scale_output(run, path, 0.5)


def dilated(run, path: str) -> None:
    """The 3x3 convolution is dilated by 2 (padding 2 keeps every shape)."""
    from tests.realmodels.cases import module

    conv = module(run.model, path)
    conv.dilation, conv.padding = (2, 2), (2, 2)


def bn_eps(run, path: str) -> None:
    """The BatchNorm's eps is 1e-2 instead of 1e-5."""
    from tests.realmodels.cases import module

    module(run.model, path).eps = 1e-2


def pooler_tanh_dropped(run, path: str) -> None:
    """BERT's pooler returns its dense layer's output without the tanh."""
    run.model.bert.pooler.activation = nn.Identity()


def embedding_row(run, path: str) -> None:
    """One word-embedding row (of a token the batch holds) starts 10 % larger in the target."""
    from tests.realmodels.cases import module

    with torch.no_grad():
        module(run.model, path).weight[int(run.batch["input_ids"][0, 3])].mul_(1.1)


def state_clipped(run, path: str) -> None:
    """The LSTM's state carried to the next step is clamped to [-0.05, 0.05]."""
    run.model.clip = 0.05


def summed_loss(run, path: str) -> None:
    """The next-token loss sums over the tokens instead of averaging."""
    run.loss = lambda model, batch: _next_token_loss(model, batch, "sum")


def untied(run, path: str) -> None:
    """GPT-2's output projection gets a weight of its own (a copy of the input embeddings): both train apart."""
    head = run.model.lm_head
    head.weight = nn.Parameter(run.model.transformer.wte.weight.detach().clone())
    run.optimizer.add_param_group({"params": [head.weight]})


def decay_everything(run, path: str) -> None:
    """Weight decay 0.1 on the biases and norms too (the param group golden exempts)."""
    run.optimizer.param_groups[1]["weight_decay"] = 0.1


FAULTS = {"shortcut_half": shortcut_halved, "dilated": dilated, "bn_eps": bn_eps,
          "leaky": _replace_forward(lambda x: nn.functional.leaky_relu(x, 0.01)),
          "silu": _replace_forward(nn.functional.silu), "no_pooler_tanh": pooler_tanh_dropped,
          "embedding_row": embedding_row, "state_clipped": state_clipped, "summed_loss": summed_loss,
          "untied": untied, "decay_all": decay_everything}


def fault_cases() -> list:
    from tests.realmodels.cases import Case

    K = "kernel_bug"
    return [
        Case("resnet", "fp32", "shortcut_half", "shortcut", K, "forward"),
        Case("resnet", "fp32", "leaky", "act", K, "forward"),
        Case("resnet", "fp32", "dilated", "conv2", K, "forward"),
        Case("resnet", "fp32", "bn_eps", "bn", K, "forward"),
        Case("vit", "fp32", "silu", "act", K, "forward"),
        Case("bert-eager", "bf16", "silu", "act", K, "forward"),
        Case("vit-growing", "amp16", "silu", "act", K, "forward"),
        Case("bert-eager", "fp32", "no_pooler_tanh", "pooler", K, "forward"),
        Case("bert-sdpa", "fp32", "label_smoothing", "", K),
        Case("lstm-stateful", "fp32", "state_clipped", "", K, "forward"),
        Case("lstm", "fp32", "summed_loss", "", K, "forward"),
        Case("lstm", "mix", "summed_loss", "", K, "forward"),
        Case("gpt2-sdpa", "fp32", "untied", "embed", K, "backward"),
        Case("bert-eager", "fp32", "adam_eps6", "", K, "optimizer"),
        Case("resnet", "fp32", "momentum_half", "", K, "optimizer"),
        Case("resnet", "bf16", "momentum_half", "", K, "optimizer"),
        # missed before: a weight decay golden does not apply (1e-4 of the parameters, 10 % of the update)
        Case("gpt2-groups", "fp32", "decay_all", "", K, "optimizer"),
        # missed before: one parameter initialised differently, read by the step's very first op
        Case("bert-eager", "fp32", "embedding_row", "embed", K, "forward"),
    ]


def clean_cases() -> list:
    from tests.realmodels.cases import Case

    return [Case("bert-accumulate", "bf16"), Case("resnet-accumulate", "mix"), Case("resnet-clip", "bf16"),
            Case("lstm-clip", "mix"), Case("vit-growing", "amp16"), Case("gpt2-backoff", "amp16"),
            Case("bert-growing-clip", "amp16"),  # blamed before, at the clipping norm
            Case("lstm", "fp32", condition="dnn-target"), Case("lstm", "mix", condition="dnn-target"),
            Case("lstm", "fp32", condition="dnn-golden"),  # blamed before, in the LSTM's backward
            Case("lstm", "mix", condition="dnn-golden"),
            Case("lstm-packed", "mix"), Case("lstm-packed", "fp32", condition="dnn-target"),
            Case("resnet", "fp32", condition="channels-last"), Case("resnet", "bf16", condition="channels-last"),
            Case("resnet-eval", "bf16"), Case("bert-mlm", "bf16"), Case("gpt2-warmup", "mix"),
            Case("bert-4steps", "fp16"), Case("vit-wide", "bf16"), Case("lstm-long", "mix"),
            Case("gpt2-sdpa", "fp32", condition="threads"), Case("resnet", "fp32", condition="threads"),
            Case("lstm-stateful", "mix"), Case("gpt2-groups", "bf16")]


def register(models: dict, faults: dict, not_clean: set) -> None:
    """Add this module's families, roles and faults to cases.py's tables."""
    for name, builder in _families().items():
        kwargs = {"attn": "sdpa"} if name.startswith(("gpt2-backoff", "vit-", "bert-acc", "bert-grow")) else {}
        kwargs = {"attn": "eager"} if name == "bert-4steps" else kwargs
        MODELS[name] = (builder, kwargs, _ROLES[name])
    models.update(MODELS)
    roles = {"resnet": {"shortcut": f"{_R}.0.layers.0.shortcut", "conv2": f"{_R}.1.layers.0.layer.1.convolution",
                        "bn": f"{_R}.0.layers.0.layer.0.normalization"},
             "bert-eager": {"pooler": "bert.pooler"}, "gpt2-sdpa": {"embed": "transformer.wte"}}
    for model, more_roles in roles.items():
        for role, path in more_roles.items():
            models[model][2].setdefault(role, path)
    from tests.realmodels.cases import optimizer_setting  # (cases.py is importing us: defined by now)

    FAULTS["adam_eps6"] = optimizer_setting("eps", lambda eps: 1e-6)
    FAULTS["momentum_half"] = optimizer_setting("momentum", lambda momentum: 0.5)
    faults.update(FAULTS)
