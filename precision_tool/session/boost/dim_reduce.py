"""DimReduce: a quasi-Newton step in a PCA subspace of the weights plus momentum on the rest.

With ``P`` the (k, n) PCA matrix (orthonormal rows), ``g`` the flattened
gradient and ``w`` the flattened weights, each step (mindspore.boost
DimReduce)::

    grad_k = P g;   d_k = -B_k grad_k;   s_k = rho^m d_k
    m: the smallest of 0 .. MAX_LINE_SEARCH-1 with loss(w + P^T s_k) < loss(w) + sigma grad_k^T s_k
       (the last one when none passes); the trial losses are unrecorded forwards on the step's batch
    momentum = gamma momentum + g - P^T grad_k
    w = w - (alpha momentum - P^T s_k)                  (MindSpore's SGD with lr 1)

``B_k`` starts as the identity and takes the BFGS inverse-Hessian update
with ``s`` the previous step's s_k and ``y`` the change of grad_k, when
``y^T s > 0``.

The PCA matrix comes from ``pca_mat_path`` (a .npy, or a .npz holding
``pca_mat`` or a single array, shape (k, n)); else from ``weight_load_dir``
(a directory of .npz weight snapshots, parameter name to array, read in
name order); else from the run itself: the first WARMUP_STEPS steps train
with the plain optimizer, and the initial weights plus the WARMUP_STEPS
snapshots after them (6 in all) give at most 5 components. Components are
the top right-singular vectors of the centred snapshots, at most
``n_components``. ``timeout`` is recorded only: nothing waits here.

Recorded ops: ``boost/dim_reduce/LineSearch`` (type DimReduceLineSearch:
input grad_k, outputs s_k and m) and one ``boost/dim_reduce/<param>`` per
parameter (type DimReduce: inputs the weight and its share of the update,
output the new weight).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from precision_tool.engine.executor import Executor
from precision_tool.engine.hooks import OPTIMIZER
from precision_tool.engine.status import FloatStatus
from precision_tool.errors import InputError

WARMUP_STEPS = 5
MAX_LINE_SEARCH = 8
PREFIX = "boost/dim_reduce"


def flatten(arrays: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[n], np.float64).ravel() for n in names])


def pca_matrix(snapshots: np.ndarray, n_components: int) -> np.ndarray:
    """(k, n) top principal directions of (s, n) weight snapshots; k <= min(n_components, s - 1)."""
    centred = snapshots - snapshots.mean(axis=0, keepdims=True)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    keep = int(np.sum(singular > singular.max(initial=0.0) * 1e-10))
    return vt[:max(1, min(n_components, keep, len(snapshots) - 1))]


def load_pca(path: str, size: int, n_components: int) -> np.ndarray:
    """A stored PCA matrix, checked against the model's ``size`` weights."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(path, "no such file (dim_reduce pca_mat_path)") from None
    except (OSError, ValueError) as exc:
        raise InputError(path, f"not a .npy/.npz array: {exc}") from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            keys = list(data.keys())
            key = "pca_mat" if "pca_mat" in keys else keys[0] if len(keys) == 1 else None
            if key is None:
                raise InputError(path, f"holds {', '.join(keys)}: name the matrix pca_mat")
            data = data[key]
    if data.ndim != 2 or data.shape[1] != size:
        raise InputError(path, f"PCA matrix of shape {data.shape}; the model has {size} weights: need (k, {size})")
    return np.asarray(data[:n_components], np.float64)


