"""Training checkpoints: one HDF5 file per saved step, enough to resume a run bit for bit or replay one step.

A checkpoint directory holds ``ckpt-NNNNNNNN.h5`` files, NNNNNNNN being the
number of steps run when it was written: the state *before* step NNNNNNNN
(numbered from 0), so ``restore_model_version N`` resumes at step N and
``replay --step N`` replays step N. Each file holds:

============================  ==============================================================
``/params/KKK``               float32 master weights, in the model's parameter order;
                              attribute ``name`` (parameter names may contain ``/``)
``/optimizer/SLOT/KKK``       the optimizer's slots (``accum``; ``m``, ``v``) for parameter KKK
``/inputs/NAME``              the batch of step NNNNNNNN (``x``, ``labels``): what a replay feeds
root attributes (JSON)        ``format`` ("precision-tool checkpoint"), ``version`` (1), ``step``,
                              ``global_step``, ``config`` (what rebuilds the session:
                              model, seed, batch size, optimizer, lr, device, loss scale, ...),
                              ``metadata`` (the run's metadata, as in dumps), ``optimizer``
                              (scalar state: Adam's beta powers), ``loss_scale`` (the manager's
                              config and state), ``accelerate`` (switched back yet, and when),
                              ``history`` (every step's result so far), ``evaluations``, ``rng``
============================  ==============================================================

All randomness of a session is derived from ``(seed, step)``: the batch of
step s comes from ``default_rng([seed, s])``, dropout masks from ``(seed,
step, op)``. The seed and the step are therefore the whole RNG state; ``rng``
records that, and the next step's batch is stored too, so a replay does not
depend on regenerating it. No pickle anywhere: arrays are datasets, the rest
is JSON.

Files are written beside their final name and renamed into place once synced,
so a crash leaves the previous checkpoints and never a torn one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from precision_tool.errors import ConfigError, InputError, NotFoundError
from precision_tool.outputs import problem, replacing

FORMAT = "precision-tool checkpoint"
VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{8,})\.h5$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.h5"


@dataclass
class Checkpoint:
    """A session's state before step ``step``."""

    step: int  # steps run: the next step to run
    global_step: int
    config: dict
    params: dict[str, np.ndarray]
    slots: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # param -> slot -> array
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    optimizer: dict = field(default_factory=dict)
    loss_scale: dict | None = None
    accelerate: dict | None = None
    history: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    rng: dict = field(default_factory=dict)
    path: str = ""


def list_checkpoints(directory) -> dict[int, Path]:
    """Step -> checkpoint file in ``directory`` (empty when it does not exist)."""
    directory = Path(directory)
    if not directory.exists():
        return {}
    if not directory.is_dir():
        raise InputError(directory, "is not a directory; a checkpoint directory was expected")
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise InputError(directory, f"cannot list: {problem(exc)}") from None
    found = {}
    for name in names:
        match = _NAME.match(name)
        if match:
            found[int(match.group(1))] = directory / name
    return dict(sorted(found.items()))


def find_checkpoint(directory, step: int | None = None) -> Path:
    """The checkpoint of ``step``, or the latest; an error names what the directory holds."""
    found = list_checkpoints(directory)
    if not found:
        if not Path(directory).exists():
            raise InputError(directory, "no such directory")
        raise InputError(directory, "holds no checkpoint (ckpt-NNNNNNNN.h5 files)")
    if step is None:
        return found[max(found)]
    if step not in found:
        raise NotFoundError(f"{directory}: no checkpoint of step {step}; it holds steps "
                            f"{', '.join(str(s) for s in found)}")
    return found[step]


