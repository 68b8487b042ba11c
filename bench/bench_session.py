"""Benchmark: one training step of each sample model, golden vs npu, with and without a hook.

Run: ``python bench/bench_session.py [--steps 30] [--models mlp,cnn]``

Each figure is the median wall time of one ``Session.step()`` (forward, loss,
backward, unscale, optimizer update) after a few warm-up steps. The hooked and
unhooked sessions of a device step in turn, so both see the same machine
load. The "empty hook" has no-op ``before_op``/``after_op`` methods: the
executor builds every op event for it, which is the whole cost of a hook that
does nothing. Ratios are hooked/unhooked and npu/golden.
"""

from __future__ import annotations

import argparse
import statistics
import time

from precision_tool.engine.device import golden, npu
from precision_tool.session import MODELS, Session, SessionConfig

DEVICES = {
    "golden": golden,
    "npu": npu,  # allow_fp32_to_fp16, saturation, every fusion pass on
    "npu force_fp16": lambda: npu(precision_mode="force_fp16"),
}
WARMUP = 3


class EmptyHook:
    """Registered for every op, does nothing."""

    def before_op(self, event) -> None:
        pass

    def after_op(self, event) -> None:
        pass


def step_times(model: str, device_name: str, steps: int) -> tuple[float, float]:
    """Median ms per step without and with the empty hook."""
    config = SessionConfig(model=model, steps=steps + WARMUP, device=DEVICES[device_name]())
    plain, hooked = Session(config), Session(config, hooks=[EmptyHook()])
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(steps + WARMUP):
        for key, session in enumerate((plain, hooked)):
            start = time.perf_counter()
            session.step()
            elapsed = time.perf_counter() - start
            if i >= WARMUP:
                times[key].append(elapsed * 1000)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    args = parser.parse_args()
    header = f"{'model':<16}{'device':<16}{'ms/step':>9}{'hooked':>9}{'hooked/plain':>14}{'npu/golden':>12}"
    print(header)
    print("-" * len(header))
    for model in args.models.split(","):
        golden_ms = None
        for device_name in DEVICES:
            plain_ms, hooked_ms = step_times(model, device_name, args.steps)
            golden_ms = golden_ms or plain_ms
            ratio = "" if device_name == "golden" else f"{plain_ms / golden_ms:.2f}x"
            print(f"{model:<16}{device_name:<16}{plain_ms:>9.2f}{hooked_ms:>9.2f}"
                  f"{hooked_ms / plain_ms:>13.2f}x{ratio:>12}")


if __name__ == "__main__":
    main()
