"""Real models, clean targets and planted faults: the diagnosis suite's cases.

Every case trains a tiny-config, random-init model twice for two optimizer
steps under `precision_tool.torch.dump`: a golden float32 run, then a target
run that is either clean (bf16 autocast, simulated mixed precision, simulated
force_fp16) or carries one planted fault. `run_case` writes both dumps and
returns the diagnosis; `judge` says whether the verdict is right. The
verdict logic never sees which model or fault it looks at: the case only
decides what the right answer is.

Used by ``tests/realmodels`` and ``bench/bench_diagnosis.py``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

import precision_tool.torch as ptt

STEPS = 2
CLEAN_TARGETS = ("bf16", "mix", "fp16")


# ---- models (tests/realmodels/models.py) ----------------------------------------------------------

from tests.realmodels.models import (  # noqa: F401 - re-exported for more.py, unseen.py, probed.py, variation.py
    GRUTagger, LSTMLanguageModel, MLPRegressor, MODELS, NOT_CLEAN, Run, SmallCNN, _hf_loss, _quiet_transformers,
    bert, cnn, convnext, distilbert, gpt2, gru, llama, lstm, mlp, resnet, swin, t5, vit)

# ---- faults (tests/realmodels/plant.py) -------------------------------------------------------------

from tests.realmodels.plant import (  # noqa: E402,F401 - the faults, re-exported for more.py, unseen.py, probed.py
    ScaledGradient, _WeightGradientScaled, _patch_forward, activation_gradient_noise, attention_scale, backward_only,
    batchnorm_eval, clamped_input_ids, conv_noise, drop_bias, dropout_left_on, dumped_path, gelu_tanh,
    gradient_noise, handwritten_activation, layernorm_eps, module, naive_softmax, onepass_layernorm, scale_output,
    shifted_ids, sqrt_activation, summed_variance, transposed_weight, weight_gradient)


@dataclass(frozen=True)
class Case:
    """One golden/target pair and the verdict it must get."""

    model: str
    target: str  # bf16 | mix | fp16 | amp16 | fp32 (the precision of the target run; amp16: float16 autocast
    # with a GradScaler)
    fault: str = ""  # "" for a clean run
    role: str = ""  # the module the fault is planted in (MODELS' roles)
    expect_class: str = "none"
    expect_direction: str = ""  # "" any
    model_kwargs: tuple = ()  # extra builder arguments, both runs
    loss_scale: float = 1.0  # target only: loss * scale in backward, gradients unscaled before the update
    condition: str = ""  # a clean difference between the runs (probed.CONDITIONS): a kernel switch, a layout

    @property
    def id(self) -> str:
        return f"{self.model}-{self.fault or 'clean'}-{self.target}" + (f"-{self.condition}" if self.condition else "")

    @property
    def clean(self) -> bool:
        return not self.fault


def optimizer_setting(name: str, change: Callable) -> Callable:
    """A fault that changes one hyperparameter of every param group of the target's optimizer."""
    def plant(run: Run, path: str) -> None:
        for group in run.optimizer.param_groups:
            group[name] = change(group[name])
    return plant


FAULTS: dict[str, Callable] = {
    "scale": scale_output, "handwritten": handwritten_activation, "onepass_ln": onepass_layernorm,
    "naive_softmax": naive_softmax, "backward_only": backward_only, "attn_overflow": None, "loss_scale": None,
    "sqrt_act": sqrt_activation, "ln_eps": layernorm_eps, "gelu_tanh": gelu_tanh, "drop_bias": drop_bias,
    "conv_noise": conv_noise, "attn_scale": attention_scale, "transposed": transposed_weight,
    "weight_grad": weight_gradient, "summed_var": summed_variance, "bn_eval": batchnorm_eval,
    "dropout_on": dropout_left_on, "grad_noise": gradient_noise, "shifted_ids": shifted_ids,
    "act_grad_noise": activation_gradient_noise, "clamped_ids": clamped_input_ids,
    "adam_eps": optimizer_setting("eps", lambda eps: 1e-2), "lr_up": optimizer_setting("lr", lambda lr: lr * 1.5),
    "betas": optimizer_setting("betas", lambda betas: (0.5, betas[1])),
}


# families and faults added later live in more.py
from tests.realmodels import more, probed, probed2, probed3, probed4, unseen  # noqa: E402

more.register(MODELS, FAULTS, NOT_CLEAN)
unseen.register(MODELS, FAULTS, NOT_CLEAN)
probed.register(MODELS, FAULTS, NOT_CLEAN)
probed2.register(MODELS, FAULTS, NOT_CLEAN)
probed3.register(MODELS, FAULTS, NOT_CLEAN)
probed4.register(MODELS, FAULTS, NOT_CLEAN)


