"""Run variations the suite's fixed loop (cases.train) does not make: loss scaling by torch.amp.GradScaler, gradient
clipping, more steps, other widths and depths, other optimizers, faults under bf16 autocast.

Each `Variation` builds a golden float32 run and a target run of one model with its own training loop and names
the verdict the pair must get. A GradScaler loop records the steps in one of three ways: ``ptt.step(loss, scale)``
before ``scaler.update()`` (the scale recorded), ``ptt.step(loss)`` (no scale: the diagnosis reads it off the
gradients), or no ``ptt.step`` at all (steps end at the optimizer).

Used by ``tests/realmodels/test_variation.py`` and ``bench/bench_diagnosis.py``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import precision_tool.torch as ptt


@dataclass(frozen=True)
class Variation:
    model: str  # gpt2 | mlp | cnn | bert | vit (the last two: the suite's tiny configs)
    target: str  # fp32 | bf16 | amp (fp16 autocast and a GradScaler) | mix | mixamp (mix and a GradScaler) | cast
    # (model.to(torch.bfloat16) inside the dump: weights, optimizer state and data in bfloat16) | half (the same
    # in float16)
    fault: str = ""  # a fault of cases.FAULTS
    role: str = ""
    expect_class: str = "none"
    expect_direction: str = ""
    steps: int = 2
    width: int = 32
    layers: int = 2
    optimizer: str = ""  # sgd | momentum | adam | adamw ("" the model's own)
    lr: float = 0.0  # 0: the optimizer's own (0.05 for SGD, 1e-3 for Adam)
    clip: float = 0.0  # clip_grad_norm_ to this (after unscale_ under a GradScaler)
    init_scale: float = 2.0 ** 16  # GradScaler's first scale
    record: str = "scale"  # GradScaler loops: scale | loss | none (what ptt.step is given) | updated (the scale
    # read after scaler.update())
    seed: int = 0
    dropout: float = 0.0  # gpt2: every dropout probability (the same seed in both runs draws the same masks)
    evaluate: bool = False  # a validation forward (eval mode, no_grad) after each update
    implementation: str = ""  # foreach | fused: the target's optimizer runs that implementation, golden's the
    # per-parameter loop (as a CPU golden run and a CUDA target run of the same script do by default)
    attention: str = ""  # math: the target's scaled_dot_product_attention runs the math backend, golden's the
    # fused CPU kernel (a GPU target picks its own kernels)
    overflow_mode: str = ""  # mix and mixamp targets: the simulator's overflow mode ("": its default, saturation)
    checkpoint: str = ""  # gpt2: the target recomputes its blocks in backward (reentrant | nonreentrant:
    # transformers' gradient checkpointing), as a port does to fit an accelerator's memory
    golden_eval: bool = False  # golden trains with its modules in eval mode: dropout is on in the target alone
    draws: int = -1  # >= 0: the target's generator reseeded to this once its model is built, the seed recorded
    # alike: other dropout masks than golden's, as an accelerator's generator draws (the verdict: none, there)

    @property
    def id(self) -> str:
        extra = [f"{k}{v}" for k, v in (("w", self.width), ("l", self.layers), ("s", self.steps)) if v != {
            "w": 32, "l": 2, "s": 2}[k]]
        extra += [x for x, on in ((self.optimizer, self.optimizer), (f"clip{self.clip:g}", self.clip),
                                  (f"rec-{self.record}", self.scaled and self.record != "scale"),
                                  (f"scale2^{int(self.init_scale).bit_length() - 1}",
                                   self.scaled and self.init_scale != 2.0 ** 16),
                                  (f"lr{self.lr:g}", self.lr), (f"seed{self.seed}", self.seed),
                                  (f"drop{self.dropout:g}", self.dropout), ("eval", self.evaluate),
                                  (self.implementation, self.implementation),
                                  (f"attn-{self.attention}", self.attention),
                                  (self.overflow_mode, self.overflow_mode),
                                  (f"draws{self.draws}", self.draws >= 0),
                                  ("golden-eval", self.golden_eval),
                                  (f"ckpt-{self.checkpoint}", self.checkpoint)) if on]
        return "-".join(["var", self.model, self.fault or "clean", self.target, *extra])

    @property
    def clean(self) -> bool:
        """No fault planted, nor a setup that breaks the run (dropout on in one run only, a model in float16
        throughout): the verdict must be none."""
        return self.expect_class == "none"

    @property
    def scaled(self) -> bool:
        """The target loop runs a GradScaler."""
        return self.target in ("amp", "mixamp")


def build(v: Variation, target: bool = False):
    """(Run, roles) of ``v``'s model, seeded; the target's optimizer in ``v.implementation``."""
    from tests.realmodels.cases import MLPRegressor, Run, SmallCNN, _hf_loss, _quiet_transformers

    torch.manual_seed(v.seed)
    if v.model == "gpt2":
        tf = _quiet_transformers()
        config = tf.GPT2Config(n_layer=v.layers, n_embd=v.width, n_head=4, vocab_size=64, n_positions=16,
                               resid_pdrop=v.dropout, embd_pdrop=v.dropout, attn_pdrop=v.dropout, bos_token_id=0,
                               eos_token_id=0)
        model = tf.GPT2LMHeadModel(config)
        ids = torch.randint(0, 64, (4, 16))
        run = Run(model, None, {"input_ids": ids, "labels": ids}, _hf_loss)
        roles = {"act": f"transformer.h.{v.layers - 1}.mlp.act", "fc": "transformer.h.0.mlp.c_fc",
                 "drop": "transformer.drop"}
        default = "adamw"
    elif v.model in ("bert", "vit"):  # the suite's tiny configs (cases.bert, cases.vit), SDPA attention
        from tests.realmodels import cases

        run = getattr(cases, v.model)("sdpa")
        roles = {"attn": f"{v.model}.encoder.layer.0.attention" if v.model == "bert" else "vit.layers.0.attention"}
        default = "adamw"
    elif v.model == "mlp":
        model = MLPRegressor(v.width)
        batch = {"x": torch.randn(32, 20), "y": torch.randn(32, 1)}
        run = Run(model, None, batch, lambda model, batch: nn.functional.mse_loss(model(batch["x"]), batch["y"]))
        roles, default = {"act": "act", "fc": "fc2"}, "adam"
    elif v.model == "cnn":
        model = SmallCNN()
        batch = {"x": torch.randn(8, 3, 16, 16), "y": torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])}
        run = Run(model, None, batch,
                  lambda model, batch: nn.functional.cross_entropy(model(batch["x"]), batch["y"]))
        roles, default = {"act": "act2", "bn": "bn1"}, "momentum"
    else:
        raise ValueError(v.model)
    if target and v.checkpoint:
        run.model.activation_checkpointing_enable({"use_reentrant": v.checkpoint == "reentrant"})
    params = list(run.model.parameters())
    sgd_lr, adam_lr = v.lr or 0.05, v.lr or 1e-3
    how = {v.implementation: True} if target and v.implementation else {"foreach": False}
    run.optimizer = {"sgd": lambda: torch.optim.SGD(params, lr=sgd_lr, **how),
                     "momentum": lambda: torch.optim.SGD(params, lr=sgd_lr, momentum=0.9, **how),
                     "adam": lambda: torch.optim.Adam(params, lr=adam_lr, **how),
                     "adamw": lambda: torch.optim.AdamW(params, lr=adam_lr, **how)}[v.optimizer or default]()
    return run, roles


def train(run, v: Variation, target: bool) -> None:
    autocast = {"bf16": torch.bfloat16, "amp": torch.float16}.get(v.target) if target else None
    if target and v.target in ("cast", "half"):  # inside the dump: the cast's copies are recorded, as in a user's
        cast = torch.bfloat16 if v.target == "cast" else torch.float16  # script
        run.model.to(cast)
        run.batch = {k: x.to(cast) if x.is_floating_point() else x for k, x in run.batch.items()}
    scaler = torch.amp.GradScaler("cpu", init_scale=v.init_scale) if target and v.scaled else None
    if v.golden_eval and not target:
        run.model.eval()
    for _ in range(v.steps):
        with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
            loss = run.loss(run.model, run.batch)
        run.optimizer.zero_grad()
        scale = scaler.get_scale() if scaler is not None else 1.0
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None and v.clip:
            scaler.unscale_(run.optimizer)
        if v.clip:
            nn.utils.clip_grad_norm_(run.model.parameters(), v.clip)
        if scaler is None:
            run.optimizer.step()
            ptt.step(loss)
            _validate(run, v, autocast)
            continue
        scaler.step(run.optimizer)
        if v.record == "scale":
            ptt.step(loss, scale)
        elif v.record == "loss":
            ptt.step(loss)
        scaler.update()
        if v.record == "updated":  # docs/torch.md's order: the scale read after the update (the next step's)
            ptt.step(loss, scaler.get_scale())
        _validate(run, v, autocast)


def _validate(run, v: Variation, autocast) -> None:
    """A validation forward after the update, when ``v`` asks for one: no gradient, dropout off."""
    if not v.evaluate:
        return
    run.model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
        run.loss(run.model, run.batch)
    run.model.train()


def collect(v: Variation, workdir: Path, mode: str = "dump", level: str = "op") -> tuple[Path, Path]:
    """Write golden.h5 and target.h5 of ``v`` into ``workdir``, in capture ``mode`` at ``level``."""
    from tests.realmodels.cases import FAULTS

    workdir.mkdir(parents=True, exist_ok=True)
    golden, target = workdir / "golden.h5", workdir / "target.h5"
    run, _ = build(v)
    with ptt.dump(golden, mode=mode, seed=0, level=level):
        train(run, v, False)
    run, roles = build(v, target=True)
    if v.fault and FAULTS[v.fault] is not None:
        FAULTS[v.fault](run, roles.get(v.role, ""))
    modes = (v.overflow_mode,) if v.overflow_mode else ()
    context = ptt.simulate_npu("allow_mix_precision", *modes) if v.target in ("mix", "mixamp") else \
        contextlib.nullcontext()
    if v.draws >= 0:
        torch.manual_seed(v.draws)
    with context, _attention(v), ptt.dump(target, mode=mode, seed=0, level=level):
        train(run, v, True)
    return golden, target


def _attention(v: Variation):
    """The SDPA backend the target runs, where ``v`` names one."""
    if not v.attention:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"math": SDPBackend.MATH}[v.attention])


def judge(v: Variation, diagnosis, roles: dict) -> tuple[bool, str]:
    from precision_tool.analysis.randomness import is_random_draw

    verdict = diagnosis.verdict
    said = f"{verdict.cls} at {verdict.op} ({verdict.direction})"
    if verdict.cls != v.expect_class or (v.expect_direction and verdict.direction != v.expect_direction):
        return False, said
    if v.draws >= 0 and not is_random_draw(verdict.type or ""):  # stopped at the first draw unlike golden's
        return False, said
    if v.role:
        where = "." + (verdict.module or verdict.op or "").replace("/", ".") + "."
        if f".{roles[v.role]}." not in where:
            return False, said
    return True, said


def run_variation(v: Variation, workdir: Path, mode: str = "dump", level: str = "op"):
    """Collect ``v`` (in capture ``mode``, at ``level``) and diagnose it: (diagnosis, right, said)."""
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    golden, target = collect(v, workdir, mode, level)
    with open_dump(golden) as g, open_dump(target) as t:
        diagnosis = diagnose(g, t)
    right, said = judge(v, diagnosis, build(v)[1])
    return diagnosis, right, said


K = "kernel_bug"
VARIATIONS = [
    # loss scaling by a GradScaler: the scale recorded, given to nobody (read off the seed gradient), or no
    # ptt.step at all; clipping after unscale_ (the scaler's loss * scale shifts the names of the clip's ops);
    # a first scale that overflows, so that the scaler skips updates before it trains
    Variation("mlp", "amp"),
    Variation("mlp", "amp", record="loss"),
    Variation("cnn", "amp", record="none"),
    Variation("gpt2", "amp", clip=1.0),
    Variation("mlp", "amp", steps=4, init_scale=2.0 ** 20),
    # the optimizer called with another lr under bf16: with a small lr its update departs from golden by less
    # than the bf16 noise its gradients carry, and is still named
    Variation("mlp", "bf16", "lr_up", "", K, "optimizer"),
    Variation("cnn", "bf16", "lr_up", "", K, "optimizer", lr=1e-3),
    # other sizes, steps, optimizers and seeds than the suite's, clean and with a fault
    Variation("gpt2", "bf16", width=64, layers=3, steps=4),
    Variation("gpt2", "mix", "scale", "act", K, width=128, layers=1, optimizer="momentum"),
    Variation("mlp", "fp32", "backward_only", "act", K, "backward", steps=5, optimizer="sgd", seed=3),
]
VARIATIONS += [
    # the whole model cast to bfloat16 inside the dump (weights, optimizer state and data in bfloat16): the cast
    # reads every BatchNorm running mean before native_batch_norm updates it undeclared; dropout drawn alike in
    # both runs, and a validation forward after every update
    Variation("cnn", "cast"),
    Variation("gpt2", "cast", steps=3),
    Variation("cnn", "cast", "scale", "act", K),
    Variation("gpt2", "bf16", steps=3, dropout=0.1, evaluate=True),
    Variation("cnn", "amp", steps=4, evaluate=True),
]
VARIATIONS += [
    # a first scale so high that the GradScaler skips every update of the run: golden's gradients times the scale
    # are beyond float16 at every step, the scale is still halving when the run ends; recorded after the update
    # (half what the gradients carry at a skipped step), read off the gradients, or no ptt.step at all (the
    # scaler's update ends each iteration, no optimizer step does); a forward fault under the same
    # loop (a backward fault there is out of reach: every gradient of every step is inf or NaN)
    Variation("gpt2", "amp", steps=3, init_scale=2.0 ** 24, record="loss"),
    Variation("cnn", "amp", steps=3, init_scale=2.0 ** 24, record="updated"),
    Variation("gpt2", "amp", steps=3, init_scale=2.0 ** 24, record="none"),
    Variation("cnn", "amp", "scale", "act", K, steps=3, init_scale=2.0 ** 24, record="updated"),
]
VARIATIONS += [
    # the target's optimizer in foreach or fused kernels, golden's a per-parameter loop (a CPU golden and a CUDA
    # target of one script): Adam's normalised update turns the gradients' low-precision noise into a large
    # error on the parameters, which a replay of the target's kernels on golden's gradients shows inherited
    # (analysis/updates.py); a changed lr is still named there. Fused with a GradScaler: the kernel unscales.
    Variation("gpt2", "bf16", implementation="fused"),
    Variation("gpt2", "fp32", steps=3, implementation="fused"),
    Variation("cnn", "bf16", steps=3, implementation="foreach"),
    Variation("mlp", "amp", implementation="fused"),
    Variation("mlp", "bf16", "lr_up", "", K, "optimizer", implementation="foreach"),
    Variation("cnn", "bf16", "lr_up", "", K, "optimizer", lr=1e-3, implementation="fused"),
    # the target's attention in SDPA's math backend, golden's in the fused CPU kernel: the math backward hands
    # the key gradient on transposed (compared where the key projection's backward reads it), and the two
    # algorithms' float32 results differ by 1e-5, below REWRITE_FLOOR; with a fused optimizer under bf16 too
    Variation("bert", "fp32", attention="math"),
    Variation("vit", "fp32", attention="math"),
    Variation("bert", "bf16", attention="math", implementation="fused"),
]
VARIATIONS += [
    # the simulated NPU with a GradScaler: its scale (2**16 by default, beyond float16) is float32 bookkeeping;
    # a scale so high that the first updates are skipped while it halves, in either overflow mode (saturation:
    # the check reads the float status, as torch_npu's does); a forward fault under the scaler
    Variation("gpt2", "mixamp", steps=3),
    Variation("cnn", "mixamp", steps=3, init_scale=2.0 ** 24, record="updated", overflow_mode="inf_nan"),
    Variation("cnn", "mixamp", steps=3, init_scale=2.0 ** 24, record="updated"),
    Variation("gpt2", "mixamp", "scale", "act", K, steps=3, overflow_mode="inf_nan"),
]
VARIATIONS += [
    # the target's generator draws other dropout masks than golden's (another seed, an accelerator's generator):
    # nothing after the first mask compares, and the scan stops there with none, not at the first op whose
    # checks the other masks trip (a clean float32 port blamed an attention cat); with the same masks, a
    # fault after dropout under bf16 and under the simulated NPU is still named
    Variation("gpt2", "fp32", dropout=0.1, draws=1),
    Variation("gpt2", "bf16", dropout=0.1, draws=1),
    Variation("gpt2", "mix", dropout=0.1, draws=7),
    Variation("gpt2", "bf16", "scale", "act", K, dropout=0.1),
    Variation("gpt2", "mix", "scale", "act", K, dropout=0.1),
    # golden trained with dropout off (its modules in eval mode), the target with it on: the first dropout that
    # draws in one run only is named, as an argument called differently is (not as a kernel to check)
    Variation("gpt2", "fp32", "", "drop", K, "forward", dropout=0.1, golden_eval=True),
    Variation("gpt2", "bf16", "", "drop", K, "forward", dropout=0.1, golden_eval=True),
    # the target recomputes its blocks in backward (gradient checkpointing), golden does not: recomputed ops take
    # the first call's names, so the backward ops their nodes run pair with golden's (reentrant: 4 backward adds
    # were paired with another op's, cosine 0.004, and failed `check` on a clean float32 port)
    Variation("gpt2", "fp32", checkpoint="reentrant"),
    Variation("gpt2", "bf16", checkpoint="nonreentrant"),
    Variation("gpt2", "bf16", "scale", "act", K, checkpoint="reentrant"),
    Variation("gpt2", "mix", "scale", "act", K, checkpoint="reentrant"),
    # the whole model in float16 (model.half()), Adam's update too: its eps and the second moments of small
    # gradients round to 0, the update divides by zero, and the loss is NaN from the next step; the update's
    # inputs already depart from golden's by rounding alone (8.5 %), which hid the overflow (verdict none)
    Variation("gpt2", "half", "", "", "overflow", "optimizer"),
    Variation("bert", "half", "", "", "overflow", "optimizer"),
]
