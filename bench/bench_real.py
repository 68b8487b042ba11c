"""Benchmark: capture on real models. Each mode's training time against the plain run, and msprobe's.

The models are the real-model suite's (``tests/realmodels/cases.py``): tiny
Hugging Face GPT-2, BERT and ViT configs, a small ResNet and an LSTM language
model (oneDNN off), random init, nothing downloaded. Each configuration trains
a freshly built model (same seed): one optimizer step untimed inside the
configuration (it creates the dump file and its metadata, a one-off cost),
then ``--steps`` timed steps: the steady-state cost a long run pays per step. Per model, one process runs every configuration of ours,
interleaved over ``--repeats`` rounds (the order rotates each round):

* ``plain``: no instrumentation;
* ``noop mode``: an empty ``TorchDispatchMode`` around the step (without
  torch's dynamo wrapper, as the capture's own mode), the floor of any
  capture that intercepts aten ops from Python;
* ``recorder floor``: a dispatch mode that does the least an aten-level
  statistics capture must (`_minimal_recorder`: input statistics looked up
  by object, output statistics computed in C, no names, no checks, no file);
* ``module floor``: the global module hooks module-level capture installs,
  with a gradient hook on every float tensor in and out of a module call,
  all doing nothing: the floor of module-level capture in Python;
* ``module recorder floor``: the same hooks doing the least a module-level
  statistics capture must (`_ModuleRecorderFloor`: each call's input
  statistics looked up by object, its outputs' and each boundary gradient's
  computed in C, one row kept a call and a gradient; no names, no checks, no
  file);
* ``stats module``: ``precision_tool.torch.dump(path, "stats", level="module")``,
  module calls only, no aten op intercepted;
* ``stats``, ``overflow``, ``dump``: ``precision_tool.torch.dump(path, mode)``;
* ``stats, steps left out``: ``dump(path, "stats", steps=[0])``, the untimed
  first step recorded at op level: what the timed steps a ``steps=`` filter
  leaves out cost;
* ``simulate``: ``simulate_npu("allow_mix_precision")``.

msprobe (``mindstudio-probe==26.2.0``, when installed) runs in processes of
its own, since it patches torch: its plain runs first, then
``PrecisionDebugger`` with task ``statistics`` at level L1 (torch API
level) and L0 (module level), and ``tensor`` at L1, started and stopped
around every step as its docs say. The records a step each writes are
counted (ours from the dump, msprobe's from its dump.json files): at op
level we record every aten op, forward and backward, where msprobe's L1
records one per torch API call (an LSTM layer is one ``torch.lstm``).

Printed: the median time of each configuration as a ratio to plain, with the
spread (max/min over the rounds), and for ``dump`` its write speed: the
dump's bytes over the time it adds to plain, against raw h5py writing the
same bytes (every tensor read back from the dump and written, one dataset
each; a value the dump stores once for several slots is written once),
timed once a round right after that round's dump, and the medians compared.
``--json FILE`` writes every figure, with the date, for the README's
table.

    python bench/bench_real.py [--models gpt2,bert,vit,resnet,lstm] [--steps 3] [--repeats 5] [--json FILE] [--no-msprobe]
                                [--cpu] [--size tiny|small]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gpt2": "gpt2-sdpa", "bert": "bert-sdpa", "vit": "vit", "resnet": "resnet", "lstm": "lstm-nodnn"}
OURS = ("plain", "noop mode", "recorder floor", "module floor", "module recorder floor", "stats module", "stats", "stats, steps left out",
        "overflow", "dump", "simulate")
MSPROBE = ("msprobe plain", "msprobe stats", "msprobe stats L0", "msprobe tensor")


# ---- inside a worker process ---------------------------------------------------------------------

def _case(model: str):
    sys.path.insert(0, str(ROOT))
    from tests.realmodels.cases import Case, _quiet_transformers

    _quiet_transformers()
    return Case(model, "clean", "fp32")


def _builder(model: str, size: str):
    """(a function building a fresh Run of ``model``, the context it trains in): the suite's tiny model, or with
    ``size="small"`` the same family at a width and batch where a step's kernels outweigh its op count."""
    from tests.realmodels.cases import _dnn, build

    case = _case(model)
    if size == "tiny":
        return (lambda: build(case)), _dnn(case)
    import torch

    def seeded(make):
        def run():
            torch.manual_seed(0)
            return make()
        return run

    return seeded(_SMALL[model.split("-")[0]]), _dnn(case)