def clean_cases() -> list[Case]:
    return [Case(model, target) for model in MODELS if model != "vit-eager" and model not in unseen.MODELS
            for target in CLEAN_TARGETS
            if (model, target) not in NOT_CLEAN and model not in probed.MODELS and model not in probed2.MODELS
            and model not in probed3.MODELS and model not in probed4.MODELS] + \
        more.clean_cases() + unseen.clean_cases() + probed.clean_cases() + probed2.clean_cases() + \
        probed3.clean_cases() + probed4.clean_cases()


def fault_cases() -> list[Case]:
    cases = []
    for model in ("gpt2-sdpa", "bert-eager", "vit", "resnet", "lstm"):
        cases.append(Case(model, "fp32", "scale", "act", "kernel_bug"))
    for model in ("gpt2-eager", "bert-sdpa", "vit", "resnet"):
        cases.append(Case(model, "fp32", "handwritten", "act", "kernel_bug"))
    for model in ("gpt2-sdpa", "bert-eager", "vit"):
        cases.append(Case(model, "fp16", "onepass_ln", "ln", "precision_loss", model_kwargs=(("offset", 16.0),)))
    for model in ("gpt2-eager", "bert-eager", "vit-eager"):
        cases.append(Case(model, "fp16", "attn_overflow", "attn", "overflow", model_kwargs=(("qk_scale", 3000.0),)))
        cases.append(Case(model, "fp16", "naive_softmax", "attn", "overflow", model_kwargs=(("qk_scale", 24.0),)))
    for model in ("gpt2-sdpa", "resnet"):
        cases.append(Case(model, "mix", "loss_scale", "", "overflow", "backward", loss_scale=2.0 ** 24))
    for model in ("gpt2-sdpa", "bert-sdpa", "vit"):
        cases.append(Case(model, "fp32", "backward_only", "act", "kernel_bug", "backward"))
    for model in ("bert-eager", "resnet"):
        cases.append(Case(model, "fp32", "sqrt_act", "act", "invalid_operation"))
    # the same under a simulated device's saturation mode, which writes the NaN as 0 and raises the float status
    for model, target in (("gpt2-eager", "mix"), ("resnet", "mix"), ("bert-eager", "fp16")):
        cases.append(Case(model, target, "sqrt_act", "act", "invalid_operation"))
    # a LayerNorm whose variance sums instead of averaging, in float16: its mean is ill-conditioned there, but
    # run again in golden's precision it still departs: another function, not a precision loss
    for model in ("bert-token", "bert-relkey"):
        cases.append(Case(model, "fp16", "summed_var", "ln", "kernel_bug"))
    # a 5 % gradient change in a low-precision run, under the noise its incoming gradient carries there (float16
    # convolutions' backward: the group's inputs 17 % from golden's); on golden's gradient it stands alone
    cases.append(Case("resnet", "bf16", "backward_only", "act", "kernel_bug", "backward"))
    for target in ("fp16", "amp16"):
        cases.append(Case("resnet-bottleneck", target, "backward_only", "act", "kernel_bug", "backward"))
    # model families the cases above do not hold: RMSNorm and rotary (llama), encoder-decoder (t5), depthwise
    # convolutions (convnext), a GRU
    for model in ("llama", "convnext", "t5", "gru"):
        cases.append(Case(model, "fp32", "scale", "act", "kernel_bug"))
    for model in ("llama", "distilbert", "gru"):
        cases.append(Case(model, "fp32", "backward_only", "act", "kernel_bug", "backward"))
    cases.append(Case("swin", "bf16", "backward_only", "act", "kernel_bug", "backward"))  # windowed attention
    for model in ("distilbert", "convnext"):
        cases.append(Case(model, "fp32", "handwritten", "act", "kernel_bug"))
    cases.append(Case("distilbert", "fp16", "onepass_ln", "ln", "precision_loss", model_kwargs=(("offset", 16.0),)))
    cases.append(Case("t5", "fp32", "sqrt_act", "act", "invalid_operation"))
    cases.append(Case("llama", "mix", "loss_scale", "", "overflow", "backward", loss_scale=2.0 ** 24))
    # the right kernels called wrongly, or with a small error of their own
    cases.append(Case("bert-eager", "fp32", "ln_eps", "ln2", "kernel_bug"))
    cases.append(Case("vit", "fp32", "ln_eps", "ln", "kernel_bug"))
    cases.append(Case("bert-eager", "fp32", "gelu_tanh", "act", "kernel_bug"))
    cases.append(Case("vit", "fp32", "gelu_tanh", "act", "kernel_bug"))
    cases.append(Case("bert-eager", "fp32", "drop_bias", "fc", "kernel_bug"))
    cases.append(Case("resnet", "fp32", "conv_noise", "conv", "kernel_bug"))
    # code bugs that keep every shape: a wrong attention scale, a transposed weight, a wrong gradient of a
    # hand-written Linear, a variance summed instead of averaged, BatchNorm in eval mode, a stray dropout
    cases.append(Case("bert-sdpa", "fp32", "attn_scale", "attn", "kernel_bug"))
    cases.append(Case("gpt2-eager", "fp32", "attn_scale", "attn", "kernel_bug"))
    cases.append(Case("mlp", "fp32", "transposed", "fc", "kernel_bug"))
    cases.append(Case("mlp", "fp32", "weight_grad", "fc", "kernel_bug", "backward"))
    cases.append(Case("mlp", "fp32", "summed_var", "ln", "kernel_bug"))
    cases.append(Case("cnn", "fp32", "bn_eval", "bn", "kernel_bug"))
    cases.append(Case("cnn", "fp32", "dropout_on", "act", "kernel_bug"))
    # faults outside any paired op: a gradient hook only the target has, token ids shifted before the lookup
    cases.append(Case("mlp", "fp32", "grad_noise", "fc", "kernel_bug", "backward"))
    # the optimizer configured differently: its update ops are called with another eps, lr or beta
    cases.append(Case("mlp", "fp32", "adam_eps", "", "kernel_bug", "optimizer"))
    cases.append(Case("resnet", "fp32", "lr_up", "", "kernel_bug", "optimizer"))
    cases.append(Case("bert-eager", "fp32", "betas", "", "kernel_bug", "optimizer"))
    cases.append(Case("bert-eager", "fp32", "grad_noise", "fc", "kernel_bug", "backward"))
    cases.append(Case("gru", "fp32", "shifted_ids", "embed", "kernel_bug"))
    cases.append(Case("bert-eager", "fp32", "shifted_ids", "embed", "kernel_bug"))
    cases.append(Case("cnn", "fp32", "act_grad_noise", "act", "kernel_bug", "backward"))
    cases.append(Case("gpt2-eager", "fp32", "clamped_ids", "embed", "kernel_bug"))
    # a 2 % scale in a bf16 autocast run: under bfloat16's noise floor (6 %), named where a computation only the
    # target runs rewrote a value (`departures.rewritten`)
    for model in ("gpt2-sdpa", "bert-sdpa", "vit", "resnet"):
        cases.append(Case(model, "bf16", "scale", "act", "kernel_bug"))
    # another function under a 16-bit run's floor, which float64 on golden's inputs shows (`rewrites`): a
    # hand-written GELU under bf16 (0.9 %), a convolution's added noise under float16 (1 %)
    cases.append(Case("gpt2-eager", "bf16", "handwritten", "act", "kernel_bug"))
    # ... and within bf16's floor as recorded (0.92 % on golden's inputs in bf16, under its 1 %): a model cast
    # whole to bf16
    cases.append(Case("gpt2-eager", "fp32", "handwritten", "act", "kernel_bug", condition="bf16-params"))
    cases.append(Case("resnet", "mix", "conv_noise", "conv", "kernel_bug"))
    # a gradient hook's 1 % noise on a float16 weight gradient that carries 0.18 % (`departures.floating`, in
    # quadrature), and behind a GradScaler's unscaling, which only scales (`departures._changer`)
    for target in ("fp16", "amp16"):
        cases.append(Case("bert-eager", target, "grad_noise", "fc", "kernel_bug", "backward"))
    # a 5 % gradient scale under bf16's backward noise (10 % at a ResNet's residual add): a convolution's group
    # replayed on golden's inputs (its weight cast by autocast is golden's weight), and a scale only the target
    # runs where golden's module runs no backward (an identity shortcut; a pooler's own ops)
    for role in ("conv", "shortcut"):
        cases.append(Case("resnet", "bf16", "backward_only", role, "kernel_bug", "backward"))
    cases.append(Case("bert-eager", "bf16", "backward_only", "pooler", "kernel_bug", "backward"))
    return cases + more.fault_cases() + unseen.fault_cases() + probed.fault_cases() + probed2.fault_cases() + \
        probed3.fault_cases() + probed4.fault_cases()


