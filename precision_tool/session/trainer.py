"""`Session`: trains a model step by step on a device, calling hooks around every op.

One step (numbered from 0):

1. ``executor.begin_step(step)`` and clear the float status: the overflow
   window is forward plus backward, as in npu_bridge's NPULossScaleOptimizer
   (read after the gradients, cleared for the next step);
2. forward on the batch of ``np.random.default_rng([seed, step])``;
3. backward seeded with ``{"loss": float32(loss_scale)}``;
4. unscale in float32: every gradient times ``float32(1 / scale)`` (the
   reciprocal taken in float64, as torch's GradScaler does);
5. overflow: the float status on an npu in saturation mode, else any
   non-finite gradient (inf_nan mode, and golden);
6. the loss-scale manager's update; on overflow (when it checks overflow)
   the optimizer update and the global-step increment are skipped; with no
   manager the overflow is reported and the update applied anyway;
7. the optimizer update, one ``run_external`` op per parameter.

`Session.step` returns ``(loss, overflow, loss_scale)``, with the scale the
step's loss was multiplied by (as MindSpore's TrainOneStepWithLossScaleCell
returns it); ``StepResult.extra`` adds ``next_loss_scale``, ``global_step``
and ``first_overflow_op`` (the op that first raised the float status).

After the update, on the schedule of `SessionConfig` (Rec SDK's), the step
may evaluate the model on held-out batches (``StepResult.extra["evaluation"]``
and `RunSummary.evaluations`) and write a checkpoint (`checkpoint`); a
session built with ``if_load`` first restores one and continues from it bit
for bit.

With ``accelerate_train_mode`` the graph is compiled for the low-precision
device first; when the trigger fires after a step, ``session.device``,
``session.program`` and ``session.executor`` are replaced once by ones for the
original device (the same hooks and float status), and the next step run is
recorded as ``accelerate_switch_step``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from precision_tool import __version__
from precision_tool.engine.device import DeviceProfile
from precision_tool.engine.executor import Executor
from precision_tool.engine.hooks import HookList, Interruptible, StepResult
from precision_tool.engine.layers import trace
from precision_tool.engine.program import Program, compile_graph
from precision_tool.engine.status import FloatStatus
from precision_tool.errors import ConfigError, InputError
from precision_tool.session.accelerate import AccelerateTrainMode
from precision_tool.session.boost import Boost
from precision_tool.session.checkpoint import (Checkpoint, find_checkpoint, load_checkpoint,
                                               refuse_foreign_checkpoints, save_checkpoint)
from precision_tool.session.config import SessionConfig
from precision_tool.session.data import EVAL_SET_BATCHES, SyntheticData
from precision_tool.session.loss_scale import unscale
from precision_tool.session.models import load_model
from precision_tool.session.optim import DEFAULT_LR, make_optimizer


@dataclass
class RunSummary:
    """What a whole run did, step by step."""

    results: list[StepResult] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    loss_scale_history: list[float] = field(default_factory=list)  # the scale each step used
    overflow_steps: list[int] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    accelerate_switch_step: int | None = None  # the first step run at the original precision
    global_step: int = 0  # applied optimizer updates
    evaluations: list[dict] = field(default_factory=list)  # held-out metric after the steps the schedule says
    checkpoints: list[str] = field(default_factory=list)  # files written, in order
    resumed_from: int | None = None  # the checkpoint step this session started from

    def to_dict(self) -> dict:
        """JSON-serialisable form, passed to ``on_run_end``."""
        return {
            "steps": len(self.results),
            "losses": list(self.losses),
            "loss_scale_history": list(self.loss_scale_history),
            "overflow_steps": list(self.overflow_steps),
            "skipped_steps": list(self.skipped_steps),
            "accelerate_switch_step": self.accelerate_switch_step,
            "global_step": self.global_step,
            "evaluations": list(self.evaluations),
            "checkpoints": list(self.checkpoints),
            "resumed_from": self.resumed_from,
            "results": [asdict(r) for r in self.results],
        }


class Session:
    """A training run: the model, its data, weights, optimizer and loss scale on a device."""

    def __init__(self, config: SessionConfig, hooks=()):
        self.config = config
        self.hooks = hooks if isinstance(hooks, HookList) else HookList(hooks)
        loaded = load_model(config.model, np.random.default_rng(config.seed))
        self.model = loaded.model
        # -- boost: rewrites the model before it is traced (LessBN), replaces the update (see session.boost) --
        self.boost = Boost(config.boost, self.model, config.seed) if config.boost else None
        self.graph = trace(self.model)
        _check_graph(self.graph)
        self.batch_size = config.batch_size or loaded.batch_size
        self.lr = config.lr if config.lr is not None else loaded.lr.get(config.optimizer,
                                                                           DEFAULT_LR[config.optimizer])
        self.data = SyntheticData(self.model.data, config.seed, self.batch_size)
        self.params: dict[str, np.ndarray] = {
            name: np.array(value, dtype=np.float32) for name, value in self.graph.initial_params.items()}
        self.optimizer = make_optimizer(config.optimizer, self.lr)
        self.loss_scale = copy.deepcopy(config.loss_scale)  # each session starts from the configured state
        self.accelerate = (AccelerateTrainMode(config.accelerate_train_mode, config.device)
                           if config.accelerate_train_mode else None)
        self.status = FloatStatus()
        self.global_step = 0
        self.next_step = 0
        self.results: list[StepResult] = []
        self.accelerate_switch_step: int | None = None
        self._switched = False  # recompiled at the original precision, no step run there yet
        self.evaluations: list[dict] = []
        self.checkpoints: list[str] = []
        self.resumed_from: int | None = None
        self.data_parallel = None  # one rank of several (collect.ranks): gradients all-reduced before the update
        self.device: DeviceProfile
        self.program: Program
        self.executor: Executor
        self._compile(self.accelerate.device if self.accelerate else config.device)
        if self.boost is not None:
            self.boost.attach(self)
        if config.saves_checkpoints or config.if_load:
            _check_boost_checkpoints(config)
        if config.saves_checkpoints:  # before anything is written: a fresh run never replaces another's
            refuse_foreign_checkpoints(config.checkpoint_dir, resuming=config.if_load)
        if config.if_load:
            self.restore(load_checkpoint(find_checkpoint(config.checkpoint_dir, config.restore_model_version)))

    def _compile(self, device: DeviceProfile) -> None:
        self.device = device
        self.program = compile_graph(self.graph, device)
        self.executor = Executor(self.program, self.hooks, self.status, seed=self.config.seed)

    @property
    def task(self) -> str:
        return self.model.data.task

    def metadata(self) -> dict:
        """The run's settings, JSON-serialisable, for ``on_run_begin`` and dump files."""
        cfg = self.config
        spec = self.model.data
        accelerate = None
        if self.accelerate is not None:
            accelerate = {"kind": self.accelerate.spec.kind, "trigger": self.accelerate.spec.trigger,
                          "ratio": self.accelerate.spec.ratio, "target_loss": cfg.target_loss,
                          "low_precision_device": self.accelerate.low.describe()}
        return {
            "tool": "precision-tool",
            "version": __version__,
            "model": cfg.model,
            "task": spec.task,
            "data": {"kind": spec.kind, "shape": list(spec.shape), "num_classes": spec.num_classes,
                     "output_dim": spec.output_dim, "vocab_size": spec.vocab_size},
            "steps": cfg.steps,
            "seed": cfg.seed,
            "batch_size": self.batch_size,
            "optimizer": cfg.optimizer,
            "lr": self.lr,
            "device": cfg.device.describe(),
            "loss_scale": self.loss_scale.config() if self.loss_scale is not None else None,
            "accelerate_train_mode": self.accelerate.spec.spec if self.accelerate is not None else None,
            "accelerate": accelerate,
            "target_loss": cfg.target_loss,
            "schedule": {"max_steps": cfg.max_steps, "train_steps": cfg.train_steps, "eval_steps": cfg.eval_steps,
                         "save_steps": cfg.save_steps},
            "checkpoint_dir": cfg.checkpoint_dir,
            "resumed_from": self.resumed_from,
            **self._boost_metadata(),
            **(self.data_parallel.metadata() if self.data_parallel is not None else {}),
            "parameters": {name: list(value.shape) for name, value in self.params.items()},
        }

    def _boost_metadata(self) -> dict:
        """``boost_level`` and the resolved ``boost`` config; both None when nothing was configured."""
        cfg = self.config
        if cfg.boost_level == "O0" and not cfg.boost_config:
            return {"boost_level": None, "boost": None}
        boost = self.boost.metadata(cfg.steps) if self.boost is not None else cfg.boost.to_dict()
        return {"boost_level": cfg.boost_level, "boost": boost}

    def run(self) -> RunSummary:
        """Run the configured steps that have not run yet; hooks see the run begin and end."""
        self.hooks.on_run_begin(self.metadata())
        while self.next_step < self.config.steps:
            self.step()
        summary = self.summary()
        self.hooks.on_run_end(summary.to_dict())
        return summary

    def step(self, batch: dict[str, np.ndarray] | None = None) -> tuple[float, bool, float]:
        """Train one step; return ``(loss, overflow, loss_scale)``.

        ``batch`` replaces the step's synthetic batch (a replay feeds the one its checkpoint stored).
        """
        step = self.next_step
        if self._switched:
            self.accelerate_switch_step = step
            self._switched = False
        self.hooks.on_step_begin(step)
        executor = self.executor
        executor.begin_step(step)
        self.status.clear()
        batch = batch if batch is not None else self.data.batch(step)
        outputs = executor.forward(batch, self.params)
        loss = float(outputs["loss"])
        scale = self.loss_scale.scale if self.loss_scale is not None else 1.0
        grads = unscale(executor.backward({"loss": np.float32(scale)}), scale)
        if self.data_parallel is not None:  # every rank updates from the same (all-reduced) gradients
            grads = self.data_parallel.all_reduce(self, grads)
        overflow = self._overflowed(grads)
        if self.data_parallel is not None:  # and skips the same steps
            overflow = self.data_parallel.any_overflow(overflow)
        first = self.status.first
        skipped = overflow and self.loss_scale is not None and self.loss_scale.check_overflow
        if self.loss_scale is not None:
            self.loss_scale.update(overflow if self.loss_scale.check_overflow else False)
        if not skipped:
            if self.boost is not None:  # boost hook: the boost train step's update
                self.boost.update(self, step, grads, batch, scale, loss)
            else:
                self.optimizer.apply(executor, self.params, grads)
            self.global_step += 1
        extra = {"global_step": self.global_step,
                 "next_loss_scale": self.loss_scale.scale if self.loss_scale is not None else 1.0,
                 "first_overflow_op": first.name if first is not None else None}
        if _on_schedule(self.config.train_steps, step, self.config.steps) and self.config.eval_steps != 0:
            with Interruptible():  # (Ctrl-C stops it at once: it writes nothing)
                extra["evaluation"] = self.evaluate(step)
            self.evaluations.append(extra["evaluation"])
        result = StepResult(step, loss, overflow, scale, skipped, self.device.effective_precision_mode, extra)
        self.results.append(result)
        self.next_step = step + 1
        self.hooks.on_step_end(result)
        self._tell_accelerate(step, loss)
        if self.config.saves_checkpoints and _on_schedule(self.config.save_steps, step, self.config.steps):
            self.checkpoints.append(str(save_checkpoint(self.config.checkpoint_dir, self.checkpoint())))
        return loss, overflow, scale

    def evaluate(self, step: int) -> dict:
        """The model's metric on held-out batches, in forward only, on the device it trains on now.

        Accuracy for classification, mean squared error for regression; the
        mean loss too. No hook sees these ops and the float status is the
        evaluation's own, so the training record is untouched.
        """
        batches = self.config.eval_steps if self.config.eval_steps > 0 else EVAL_SET_BATCHES
        executor = Executor(self.program, HookList(), FloatStatus(), seed=self.config.seed)
        losses, scores, count = [], 0.0, 0
        classification = self.data.classification
        for index in range(batches):
            executor.begin_step(index)
            batch = self.data.eval_batch(index)
            outputs = executor.forward(batch, self.params)
            losses.append(float(outputs["loss"]))
            logits = np.asarray(outputs["logits"], dtype=np.float64)
            labels = batch["labels"]
            if classification:
                scores += float(np.sum(np.argmax(logits.reshape(len(labels), -1), axis=1) == labels))
                count += len(labels)
            else:
                scores += float(np.sum((logits.reshape(labels.shape) - labels) ** 2))
                count += labels.size
        return {"step": step, "metric": "accuracy" if classification else "mse", "value": scores / count,
                "loss": float(np.mean(losses)), "batches": batches}

    # -- checkpoints --------------------------------------------------------

    def rebuild_config(self) -> dict:
        """What `config_from_checkpoint` needs to build this session again (JSON)."""
        cfg = self.config
        return {
            "model": cfg.model, "steps": cfg.steps, "seed": cfg.seed, "batch_size": self.batch_size,
            "optimizer": cfg.optimizer, "lr": self.lr, "device": cfg.device.describe(),
            "loss_scale": cfg.loss_scale.config() if cfg.loss_scale is not None else None,
            "accelerate_train_mode": cfg.accelerate_train_mode, "target_loss": cfg.target_loss,
            "max_steps": cfg.max_steps, "train_steps": cfg.train_steps, "eval_steps": cfg.eval_steps,
            "save_steps": cfg.save_steps, "boost_level": cfg.boost_level, "boost_config": _boost_config(cfg),
        }

    def checkpoint(self) -> Checkpoint:
        """The state before step ``next_step``: weights, optimizer, loss scale, schedule, the next batch."""
        accelerate = None
        if self.accelerate is not None:
            accelerate = {"recovered": self.accelerate.recovered, "switch_step": self.accelerate_switch_step,
                          "pending_switch": self._switched}
        loss_scale = None
        if self.loss_scale is not None:
            loss_scale = {"config": self.loss_scale.config(), "state": self.loss_scale.state()}
        return Checkpoint(
            step=self.next_step, global_step=self.global_step, config=self.rebuild_config(),
            params={name: value.copy() for name, value in self.params.items()},
            slots={name: {slot: a.copy() for slot, a in slots.items()}
                   for name, slots in self.optimizer.slots.items()},
            inputs=self.data.batch(self.next_step), metadata=self.metadata(),
            optimizer=self.optimizer.scalar_state(), loss_scale=loss_scale, accelerate=accelerate,
            history=[asdict(r) for r in self.results], evaluations=list(self.evaluations),
            rng={"seed": self.config.seed, "next_step": self.next_step,
                 "data": "numpy default_rng([seed, step]) per step", "ops": "(seed, step, op) per random op"})

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue from ``checkpoint``: the same model and optimizer; the rest as this session is configured."""
        where = checkpoint.path or "checkpoint"
        saved = {name: tuple(a.shape) for name, a in checkpoint.params.items()}
        mine = {name: tuple(a.shape) for name, a in self.params.items()}
        if saved != mine:
            raise ConfigError(f"{where}: its parameters do not match model {self.config.model!r} "
                              f"({len(saved)} saved, {len(mine)} in the model)")
        if checkpoint.config.get("optimizer") != self.config.optimizer:
            raise ConfigError(f"{where}: saved with optimizer {checkpoint.config.get('optimizer')!r}, "
                              f"this run uses {self.config.optimizer!r}")
        if checkpoint.step > self.config.steps:
            raise ConfigError(f"{where}: it is the state after {checkpoint.step} steps, "
                              f"beyond this run's {self.config.steps}")
        try:
            self._load_state(checkpoint)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # the JSON state is damaged
            raise InputError(where, f"its saved state cannot be restored ({type(exc).__name__}: {exc})") from None

    def _load_state(self, checkpoint: Checkpoint) -> None:
        self.params = {name: np.array(a, dtype=np.float32) for name, a in checkpoint.params.items()}
        self.optimizer.slots = {name: {slot: np.array(a) for slot, a in slots.items()}
                                for name, slots in checkpoint.slots.items()}
        self.optimizer.load_scalar_state(checkpoint.optimizer)
        if self.loss_scale is not None and checkpoint.loss_scale is not None \
                and checkpoint.loss_scale["config"] == self.loss_scale.config():
            self.loss_scale.load_state(checkpoint.loss_scale["state"])
        if self.accelerate is not None and checkpoint.accelerate is not None:
            self.accelerate_switch_step = checkpoint.accelerate["switch_step"]
            self._switched = bool(checkpoint.accelerate["pending_switch"])
            if checkpoint.accelerate["recovered"]:
                self.accelerate.recovered = True
                self._compile(self.accelerate.original)
        names = {f.name for f in fields(StepResult)}
        self.results = [StepResult(**{k: v for k, v in r.items() if k in names}) for r in checkpoint.history]
        self.evaluations = list(checkpoint.evaluations)
        if not all(isinstance(e, dict) for e in self.evaluations):
            raise TypeError("an evaluation is not a JSON object")
        self.global_step = checkpoint.global_step
        self.next_step = self.resumed_from = checkpoint.step

    def _overflowed(self, grads: dict[str, np.ndarray]) -> bool:
        device = self.device
        if device.kind == "npu" and device.overflow_mode == "saturation":
            return self.status.raised
        return not all(np.isfinite(g).all() for g in grads.values())

    def _tell_accelerate(self, step: int, loss: float) -> None:
        """Tell the mode what TellMeStepOrLossHook would; recompile once when it fires."""
        if self.accelerate is None or self.accelerate.recovered:
            return
        if self.accelerate.spec.trigger == "step":
            fired = self.accelerate.tell(step=step + 1, total_steps=self.config.steps)
        else:
            fired = self.accelerate.tell(loss=loss, target_loss=self.config.target_loss)
        if fired:
            self._compile(self.accelerate.original)
            self._switched = True

    def summary(self) -> RunSummary:
        """The steps run so far."""
        return RunSummary(
            results=list(self.results),
            losses=[r.loss for r in self.results],
            loss_scale_history=[r.loss_scale for r in self.results],
            overflow_steps=[r.step for r in self.results if r.overflow],
            skipped_steps=[r.step for r in self.results if r.skipped],
            accelerate_switch_step=self.accelerate_switch_step,
            global_step=self.global_step,
            evaluations=list(self.evaluations),
            checkpoints=list(self.checkpoints),
            resumed_from=self.resumed_from,
        )


# boost algorithms whose state lives outside the weights and the optimizer: checkpoints do not hold it yet
STATEFUL_BOOST = ("grad_accumulation", "adasum", "dim_reduce", "loss_scale_group")


def _check_boost_checkpoints(config: SessionConfig) -> None:
    stateful = [name for name in (config.boost.active if config.boost else ()) if name in STATEFUL_BOOST]
    if stateful:
        raise ConfigError(f"checkpoints do not hold the state of boost {', '.join(stateful)} yet "
                          "(less_bn and grad_freeze resume exactly): turn them off or do not checkpoint")


def _boost_config(config: SessionConfig):
    """The run's boost config as JSON: a file's content rather than its path, which may be gone by replay."""
    value = config.boost_config
    if value is None or isinstance(value, dict):
        return value
    import json
    from pathlib import Path

    try:
        return json.loads(Path(value).read_text())
    except (OSError, ValueError):
        return str(value)


def _on_schedule(every: int, step: int, steps: int) -> bool:
    """Whether a Rec SDK style ``*_steps`` setting fires after ``step``: every N steps, -1 after the last, 0 never."""
    if every > 0:
        return (step + 1) % every == 0
    return every == -1 and step + 1 == steps



def _check_graph(graph) -> None:
    missing = [name for name in ("x", "labels") if name not in graph.inputs]
    missing += [name for name in ("logits", "loss") if name not in graph.outputs]
    if missing:
        raise ConfigError(f"the traced model lacks {', '.join(missing)}; build it with the layer API's trace()")
