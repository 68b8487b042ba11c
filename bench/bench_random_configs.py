"""The diagnosis on configurations nobody chose: random tiny configs of the five real-model families.

    python bench/bench_random_configs.py --seed 4 --cases 24 --faults   # planted faults
    python bench/bench_random_configs.py --seed 6 --cases 24            # clean ports
    python bench/bench_random_configs.py --seed 6 --cases 24 --mode stats   # both runs as statistics only
    python bench/bench_random_configs.py --seed 6 --cases 24 --mode stats --level module   # module calls only
    python bench/bench_random_configs.py --seed 6 --cases 24 --faults --mode stats --zoom   # then zoom's region

The suite's cases (tests/realmodels) fix one config per family, and a mechanism
tuned on them may lean on its sizes. Here each case draws a family (GPT-2,
BERT, ViT, ResNet, an LSTM or GRU language model), its layers (1-3), width
(32-64), heads, sequence length, batch, activation, optimizer (AdamW, Adam,
SGD with momentum) and attention kernel (eager, sdpa), and a target: bf16
autocast, float16 autocast with a GradScaler, simulated mixed precision or
simulated force_fp16; with ``--faults`` one of three planted faults in the
first block's activation (2 % scale, hand-written approximation, 5 % too
large gradient), half of them in a float32 target. Both runs are collected
and judged as `tests/realmodels/cases.py` does. A case torch itself cannot
run on this CPU (a float16 LSTM under oneDNN) is reported as skipped.
Prints one JSON line a case, then the totals.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from precision_tool.analysis.zoom import zoomed_diagnosis  # noqa: E402
from tests.realmodels import cases as C  # noqa: E402
from tests.realmodels.models import Run, _hf_loss, _quiet_transformers  # noqa: E402

VOCAB = 96


def _optimizer(kind: str, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if kind == "adam":
        return torch.optim.Adam(params, lr=2e-3)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def gpt2(layers, width, heads, seq, batch, act, opt, attn) -> Run:
    tf = _quiet_transformers()
    config = tf.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=VOCAB, n_positions=max(32, seq),
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function=act,
                           attn_implementation=attn)
    model, ids = tf.GPT2LMHeadModel(config), torch.randint(0, VOCAB, (batch, seq))
    return Run(model, _optimizer(opt, model.parameters()), {"input_ids": ids, "labels": ids}, _hf_loss)


def bert(layers, width, heads, seq, batch, act, opt, attn) -> Run:
    tf = _quiet_transformers()
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=2 * width, max_position_embeddings=max(32, seq), num_labels=3,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                           hidden_act="gelu" if act == "gelu_new" else act, attn_implementation=attn)
    model, ids = tf.BertForSequenceClassification(config), torch.randint(0, VOCAB, (batch, seq))
    return Run(model, _optimizer(opt, model.parameters()),
               {"input_ids": ids, "labels": torch.randint(0, 3, (batch,))}, _hf_loss)


def vit(layers, width, heads, seq, batch, act, opt, attn) -> Run:
    tf = _quiet_transformers()
    image, patch = (16, max(seq // 4, 2)) if seq <= 16 else (32, 4)  # (`--larger`: 64 patches)
    config = tf.ViTConfig(image_size=image, patch_size=patch, num_channels=3, hidden_size=width,
                          num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=2 * width,
                          num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, hidden_act=act,
                          attn_implementation=attn)
    model = tf.ViTForImageClassification(config)
    return Run(model, _optimizer(opt, model.parameters()),
               {"pixel_values": torch.randn(batch, 3, image, image), "labels": torch.randint(0, 3, (batch,))},
               _hf_loss)


def resnet(layers, width, heads, seq, batch, act, opt, attn) -> Run:
    tf = _quiet_transformers()
    config = tf.ResNetConfig(num_channels=3, embedding_size=width // 4,
                             hidden_sizes=[width // 4, width // 2, width][:layers], depths=[1] * layers,
                             layer_type="bottleneck" if heads == 4 else "basic", num_labels=3, hidden_act="relu")
    model = tf.ResNetForImageClassification(config)
    return Run(model, _optimizer(opt, model.parameters()),
               {"pixel_values": torch.randn(batch, 3, 32, 32), "labels": torch.randint(0, 3, (batch,))}, _hf_loss)


class RecurrentLM(nn.Module):
    """Embedding -> LSTM or GRU -> Linear over the vocabulary."""

    def __init__(self, width: int, layers: int, cell: type):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.rnn = cell(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


def recurrent(layers, width, heads, seq, batch, act, opt, attn) -> Run:
    model = RecurrentLM(width, layers, nn.GRU if heads == 4 else nn.LSTM)

    def loss(model, batch_):
        logits = model(batch_["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch_["ids"][:, 1:].reshape(-1))

    return Run(model, _optimizer(opt, model.parameters()), {"ids": torch.randint(0, VOCAB, (batch, seq))}, loss)


FAMILIES = {  # builder, the module the faults are planted in, the faults that apply
    "gpt2": (gpt2, "transformer.h.0.mlp.act", ("scale", "backward_only", "handwritten")),
    "bert": (bert, "bert.encoder.layer.0.intermediate.intermediate_act_fn", ("scale", "backward_only", "handwritten")),
    "vit": (vit, "vit.layers.0.mlp.activation_fn", ("scale", "backward_only", "handwritten")),
    "resnet": (resnet, "resnet.encoder.stages.0.layers.0.layer.0.activation", ("scale", "backward_only", "handwritten")),
    "rnn": (recurrent, "head", ("scale",)),
}


# ``--wider``: faults drawn at any layer, in activations, LayerNorms and Linears: (kind, module template with
# {i} for the layer, class the verdict must have, its direction); the first block's LayerNorm of a layer is
# drawn as the layer is
WIDER = {
    "gpt2": (("scale", "transformer.h.{i}.mlp.act"), ("backward_only", "transformer.h.{i}.mlp.act"),
             ("sqrt_act", "transformer.h.{i}.mlp.act"), ("dropout_on", "transformer.h.{i}.mlp.act"),
             ("ln_eps", "transformer.h.{i}.ln_2"), ("summed_var", "transformer.h.{i}.ln_1")),
    "bert": (("scale", "bert.encoder.layer.{i}.intermediate.intermediate_act_fn"),
             ("backward_only", "bert.encoder.layer.{i}.intermediate.intermediate_act_fn"),
             ("sqrt_act", "bert.encoder.layer.{i}.intermediate.intermediate_act_fn"),
             ("ln_eps", "bert.encoder.layer.{i}.output.LayerNorm"),
             ("summed_var", "bert.encoder.layer.{i}.attention.output.LayerNorm"),
             ("drop_bias", "bert.encoder.layer.{i}.output.dense"), ("weight_grad", "bert.encoder.layer.{i}.output.dense"),
             ("dropout_on", "bert.encoder.layer.{i}.attention.self.query")),
    "vit": (("scale", "vit.layers.{i}.mlp.activation_fn"), ("backward_only", "vit.layers.{i}.mlp.activation_fn"),
            ("ln_eps", "vit.layers.{i}.layernorm_after"), ("summed_var", "vit.layers.{i}.layernorm_before"),
            ("drop_bias", "vit.layers.{i}.mlp.fc2"), ("weight_grad", "vit.layers.{i}.mlp.fc1")),
    "resnet": (("scale", "resnet.encoder.stages.{i}.layers.0.layer.0.activation"),
               ("backward_only", "resnet.encoder.stages.{i}.layers.0.layer.0.activation"),
               ("sqrt_act", "resnet.encoder.stages.{i}.layers.0.layer.0.activation"),
               ("scale", "resnet.encoder.stages.{i}.layers.0.layer.0.convolution")),
    "rnn": (("scale", "head"), ("drop_bias", "head"), ("weight_grad", "head")),
}
# and families the suite builds at one config (tests/realmodels/models.py): RMSNorm and rotary positions, an
# encoder-decoder, depthwise convolutions, windowed attention; drawn with --wider only, layer 0 or 1
FIXED = {
    "llama": (("scale", "model.layers.{i}.mlp.act_fn"), ("backward_only", "model.layers.{i}.mlp.act_fn"),
              ("sqrt_act", "model.layers.{i}.mlp.act_fn"), ("dropout_on", "model.layers.{i}.mlp.act_fn")),
    "distilbert": (("scale", "distilbert.transformer.layer.{i}.ffn.activation"),
                   ("backward_only", "distilbert.transformer.layer.{i}.ffn.activation"),
                   ("ln_eps", "distilbert.transformer.layer.{i}.output_layer_norm"),
                   ("summed_var", "distilbert.transformer.layer.{i}.sa_layer_norm"),
                   ("drop_bias", "distilbert.transformer.layer.{i}.ffn.lin2")),
    "convnext": (("scale", "convnext.encoder.stages.{i}.layers.0.act"),
                 ("backward_only", "convnext.encoder.stages.{i}.layers.0.act"),
                 ("sqrt_act", "convnext.encoder.stages.{i}.layers.0.act")),
    "t5": (("scale", "encoder.block.{i}.layer.1.DenseReluDense.act"),
           ("backward_only", "encoder.block.{i}.layer.1.DenseReluDense.act"),
           ("sqrt_act", "encoder.block.{i}.layer.1.DenseReluDense.act")),
    "swin": (("scale", "swin.encoder.layers.{i}.blocks.0.mlp.activation_fn"),
             ("backward_only", "swin.encoder.layers.{i}.blocks.0.mlp.activation_fn"),
             ("ln_eps", "swin.encoder.layers.{i}.blocks.0.layernorm_before")),
}
_CLASS = {"sqrt_act": "invalid_operation"}


def draw(rng: random.Random, index: int, faults: bool, wider: bool = False, larger: bool = False) -> C.Case:
    """One random case, registered in the suite's MODELS under a name of its own; ``larger``: widths 128-256,
    sequences of 32-64 and up to 4 layers instead of the suite's tiny sizes."""
    family = rng.choice(list(FAMILIES))
    builder, role, kinds = FAMILIES[family]
    sizes = dict(layers=[2, 3, 4], width=[128, 192, 256], seq=[32, 48, 64], batch=[4, 8]) if larger else \
        dict(layers=[1, 2, 3], width=[32, 48, 64], seq=[8, 12, 16], batch=[2, 4, 8])
    config = dict(layers=rng.choice(sizes["layers"]), width=rng.choice(sizes["width"]), heads=rng.choice([2, 4]),
                  seq=rng.choice(sizes["seq"]), batch=rng.choice(sizes["batch"]),
                  act=rng.choice(["gelu", "relu", "gelu_new"]) if family != "resnet" else "relu",
                  opt=rng.choice(["adamw", "adam", "sgd"]), attn=rng.choice(["eager", "sdpa"]))
    name = f"random{index}-{family}"
    C.MODELS[name] = (builder, config, {"act": role})
    target = rng.choice(["bf16", "mix", "fp16", "amp16"])
    if not faults:
        return C.Case(name, target)
    if wider and rng.random() < 0.3:  # a family of fixed config
        family = rng.choice(sorted(FIXED))
        fault, where = rng.choice(FIXED[family])
        name = f"random{index}-{family}"
        C.MODELS[name] = (C.MODELS[family][0], {}, {"at": where.format(i=rng.randrange(2))})
        target = rng.choice(["bf16", "mix", "amp16"] + ([] if (family, "fp16") in C.NOT_CLEAN else ["fp16"]))
        return C.Case(name, "fp32" if rng.random() < 0.5 else target, fault, "at", _CLASS.get(fault, "kernel_bug"),
                      "backward" if fault == "backward_only" else "")
    if wider:
        fault, where = rng.choice(WIDER[family])
        C.MODELS[name] = (builder, config, {"at": where.format(i=rng.randrange(config["layers"]))})
        fp32 = rng.random() < 0.5 or fault == "weight_grad"  # (its hand-written backward is not autocast's)
        return C.Case(name, "fp32" if fp32 else target, fault, "at", _CLASS.get(fault, "kernel_bug"),
                      "backward" if fault in ("backward_only", "weight_grad") else "")
    fault = rng.choice(kinds)
    return C.Case(name, "fp32" if rng.random() < 0.5 else target, fault, "act", "kernel_bug",
                  "backward" if fault == "backward_only" else "")


