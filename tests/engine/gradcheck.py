"""One-op graphs through the executor: running them, and checking gradients by central differences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from precision_tool.engine.device import DeviceProfile, golden
from precision_tool.engine.executor import Executor
from precision_tool.engine.graph import GraphBuilder, Parameter
from precision_tool.engine.program import compile_graph


@dataclass
class OpCase:
    """A graph built by ``build(*params)`` from float ``arrays`` fed as parameters ``p0, p1, ...``."""

    op_type: str
    build: Callable
    arrays: list[np.ndarray]
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.op_type}-{self.label}" if self.label else self.op_type


class OneOpRunner:
    """A case compiled for one device, run forward and backward on given parameter values."""

    def __init__(self, case: OpCase, device: DeviceProfile | None = None, seed: int = 0):
        params = [Parameter(a, f"p{i}") for i, a in enumerate(case.arrays)]
        with GraphBuilder() as g:
            g.output("out", case.build(*params))
        self.names = [p.name for p in params]
        self.program = compile_graph(g.graph, device or golden(float64=True))
        self.executor = Executor(self.program, seed=seed)

    def forward(self, arrays, step: int = 0) -> np.ndarray:
        self.executor.begin_step(step)
        return self.executor.forward({}, dict(zip(self.names, arrays)))["out"]

    def backward(self, weights) -> list[np.ndarray]:
        grads = self.executor.backward({"out": weights})
        return [grads[name] for name in self.names]


def weighted_sum(out: np.ndarray, weights: np.ndarray) -> float:
    return float(np.sum(np.asarray(out, np.float64) * weights))


def numeric_gradients(runner: OneOpRunner, arrays: list[np.ndarray], weights: np.ndarray,
                      eps: float = 1e-6) -> list[np.ndarray]:
    """Central differences of ``sum(out * weights)`` with respect to every array."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    grads = []
    for array in arrays:
        grad = np.zeros_like(array)
        flat, gflat = array.reshape(-1), grad.reshape(-1)
        for i in range(flat.size):
            saved = flat[i]
            flat[i] = saved + eps
            plus = weighted_sum(runner.forward(arrays), weights)
            flat[i] = saved - eps
            minus = weighted_sum(runner.forward(arrays), weights)
            flat[i] = saved
            gflat[i] = (plus - minus) / (2 * eps)
        grads.append(grad)
    return grads


def check_gradients(case: OpCase, rtol: float = 1e-6, atol: float = 1e-8, seed: int = 0) -> None:
    """Assert the executor's float64 gradients of ``case`` match central differences."""
    runner = OneOpRunner(case)
    arrays = [np.asarray(a, dtype=np.float64) for a in case.arrays]
    out = runner.forward(arrays)
    weights = np.random.default_rng(seed).uniform(-1, 1, np.shape(out))
    analytic = runner.backward(weights)
    expected = numeric_gradients(runner, arrays, weights)
    for i, (got, want) in enumerate(zip(analytic, expected)):
        assert got.dtype == np.float64, f"{case.id}: gradient of p{i} is {got.dtype}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{case.id}: gradient of p{i}")


def run_graph(build: Callable, inputs: dict[str, np.ndarray], device: DeviceProfile | None = None,
              seed: int = 0, step: int = 0) -> tuple[np.ndarray, Executor]:
    """Trace ``build(*graph inputs)`` with ``inputs`` fed by name; return its output and the executor."""
    with GraphBuilder() as g:
        values = [g.input(name, is_float=np.asarray(a).dtype.kind == "f") for name, a in inputs.items()]
        g.output("out", build(*values))
    executor = Executor(compile_graph(g.graph, device or golden()), seed=seed)
    executor.begin_step(step)
    return executor.forward(inputs, {})["out"], executor