def _small_gpt2():
    import torch
    import transformers as tf

    from tests.realmodels.cases import Run, _hf_loss

    config = tf.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=128, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    model = tf.GPT2LMHeadModel(config)
    ids = torch.randint(0, 2048, (4, 64))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-4), {"input_ids": ids, "labels": ids}, _hf_loss)


def _small_bert():
    import torch
    import transformers as tf

    from tests.realmodels.cases import Run, _hf_loss

    config = tf.BertConfig(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=1024, max_position_embeddings=128, num_labels=4, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    model = tf.BertForSequenceClassification(config)
    batch = {"input_ids": torch.randint(1, 2048, (4, 64)), "labels": torch.arange(4)}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-4), batch, _hf_loss)


def _small_vit():
    import torch
    import transformers as tf

    from tests.realmodels.cases import Run, _hf_loss

    config = tf.ViTConfig(image_size=64, patch_size=8, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                          intermediate_size=1024, num_labels=4, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    model = tf.ViTForImageClassification(config)
    batch = {"pixel_values": torch.randn(4, 3, 64, 64), "labels": torch.arange(4)}
    return Run(model, torch.optim.AdamW(model.parameters(), lr=1e-4), batch, _hf_loss)


def _small_resnet():
    import torch
    import transformers as tf

    from tests.realmodels.cases import Run, _hf_loss

    config = tf.ResNetConfig(num_channels=3, embedding_size=32, hidden_sizes=[32, 64, 128], depths=[2, 2, 2],
                             layer_type="basic", num_labels=4)
    model = tf.ResNetForImageClassification(config)
    batch = {"pixel_values": torch.randn(8, 3, 64, 64), "labels": torch.arange(8) % 4}
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), batch, _hf_loss)


def _small_lstm():
    import torch
    from torch import nn

    from tests.realmodels.cases import LSTMLanguageModel, Run

    model = LSTMLanguageModel(vocab=1024, width=256)
    ids = torch.randint(0, 1024, (4, 32))

    def loss(model, batch):
        logits = model(batch["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"][:, 1:].reshape(-1))

    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"ids": ids}, loss)


_SMALL = {"gpt2": _small_gpt2, "bert": _small_bert, "vit": _small_vit, "resnet": _small_resnet, "lstm": _small_lstm}


def _clock():
    """The clock the steps are timed with: wall time, or with ``--cpu`` (``BENCH_REAL_CLOCK=cpu``) the process's
    CPU time, torch on one thread: what a step costs, unmoved by other load on a shared machine."""
    if os.environ.get("BENCH_REAL_CLOCK") == "cpu":
        import torch

        torch.set_num_threads(1)
        return time.process_time
    return time.perf_counter


def _step_loop(run, steps: int, around=None, warm: int = 1) -> float:
    """Seconds to train ``steps`` optimizer steps after ``warm`` untimed ones; ``around(step_index)`` is a
    context per step, if given."""
    import contextlib

    import precision_tool.torch as ptt

    clock = _clock()
    start = clock()
    for index in range(warm + steps):
        if index == warm:
            start = clock()
        with (around(index) if around else contextlib.nullcontext()):
            loss = run.loss(run.model, run.batch)
            run.optimizer.zero_grad()
            loss.backward()
            run.optimizer.step()
            ptt.step(loss)
    return clock() - start