def _zoomed(pair, diagnosis):
    """`precision-tool zoom`'s region of a pair with a statistics side, else None (`bench_diagnosis._zoom_region`)."""
    from bench_diagnosis import _zoom_region
    from precision_tool.dump.reader import open_dump

    with open_dump(pair[0]) as golden, open_dump(pair[1]) as target:
        return _zoom_region(golden, target, diagnosis.verdict)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--faults", action="store_true", help="planted faults instead of clean ports")
    parser.add_argument("--wider", action="store_true",
                        help="with --faults: faults at any layer, in activations, LayerNorms, Linears, attention")
    parser.add_argument("--larger", action="store_true",
                        help="widths 128-256, sequences of 32-64, 2-4 layers (the families' own configs stay)")
    parser.add_argument("--mode", choices=("dump", "stats"), default="dump",
                        help="what both runs record (stats: statistics only, the mode to leave on)")
    parser.add_argument("--level", choices=("op", "module"), default="op",
                        help="what both runs record: every op, or module calls only")
    parser.add_argument("--zoom", action="store_true",
                        help="then collect zoom's region with tensors at op level and judge that verdict (as "
                             "bench_diagnosis.py --zoom)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    right = wrong = skipped = 0
    work = Path(tempfile.mkdtemp(prefix="random_configs_"))
    try:
        for index in range(args.cases):
            case = draw(rng, index, args.faults, args.wider, args.larger)
            config = C.MODELS[case.model][1]
            shutil.rmtree(work / "case", ignore_errors=True)
            start = time.perf_counter()
            try:
                pair = C.collect(case, work / "case", mode=args.mode, level=args.level)
                diagnosis = C.diagnosis_of(*pair)
                region = _zoomed(pair, diagnosis) if args.zoom else None
                if region is not None:  # as `precision-tool zoom` reports it (`zoomed_diagnosis`)
                    diagnosis = zoomed_diagnosis(diagnosis.verdict, C.diagnosis_of(
                        *C.collect(case, work / "case" / "zoom", selection=region.selection())))
                ok, said = C.judge(case, diagnosis)
            except RuntimeError as exc:  # torch's own kernel refuses the config on this CPU
                if "primitive descriptor" not in str(exc):
                    raise
                skipped += 1
                print(json.dumps({"case": case.id, "config": config, "skipped": str(exc).splitlines()[0]}))
                continue
            right, wrong = right + ok, wrong + (not ok)
            print(json.dumps({"case": case.id, "config": config, "right": ok, "verdict": said,
                              "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kind = "named" if args.faults else "clean"
    print(f"{kind} {right}/{right + wrong} (seed {args.seed}{', larger' if args.larger else ''}, {args.mode} mode, "
          f"{args.level} level"
          f"{', then zoom' if args.zoom else ''}; {skipped} skipped: "
          "torch cannot run them here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