def save_checkpoint(directory, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` into ``directory`` (created if missing) atomically; return its path."""
    import h5py

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(directory, f"cannot create the checkpoint directory: {problem(exc)}") from None
    path = directory / checkpoint_name(checkpoint.step)
    names = list(checkpoint.params)
    with replacing(path) as temporary:
        with h5py.File(temporary, "w") as h5:
            attrs = h5.attrs
            attrs["format"] = FORMAT
            attrs["version"] = VERSION
            attrs["step"] = checkpoint.step
            attrs["global_step"] = checkpoint.global_step
            for key in ("config", "metadata", "optimizer", "loss_scale", "accelerate", "history", "evaluations", "rng"):
                attrs[key] = json.dumps(getattr(checkpoint, key))
            params = h5.create_group("params")
            for index, name in enumerate(names):
                params.create_dataset(f"{index:03d}", data=checkpoint.params[name]).attrs["name"] = name
            optimizer = h5.create_group("optimizer")
            for index, name in enumerate(names):
                for slot, array in checkpoint.slots.get(name, {}).items():
                    group = optimizer.require_group(slot)
                    group.create_dataset(f"{index:03d}", data=array)
            inputs = h5.create_group("inputs")
            for key, array in checkpoint.inputs.items():
                inputs.create_dataset(key, data=array)
    return path


def load_checkpoint(path) -> Checkpoint:
    """Read a checkpoint file; a damaged or foreign one raises InputError naming it."""
    import h5py

    path = Path(path)
    try:
        with h5py.File(path, "r") as h5:
            return _read(h5, path)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise InputError(path, f"not a readable checkpoint: {problem(exc)}") from None


def _read(h5, path: Path) -> Checkpoint:
    attrs = h5.attrs
    found = attrs.get("format")
    if found != FORMAT:
        if isinstance(found, bytes):
            found = found.decode("utf-8", "replace")
        said = "no format attribute" if found is None else \
            f"its format attribute is {str(found)[:60]!r}, not {FORMAT!r}"
        raise InputError(path, f"not a precision-tool checkpoint ({said})")
    version = int(attrs.get("version", 0))
    if version != VERSION:
        raise InputError(path, f"checkpoint version {version}; this precision-tool reads version {VERSION}")

    def document(key):
        try:
            value = json.loads(attrs[key])
        except (KeyError, ValueError, RecursionError):  # ValueError: not JSON, or a number of 5000 digits
            raise InputError(path, f"attribute {key!r} is missing or not JSON") from None
        kinds = _DOCUMENTS[key]
        if not isinstance(value, kinds):
            raise InputError(path, f"attribute {key!r} is {type(value).__name__}, not "
                                   f"{' or '.join(_KIND_NAMES[k] for k in kinds)}")
        return value

    params, slots, order = {}, {}, {}
    for key, dataset in h5["params"].items():
        name = dataset.attrs["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        params[name] = dataset[()]
        order[key] = name
    for slot, group in h5["optimizer"].items():
        for key, dataset in group.items():
            if key not in order:
                raise InputError(path, f"optimizer slot {slot}/{key} has no parameter")
            slots.setdefault(order[key], {})[slot] = dataset[()]
    inputs = {key: dataset[()] for key, dataset in h5["inputs"].items()}
    config = document("config")
    if not isinstance(config.get("device", {}), dict):
        raise InputError(path, "attribute 'config': its device is not a JSON object")
    return Checkpoint(step=_step(path, attrs, "step"), global_step=_step(path, attrs, "global_step"), config=config,
                      params=params, slots=slots, inputs=inputs, metadata=document("metadata"),
                      optimizer=document("optimizer"), loss_scale=document("loss_scale"),
                      accelerate=document("accelerate"), history=document("history"),
                      evaluations=document("evaluations"), rng=document("rng"),
                      path=str(path))


# the JSON attributes of a checkpoint and the types the session restores them as
_DOCUMENTS = {"config": (dict,), "metadata": (dict,), "optimizer": (dict,), "rng": (dict,),
              "loss_scale": (dict, type(None)), "accelerate": (dict, type(None)), "history": (list,),
              "evaluations": (list,)}
_KIND_NAMES = {dict: "a JSON object", list: "a JSON list", type(None): "null"}


def _step(path: Path, attrs, key: str) -> int:
    value = attrs[key]
    value = value.item() if isinstance(value, np.generic) else value
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(path, f"attribute {key!r}: {value!r} is not a whole number >= 0")
    return value


def check_batch(where: str, saved: dict, sample: dict, bounds: dict) -> None:
    """The batch a checkpoint stores for its next step, which a replay trains on as it is: the arrays of
    ``sample`` (one example of the session's data) with its per-example shapes and kinds of numbers, one length
    for all, and integers (class labels, token ids) below their ``bounds``; InputError naming the file if not."""
    lengths = set()
    for name, example in sample.items():
        found, want = saved.get(name), np.asarray(example)
        if found is None or np.ndim(found) != want.ndim or np.shape(found)[1:] != want.shape[1:] \
                or getattr(found, "dtype", np.dtype(object)).kind != want.dtype.kind:
            shown = "missing" if found is None else f"{getattr(found, 'dtype', type(found).__name__)} {np.shape(found)}"
            raise InputError(where, f"its saved batch {name!r} is {shown}; the model takes {want.dtype} "
                                    f"(N, {', '.join(map(str, want.shape[1:]))})")
        lengths.add(np.shape(found)[0])
        bound = bounds.get(name)
        if bound is not None and want.dtype.kind in "iu" and found.size and (found.min() < 0 or found.max() >= bound):
            raise InputError(where, f"its saved batch {name!r} holds values outside 0..{bound - 1}")
    if len(lengths) > 1:
        raise InputError(where, f"its saved batch arrays differ in length ({sorted(lengths)})")


def refuse_foreign_checkpoints(directory, resuming: bool) -> None:
    """A fresh run (not resuming) never writes over checkpoints already in ``directory``."""
    found = list_checkpoints(directory)
    if found and not resuming:
        raise ConfigError(f"{directory} already holds checkpoints of steps {', '.join(str(s) for s in found)}; "
                          "resume from them (if_load, --if-load) or choose an empty directory")