def noop_mode():
    """An empty TorchDispatchMode: the floor of any capture that intercepts aten ops from Python."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Noop(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # as the capture's own mode: no torch._disable_dynamo wrapper
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return Noop()


def _ours(model: str, steps: int, repeats: int, workdir: Path, size: str = "tiny") -> dict:
    import contextlib

    import precision_tool.torch as ptt

    build, dnn = _builder(model, size)

    def context(name: str, path: Path):
        if name == "plain":
            return contextlib.nullcontext()
        if name == "noop mode":
            return noop_mode()
        if name == "recorder floor":
            return _minimal_recorder()
        if name == "module floor":
            return _ModuleFloor()
        if name == "module recorder floor":
            return _ModuleRecorderFloor()
        if name == "simulate":
            return ptt.simulate_npu("allow_mix_precision")
        if name == "stats module":
            return ptt.dump(path, mode="stats", level="module")
        if name == "stats, steps left out":  # records the untimed first step only
            return ptt.dump(path, mode="stats", steps=[0])
        return ptt.dump(path, mode=name)

    times: dict[str, list[float]] = {name: [] for name in OURS}
    sizes: dict[str, int] = {}
    records: dict[str, float] = {}
    raw_times: list[float] = []  # raw h5py writing each round's dump again
    order = list(OURS)
    with dnn:
        _step_loop(build(), steps)  # warm-up: first-call costs of torch and the model
        for round_ in range(repeats + 1):
            for name in order:
                path = workdir / f"{name}.h5"
                run = build()
                with context(name, path) as entered:
                    seconds = _step_loop(run, steps)
                if getattr(entered, "steps_written", 0):
                    records[name] = entered.ops_recorded / entered.steps_written
                if round_:  # round 0 warms up every configuration
                    times[name].append(seconds)
                if path.exists():
                    sizes[name] = path.stat().st_size
                    if name == "dump" and round_:
                        raw_times.append(_raw_write_seconds(path, workdir / "raw.h5"))
                    path.unlink()
            order = order[1:] + order[:1]
    return {"times": times, "sizes": sizes, "raw_write_s": statistics.median(raw_times) if raw_times else 0.0,
            "raw_write_times": raw_times, "records_per_step": records,
            "raw_clock": os.environ.get("BENCH_REAL_CLOCK") or "wall"}


def _float_leaves(value, found: list) -> list:
    """``found`` with the floating-point tensors in nested tuples, lists and dicts appended, in order."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _float_leaves(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _float_leaves(item, found)
    return found