# ---- running a case ----------------------------------------------------------------------------

_UNSUPPORTED: dict[tuple[str, str], str | None] = {}


def unsupported(case: Case) -> str | None:
    """Why this CPU cannot run ``case`` at all (its torch kernel fails, with or without us), else None.

    oneDNN's bf16 LSTM primitive needs AVX-512 (BF16) or AMX: on an AVX2-only
    CPU such as an older AMD EPYC, torch's own bf16 autocast LSTM raises
    "could not create a primitive descriptor". The case is then skipped, not failed.
    """
    key = (case.model, case.target)
    if key not in _UNSUPPORTED:
        _UNSUPPORTED[key] = None
        if case.model == "lstm" and case.target == "bf16":
            layer = nn.LSTM(4, 4, batch_first=True)
            try:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    layer(torch.zeros(1, 2, 4))
            except RuntimeError as exc:
                _UNSUPPORTED[key] = f"torch's bf16 LSTM does not run on this CPU: {str(exc).splitlines()[0]}"
    return _UNSUPPORTED[key]


def build(case: Case, seed: int = 0) -> Run:
    builder, kwargs, _ = MODELS[case.model]
    torch.manual_seed(seed)
    return builder(**kwargs, **dict(case.model_kwargs))


def train(run: Run, steps: int = STEPS, loss_scale: float = 1.0, scaler=None) -> list[float]:
    """``steps`` optimizer steps; ``loss_scale``: a fixed scale, gradients unscaled before the update;
    ``scaler``: a GradScaler's dynamic loss scaling (the target's loss scale recorded at each step)."""
    losses = []
    for _ in range(steps):
        run.optimizer.zero_grad()
        for k in range(run.accumulate):
            with _autocast_region():
                loss = run.loss(run.model, _micro_batch(run, k))
            part = loss / run.accumulate if run.divide and run.accumulate > 1 else loss
            if scaler is not None:
                part = scaler.scale(part)
            (part * loss_scale if loss_scale != 1.0 else part).backward()
        if loss_scale != 1.0:
            with torch.no_grad():
                for p in run.model.parameters():
                    if p.grad is not None:
                        p.grad.div_(loss_scale)
        if scaler is not None:
            scaler.unscale_(run.optimizer)
        if run.clip is not None:
            nn.utils.clip_grad_norm_(run.model.parameters(), run.clip)
        if scaler is None:
            run.optimizer.step()
            ptt.step(loss, loss_scale)
        else:
            scaler.step(run.optimizer)
            ptt.step(loss, scaler.get_scale())
            scaler.update()
        losses.append(float(loss.detach()))
    return losses