def snapshots_from_dir(directory: str, names: list[str]) -> np.ndarray:
    """(s, n) flattened weight snapshots from the .npz files of ``directory``."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(root, "no such directory (dim_reduce weight_load_dir)")
    files = sorted(root.glob("*.npz"))
    if len(files) < 2:
        raise InputError(root, "needs at least 2 .npz weight snapshots")
    rows = []
    for file in files:
        with np.load(file, allow_pickle=False) as data:
            missing = [n for n in names if n not in data]
            if missing:
                raise InputError(file, f"lacks weight {missing[0]!r}")
            rows.append(flatten(data, names))
    return np.stack(rows)


class DimReduce:
    """The PCA-subspace optimizer; warms up with the session's optimizer while it has no PCA matrix."""

    def __init__(self, settings: dict, params: dict[str, np.ndarray]):
        self.settings = settings
        self.names = list(params)
        self.shapes = {n: params[n].shape for n in self.names}
        size = sum(params[n].size for n in self.names)
        self.pca: np.ndarray | None = None
        self.source = "run"
        if settings["pca_mat_path"]:
            self.pca, self.source = load_pca(settings["pca_mat_path"], size, settings["n_components"]), "pca_mat_path"
        elif settings["weight_load_dir"]:
            self.pca = pca_matrix(snapshots_from_dir(settings["weight_load_dir"], self.names),
                                  settings["n_components"])
            self.source = "weight_load_dir"
        self.snapshots = [flatten(params, self.names)] if self.pca is None else []
        self.momentum = np.zeros(size)
        self.bk: np.ndarray | None = None
        self.previous: tuple[np.ndarray, np.ndarray] | None = None  # (grad_k, s_k) of the last step

    def update(self, session, step: int, grads: dict, batch: dict, loss: float) -> None:
        if self.pca is None:
            session.optimizer.apply(session.executor, session.params, grads)
            self.snapshots.append(flatten(session.params, self.names))
            if len(self.snapshots) > WARMUP_STEPS:
                self.pca = pca_matrix(np.stack(self.snapshots), self.settings["n_components"])
            return
        s = self.settings
        g, w = flatten(grads, self.names), flatten(session.params, self.names)
        gk = self.pca @ g
        self._update_bk(gk)
        dk = -self.bk @ gk
        silent = Executor(session.program, status=FloatStatus(), seed=session.config.seed)
        m, sk = 0, dk
        for m in range(MAX_LINE_SEARCH):
            sk = s["rho"] ** m * dk
            silent.begin_step(step)
            trial = float(silent.forward(batch, self._unflatten(w + self.pca.T @ sk))["loss"])
            if trial < loss + s["sigma"] * float(gk @ sk):
                break
        session.executor.run_external(f"{PREFIX}/LineSearch", "DimReduceLineSearch", OPTIMIZER,
                                      lambda _: [sk.astype(np.float32), np.float32([m])], [gk.astype(np.float32)])
        self.momentum = s["gamma"] * self.momentum + g - self.pca.T @ gk
        delta = self._unflatten(s["alpha"] * self.momentum - self.pca.T @ sk)
        self.previous = (gk, sk)
        for name in self.names:
            (session.params[name],) = session.executor.run_external(
                f"{PREFIX}/{name}", "DimReduce", OPTIMIZER, lambda v, d: [(v - d).astype(np.float32)],
                [session.params[name], delta[name]])

    def _update_bk(self, gk: np.ndarray) -> None:
        if self.bk is None or self.bk.shape[0] != gk.size:
            self.bk = np.eye(gk.size)
        if self.previous is None:
            return
        previous_gk, sk = self.previous
        yk = gk - previous_gk
        sy = float(yk @ sk)
        if sy <= 0:
            return
        rho = 1.0 / sy
        eye = np.eye(gk.size)
        self.bk = (eye - rho * np.outer(sk, yk)) @ self.bk @ (eye - rho * np.outer(yk, sk)) + rho * np.outer(sk, sk)

    def _unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        arrays, start = {}, 0
        for name in self.names:
            size = int(np.prod(self.shapes[name], dtype=np.int64))
            arrays[name] = flat[start:start + size].reshape(self.shapes[name]).astype(np.float32)
            start += size
        return arrays

    def state(self) -> dict:
        return {"pca_source": self.source, "components": None if self.pca is None else int(self.pca.shape[0]),
                "warmup_steps": WARMUP_STEPS if self.source == "run" else 0}