class _ModuleFloor:
    """The floor of module-level capture in Python: the global module hooks it installs, and a gradient hook on
    every float tensor in and out of a module call that takes part in autograd, doing nothing; one a tensor
    while it is that tensor's last hook (nested calls share their boundary tensors), as the capture does."""

    def __enter__(self):
        import torch
        from torch.nn.modules import module

        leaves = _float_leaves

        def nothing(grad):
            return None

        def after(module_, args, kwargs, output):
            if torch.is_grad_enabled():
                for tensor in leaves((args, kwargs), leaves(output, [])):
                    if tensor.requires_grad:
                        hooks = tensor._backward_hooks  # (an in-place write starts the tensor's hooks again)
                        if not hooks or next(reversed(hooks.values())) is not nothing:
                            tensor.register_hook(nothing)

        self._handles = [module.register_module_forward_pre_hook(lambda module_, args: None),
                         module.register_module_forward_hook(after, with_kwargs=True, always_call=True)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()


class _ModuleRecorderFloor(_ModuleFloor):
    """`_ModuleFloor` doing the least a module-level statistics capture must: each call's float inputs'
    statistics looked up by object (an earlier call's output) or computed, its outputs' computed in C
    (`_native.stats_at`), one row a call; each boundary gradient's statistics computed in C as it arrives, one
    row. No names, no check that a tensor is unchanged, no file: the floor of such a capture in Python."""

    def __enter__(self):
        import gc

        import torch
        from torch.nn.modules import module

        from precision_tool.torch.tensors import _SMALL_STATS, _STATS_AT, _STATS_AT_KINDS, _STATS_CANCELLATION

        known, rows = {}, []
        self.rows = rows
        self._froze = not gc.get_freeze_count()  # as the capture's session does
        if self._froze:
            gc.freeze()

        def stats(tensor):
            found = known.get(id(tensor))
            if found is not None:
                return found
            kind = _STATS_AT_KINDS.get(tensor.dtype)
            if kind is None or not tensor.is_contiguous() or not tensor.numel():
                return None
            found = known[id(tensor)] = _STATS_AT(tensor.data_ptr(), tensor.numel(), kind, _STATS_CANCELLATION, 0.0,
                                                  _SMALL_STATS)
            return found

        leaves = _float_leaves

        def gradient(grad):
            rows.append((None, [stats(grad)]))
            return None

        def after(module_, args, kwargs, output):
            outputs, inputs = leaves(output, []), leaves((args, kwargs), [])
            rows.append((module_, [stats(t) for t in inputs] + [stats(t) for t in outputs]))
            if torch.is_grad_enabled():
                for tensor in inputs + outputs:
                    if tensor.requires_grad:
                        hooks = tensor._backward_hooks  # (an in-place write starts the tensor's hooks again)
                        if not hooks or next(reversed(hooks.values())) is not gradient:
                            tensor.register_hook(gradient)

        def step_ends(*_):
            known.clear()
            rows.clear()

        from torch.optim import optimizer

        self._handles = [module.register_module_forward_pre_hook(lambda module_, args: None),
                         module.register_module_forward_hook(after, with_kwargs=True, always_call=True),
                         optimizer.register_optimizer_step_post_hook(step_ends)]
        return self

    def __exit__(self, *exc):
        import gc

        super().__exit__(*exc)
        if self._froze:
            gc.unfreeze()


def _minimal_recorder():
    """A dispatch mode doing the least an aten-level statistics capture must: each op's inputs' statistics
    looked up by object, each contiguous float output's computed in C (`_native.stats_at`), one row kept a
    op; no names, no check that a tensor is unchanged, no file. The floor of such a capture in Python."""
    import gc

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from precision_tool.torch.tensors import _SMALL_STATS, _STATS_AT, _STATS_AT_KINDS, _STATS_CANCELLATION

    class MinimalRecorder(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

        def __enter__(self):
            self.known, self.rows = {}, []
            self._froze = not gc.get_freeze_count()  # as the capture's session does
            if self._froze:
                gc.freeze()
            return super().__enter__()

        def __exit__(self, *exc):
            if self._froze:
                gc.unfreeze()
            return super().__exit__(*exc)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            known = self.known
            inputs = [known.get(id(value)) for value in args if type(value) is torch.Tensor]
            outputs = []
            for tensor in result if isinstance(result, (tuple, list)) else (result,):
                if type(tensor) is torch.Tensor and tensor.is_contiguous() and tensor.numel():
                    kind = _STATS_AT_KINDS.get(tensor.dtype)
                    if kind is not None:
                        stats = _STATS_AT(tensor.data_ptr(), tensor.numel(), kind, _STATS_CANCELLATION, 0.0,
                                          _SMALL_STATS)
                        known[id(tensor)] = stats
                        outputs.append(stats)
            self.rows.append((func, inputs, outputs))
            return result

    return MinimalRecorder()


def _stored_arrays(dump: Path) -> list:
    """Every array ``dump`` stores, once each, as it lies on disk (slots that refer to values stored before are
    not read again)."""
    import h5py
    import numpy as np

    from precision_tool.dump.reader import open_dump
    from precision_tool.dump.storage import stored_dtype

    arrays, seen = [], set()
    with open_dump(dump) as d:
        for record in d.ops():
            for t in record.tensors:
                if t.has_data:
                    location = d.step_index(record.step).tensor_location(record.exec_index, t.slot)
                    if location.pack != -1:
                        where = (record.step, location.pack, location.offset)
                    else:
                        where = h5py.h5o.get_info(d._dataset(record.step, location, t.slot)[0].id).addr
                    if where in seen:
                        continue
                    seen.add(where)
                    values = d.tensor(record.step, record.exec_index, t.slot)
                    arrays.append(np.ascontiguousarray(values.astype(stored_dtype(t.dtype), copy=False))
                                  if t.dtype != "bfloat16" else (values.view(np.uint32) >> 16).astype(np.uint16))
    return arrays


def _raw_write_seconds(dump: Path, out: Path) -> float:
    """Seconds for h5py to write the arrays ``dump`` stores again, one dataset each: the same bytes.

    Timed once a round, right after the round's dump, so that it meets the
    page cache and the disk's write-back in the state the dump met them (a
    best-of-n raw write against the dump's median favoured h5py: a round
    that finds the page cache full pays for reclaiming it, whoever writes).
    """
    import h5py

    arrays = _stored_arrays(dump)
    clock = _clock()  # the steps' clock: CPU time with --cpu
    start = clock()
    with h5py.File(out, "w") as f:
        for i, array in enumerate(arrays):
            f.create_dataset(f"t{i:07d}", data=array)
    seconds = clock() - start
    out.unlink()
    return seconds


def _msprobe(model: str, steps: int, repeats: int, workdir: Path, task: str = "statistics", level: str = "L1",
             size: str = "tiny") -> dict:
    """msprobe's ``task`` dump at ``level``; one configuration per process, since its PrecisionDebugger is a
    process-wide singleton that keeps the first configuration it was given."""
    build, dnn = _builder(model, size)
    name = f"msprobe {'stats' if task == 'statistics' else task}" + ("" if level == "L1" else f" {level}")
    times: dict[str, list[float]] = {"msprobe plain": [], name: []}
    with dnn:
        _step_loop(build(), steps)
        for _ in range(repeats):  # plain first: msprobe patches torch once imported and started
            times["msprobe plain"].append(_step_loop(build(), steps))
        from msprobe.pytorch import PrecisionDebugger

        config = workdir / f"{task}.json"
        config.write_text(json.dumps({"task": task, "level": level, "dump_path": str(workdir / f"msprobe_{task}"),
                                      task: {"data_mode": ["all"]}}))
        debugger = PrecisionDebugger(config_path=str(config))
        for round_ in range(repeats + 1):
            run = build()

            class Around:
                def __init__(self, index):
                    pass

                def __enter__(self):
                    debugger.start(run.model)

                def __exit__(self, *exc):
                    debugger.stop()
                    debugger.step()

            seconds = _step_loop(run, steps, Around)
            if round_:
                times[name].append(seconds)
    files = [f for f in (workdir / f"msprobe_{task}").rglob("*") if f.is_file()]
    entries = [len(json.loads(f.read_text()).get("data", {})) for f in files if f.name == "dump.json"]
    return {"times": times, "bytes": sum(f.stat().st_size for f in files),
            "records_per_step": sum(entries) / len(entries) if entries else 0.0}


# ---- the driver ------------------------------------------------------------------------------------

def _worker(kind: str, model: str, steps: int, repeats: int, *extra) -> dict:
    code = (f"import json, shutil, sys, tempfile, pathlib; sys.path.insert(0, {str(ROOT)!r}); "
            f"from bench.bench_real import _{kind}; "
            f"d = tempfile.mkdtemp(prefix='bench_real_'); "
            f"r = _{kind}({model!r}, {steps}, {repeats}, pathlib.Path(d), *{extra!r}); "
            f"shutil.rmtree(d, ignore_errors=True); print(json.dumps(r))")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{kind} {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _has_msprobe() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("msprobe") is not None
    except (ImportError, ValueError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny",
                        help="tiny: the suite's models (the targets' benchmark); small: the same families at width "
                             "256 and batches of 4 to 8, where a step's kernels outweigh its op count")
    parser.add_argument("--cpu", action="store_true",
                        help="time CPU seconds with torch on one thread instead of wall time (a loaded machine)")
    parser.add_argument("--no-msprobe", action="store_true", help="leave msprobe's runs out even where installed")
    parser.add_argument("--msprobe-from", type=Path, default=None, metavar="JSON",
                        help="with --no-msprobe: carry msprobe's columns over from an earlier --json file of the "
                             "same size, clock and steps (its runs do not depend on this project's code); the table "
                             "says from which date")
    parser.add_argument("--markdown", type=Path, default=None, metavar="JSON",
                        help="print the table rows of docs/torch.md from a --json file, and stop")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if args.cpu:
        os.environ["BENCH_REAL_CLOCK"] = "cpu"
    msprobe = _has_msprobe() and not args.no_msprobe
    results = {}
    for short in args.models.split(","):
        model = MODELS[short]
        result = _worker("ours", model, args.steps, args.repeats, args.size)
        if msprobe:
            stats = _worker("msprobe", model, args.steps, args.repeats, "statistics", "L1", args.size)
            modules = _worker("msprobe", model, args.steps, args.repeats, "statistics", "L0", args.size)
            tensor = _worker("msprobe", model, args.steps, args.repeats, "tensor", "L1", args.size)
            result["msprobe"] = {**stats["times"], "msprobe stats L0": modules["times"]["msprobe stats L0"],
                                 "msprobe tensor": tensor["times"]["msprobe tensor"],
                                 "msprobe plain": stats["times"]["msprobe plain"] + modules["times"]["msprobe plain"]
                                 + tensor["times"]["msprobe plain"]}
            result["msprobe_tensor_bytes"] = tensor["bytes"]
            result["msprobe_records_per_step"] = {"stats": stats["records_per_step"],
                                                  "stats L0": modules["records_per_step"]}
        results[short] = result
        _print_model(short, result, args.steps)
    if not msprobe and not args.no_msprobe:
        print("msprobe not installed (pip install mindstudio-probe==26.2.0): its columns are left out")
    if args.msprobe_from and not msprobe:
        _carry_msprobe(json.loads(args.msprobe_from.read_text()), results, args)
    if args.json:
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "steps": args.steps, "clock": "cpu" if args.cpu else "wall",
                                         "size": args.size,
                                         "repeats": args.repeats, "results": results}, indent=1))
    return 0


