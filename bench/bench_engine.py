"""Time simulated fp16 ops against the same op in plain float32 numpy.

Run: ``python bench/bench_engine.py [--repeat N] [--fused]``. Each simulated op
is the registered kernel called with ``KernelContext(FLOAT16)`` on inputs that
already hold fp16 values, as they do inside a run (the producing op rounded
them, so the executor converts nothing): what it costs over float32 is the
rounding of its result. The target (DESIGN.md) is a ratio of at most 2.
``--fused`` adds the fused kernels, which round every intermediate, against
the float32 chain they replace (informational: no target).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from precision_tool.engine.formats import FLOAT16
from precision_tool.engine.ops import KernelContext, get_op

TARGET = 2.0
_C, _A = math.sqrt(2 / math.pi), 0.044715


def fp16_values(rng, shape, scale=1.0):
    """float32 arrays holding fp16 values, as tensors between npu ops do."""
    return FLOAT16.round(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))[0]


def softmax32(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def layer_norm32(x, gamma, beta):
    centered = x - x.mean(axis=-1, keepdims=True)
    centered *= 1 / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + 1e-5)
    return gamma * centered + beta


def gelu32(x):
    return 0.5 * x * (1 + np.tanh(_C * (x + _A * (x * x * x))))


def cases(rng, fused: bool):
    """(label, op type, inputs, attrs, float32 reference function)."""
    a, b = fp16_values(rng, (256, 1024)), fp16_values(rng, (1024, 1024), 1 / 32)
    scores = fp16_values(rng, (64 * 8, 128, 128), 3.0)
    acts = fp16_values(rng, (4096, 1024))
    gamma, beta, bias = (fp16_values(rng, (1024,)) for _ in range(3))
    rows = [
        ("MatMul (256,1024)x(1024,1024)", "MatMul", [a, b], {}, lambda: a @ b),
        ("Softmax (512,128,128)", "Softmax", [scores], {"axis": -1}, lambda: softmax32(scores)),
        ("LayerNorm (4096,1024)", "LayerNorm", [acts, gamma, beta], {"eps": 1e-5},
         lambda: layer_norm32(acts, gamma, beta)),
        ("Gelu (4096,1024)", "Gelu", [acts], {}, lambda: gelu32(acts)),
    ]
    if fused:
        scale, eps = np.array(0.125, np.float32), np.array(1e-5, np.float32)
        rows += [
            ("fused MatMulBiasAddGelu", "MatMulBiasAddGelu", [a, b, bias], {}, lambda: gelu32(a @ b + bias)),
            ("fused ScaledMaskedSoftmax", "ScaledMaskedSoftmax", [scores, scale], {},
             lambda: softmax32(scores * scale)),
            ("fused LayerNormFused", "LayerNormFused", [acts, gamma, beta, eps], {},
             lambda: layer_norm32(acts, gamma, beta)),
        ]
    return rows


def best_pair(repeat: int, reference, simulated) -> tuple[float, float]:
    """Best-of-N seconds of both functions, alternating so both see the same machine load."""
    best = [math.inf, math.inf]
    for _ in range(repeat):
        for i, function in enumerate((reference, simulated)):
            start = time.perf_counter()
            function()
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0], best[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="best of N runs (default 7)")
    parser.add_argument("--fused", action="store_true", help="also time the fused kernels")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'op':34} {'fp32 ms':>9} {'fp16 ms':>9} {'ratio':>6}")
    worst = 0.0
    with np.errstate(all="ignore"):
        for label, op_type, inputs, attrs, reference in cases(rng, args.fused):
            kernel = get_op(op_type).forward
            fp32, fp16 = best_pair(args.repeat, reference, lambda: kernel(
                KernelContext(FLOAT16, overflow_mode="saturation"), *inputs, **attrs))
            ratio = fp16 / fp32
            if not label.startswith("fused"):
                worst = max(worst, ratio)
            print(f"{label:34} {fp32 * 1e3:9.2f} {fp16 * 1e3:9.2f} {ratio:6.2f}")
    verdict = "within" if worst <= TARGET else "ABOVE"
    print(f"worst plain-op ratio {worst:.2f}: {verdict} the {TARGET:g}x target")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