def _micro_batch(run: Run, k: int) -> dict:
    if run.accumulate == 1:
        return run.batch
    return {key: value.chunk(run.accumulate)[k] if torch.is_tensor(value) and value.dim() else value
            for key, value in run.batch.items()}


_AUTOCAST: list = []


@contextlib.contextmanager
def _autocast_region():
    """The forward pass (only) under the target's autocast, as torch recommends."""
    with (torch.autocast("cpu", dtype=_AUTOCAST[0]) if _AUTOCAST else contextlib.nullcontext()):
        yield


def _target_context(target: str):
    if target == "mix":
        return ptt.simulate_npu("allow_mix_precision")
    if target == "fp16":
        return ptt.simulate_npu("force_fp16")
    return contextlib.nullcontext()


def _dnn(case: Case):
    return torch.backends.mkldnn.flags(enabled=False) if case.model.endswith("nodnn") else contextlib.nullcontext()


def collect(case: Case, workdir: Path, mode: str = "dump", goldens: Path | None = None,
            level: str = "op", selection: dict | None = None) -> tuple[Path, Path]:
    """Write golden.h5 and target.h5 of ``case`` into ``workdir``; with ``goldens``, one golden dump per model
    and model arguments is kept there and shared by the cases that need it. ``level``: ptt.dump's capture
    level ("module": module calls only); ``selection``: what both record, as `ZoomRegion.selection` gives
    it (steps, ops, modules, backward)."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "target.h5"
    chosen = {} if selection is None else {"steps": selection["steps"], "ops": selection["ops"] or None,
                                           "modules": selection["modules"] or True,
                                           "backward": selection["backward"]}
    golden_side, target_side, setup = probed.CONDITIONS.get(case.condition, probed.NO_CONDITION)
    golden = workdir / "golden.h5" if goldens is None else \
        goldens / (f"{case.model}-{'-'.join(f'{k}{v}' for k, v in case.model_kwargs)}-{mode}-{level}"
                   f"{'-' + case.condition if golden_side is not contextlib.nullcontext else ''}.h5")
    with _dnn(case):
        if not golden.exists():
            run = build(case)
            with golden_side(), ptt.dump(golden, mode=mode, model=case.model, seed=0, level=level, **chosen):
                train(run, run.steps or STEPS)
        run = build(case)
        setup(run)
        if case.fault and FAULTS[case.fault] is not None:
            FAULTS[case.fault](run, MODELS[case.model][2].get(case.role, ""))  # role "": the whole run
        _AUTOCAST[:] = {"bf16": [torch.bfloat16], "amp16": [torch.float16]}.get(case.target, [])
        scaler = torch.amp.GradScaler("cpu", **{"init_scale": 2.0 ** 10, **(run.scaler or {})}) \
            if case.target == "amp16" else None
        try:
            with target_side(), _target_context(case.target), \
                    ptt.dump(target, mode=mode, model=case.model, seed=0, level=level, **chosen):
                train(run, run.steps or STEPS, loss_scale=case.loss_scale, scaler=scaler)
        finally:
            _AUTOCAST.clear()
    return golden, target


def run_case(case: Case, workdir: Path, mode: str = "dump"):
    """Collect ``case`` (both runs in ``mode``) and diagnose it; returns the `Diagnosis`."""
    return diagnosis_of(*collect(case, workdir, mode=mode))


def diagnosis_of(golden: Path, target: Path):
    """The `Diagnosis` of two dump files."""
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    with open_dump(golden) as g, open_dump(target) as t:
        return diagnose(g, t)


def tiny_gpt2(seed: int | None = 1):
    """A 2-layer GPT-2 of width 32 (2 heads), vocabulary 64, dropout off, seeded (None: from torch's state as it
    is): the real-model tests' language model."""
    import torch
    import transformers as tf

    _quiet_transformers()
    if seed is not None:
        torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def token_batches(count: int, low: int = 0, seed: int = 100) -> list:
    """``count`` batches of token ids in [low, 64), each (3, 10), from a generator seeded with ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(low, 64, (3, 10), generator=generator) for _ in range(count)]


def tiny_bert_classifier(seed: int = 1):
    """A 2-layer BERT of width 32 (2 heads), 3 labels, dropout off, seeded: the hook and loss-scaling tests' model."""
    import torch
    import transformers as tf

    _quiet_transformers()
    torch.manual_seed(seed)
    return tf.BertForSequenceClassification(tf.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3))