def _carry_msprobe(earlier: dict, results: dict, args) -> None:
    """Copy msprobe's figures of each model from an ``earlier`` result document, dated; refuse one measured
    otherwise (another size, clock or step count)."""
    same = (earlier.get("size", "tiny"), earlier.get("clock", "wall"), earlier["steps"])
    if same != (args.size, "cpu" if args.cpu else "wall", args.steps):
        raise SystemExit(f"--msprobe-from: measured at {same}, not at {(args.size, args.cpu, args.steps)}")
    for name, result in results.items():
        theirs = earlier["results"].get(name, {})
        for key in ("msprobe", "msprobe_tensor_bytes", "msprobe_records_per_step"):
            if key in theirs:
                result[key] = theirs[key]
        if "msprobe" in theirs:
            result["msprobe_date"] = theirs.get("msprobe_date", earlier["date"])


def _print_model(name: str, result: dict, steps: int) -> None:
    times = result["times"]
    plain = statistics.median(times["plain"])
    line = [f"{name:<7} plain {plain * 1000 / steps:6.1f} ms/step"]
    for config in OURS[1:]:
        values = times[config]
        line.append(f"{config} {statistics.median(values) / plain:5.2f}x (±{_spread(values):.0%})")
    print("  ".join(line))
    dump_bytes = result["sizes"].get("dump", 0)
    added = statistics.median(times["dump"]) - plain
    raw = result["raw_write_s"]
    if dump_bytes and added > 0 and raw > 0:
        ours, theirs = dump_bytes / added, dump_bytes / raw
        print(f"        dump {dump_bytes / 1e6:.1f} MB: written at {ours / 1e6:.0f} MB/s over plain, raw h5py "
              f"{theirs / 1e6:.0f} MB/s -> {ours / theirs:.0%} of raw")
    records = result.get("records_per_step", {})
    if records:
        print("        records a step: " + ", ".join(f"{c} {records[c]:.0f}" for c in ("stats module", "stats")
                                                      if c in records))
    if "msprobe" in result:
        mp = result["msprobe"]
        base = statistics.median(mp["msprobe plain"])
        theirs = result.get("msprobe_records_per_step", {})
        print(f"        msprobe (own plain {base * 1000 / steps:.1f} ms/step): statistics L1 "
              f"{statistics.median(mp['msprobe stats']) / base:.2f}x ({theirs.get('stats', 0):.0f} records a step), "
              f"statistics L0 {statistics.median(mp['msprobe stats L0']) / base:.2f}x "
              f"({theirs.get('stats L0', 0):.0f} records a step), tensor "
              f"{statistics.median(mp['msprobe tensor']) / base:.2f}x "
              f"({result.get('msprobe_tensor_bytes', 0) / 1e6:.1f} MB written)")