def fit(path: Path, model, optimizer, loss_of, batches, mode: str = "dump", scaler=None, **options) -> None:
    """Train ``model`` one optimizer step a batch inside ``ptt.dump(path, mode, **options)`` (``level``,
    ``steps``), each step's loss recorded: ``loss_of(model, batch)``; through ``scaler`` (a GradScaler), its
    scale recorded, where given."""
    import precision_tool.torch as ptt

    with ptt.dump(path, mode=mode, **options):
        for batch in batches:
            loss = loss_of(model, batch)
            optimizer.zero_grad()
            if scaler is None:
                loss.backward()
                optimizer.step()
                ptt.step(loss)
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                ptt.step(loss, scaler.get_scale())


def bert_layernorm_by_hand(path: Path, by_hand: bool, steps: int, mode: str = "dump") -> None:
    """A float32 BERT trained with SGD and momentum, its layer 1 attention LayerNorm written by hand where
    ``by_hand`` (the same function in other ops)."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3)
    config._attn_implementation = "eager"
    model = tf.BertForSequenceClassification(config)
    if by_hand:
        norm = model.bert.encoder.layer[1].attention.output.LayerNorm
        norm.forward = lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(
            x.var(-1, unbiased=False, keepdim=True) + norm.eps) * norm.weight + norm.bias
    generator = torch.Generator().manual_seed(39)
    batches = [(torch.randint(3, 64, (3, 10), generator=generator), torch.randint(0, 3, (3,), generator=generator))
               for _ in range(steps)]
    fit(path, model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        lambda m, b: m(input_ids=b[0], labels=b[1]).loss, batches, mode=mode)


def judge(case: Case, diagnosis) -> tuple[bool, str]:
    """(right, why): a clean case wants class none; a fault its class, direction and module."""
    verdict = diagnosis.verdict
    said = f"{verdict.cls} at {verdict.op} ({verdict.direction})"
    if case.clean:
        return verdict.cls == "none", said
    if verdict.cls != case.expect_class:
        return False, said
    if case.expect_direction and verdict.direction != case.expect_direction:
        return False, said
    if case.role:
        _, _, roles = MODELS[case.model]
        where = "." + (verdict.module or verdict.op or "").replace("/", ".") + "."
        if f".{roles[case.role]}." not in where:
            return False, said
    return True, said


def isclose_losses(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b))