def markdown(document: dict) -> str:
    """The rows of the performance table in docs/torch.md: each ratio is a median of the saved runs."""
    rows = []
    for name, result in document["results"].items():
        times = result["times"]
        plain = statistics.median(times["plain"])
        cells = [name, f"{plain * 1000 / document['steps']:.1f} ms"]
        cells += [f"{statistics.median(times[c]) / plain:.2f}x" for c in ("noop mode", "stats module", "stats",
                                                                            "overflow")]
        added = statistics.median(times["dump"]) - plain
        if result.get("raw_clock", "wall") == document.get("clock", "wall"):  # (runs of 2026-11-25 timed the raw
            speed = result["raw_write_s"] / added  # write on the wall clock whatever the steps' clock)
            cells.append(f"{statistics.median(times['dump']) / plain:.2f}x ({speed:.0%} of raw h5py)")
        else:
            cells.append(f"{statistics.median(times['dump']) / plain:.2f}x")
        cells.append(f"{statistics.median(times['simulate']) / plain:.2f}x")
        msprobe = result.get("msprobe")
        if msprobe:
            base = statistics.median(msprobe["msprobe plain"])
            cells += [f"{statistics.median(msprobe[c]) / base:.2f}x" for c in ("msprobe stats", "msprobe tensor")]
        else:
            cells += ["-", "-"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if values and min(values) > 0 else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
