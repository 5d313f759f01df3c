"""Row-wise optimizers for embedding tables (ps/embed): lazy, state beside the row.

Only the rows a step touched are updated, and their state too, as torch's optimizers do for a
sparse gradient (``nn.Embedding(sparse=True)``): ``SGD`` and ``Adagrad`` are
``torch.optim.SGD``/``Adagrad``'s sparse paths, ``Adam`` is ``torch.optim.SparseAdam``, each
with the table's step count where torch uses the parameter's. ``RowWiseAdagrad`` has no torch
counterpart: one accumulator per row, the mean of the row's squared gradient, as FBGEMM's and
TorchRec's; it keeps one float per row where Adagrad keeps a row's worth.

They travel as a spec (``{"name": ..., "params": {...}}``), never as code.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np


def _positive(name: str, value: Any, zero_ok: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or \
            value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be a number {'>=' if zero_ok else '>'} 0, got {value!r}")


@dataclass(frozen=True)
class RowOptimizer:
    """``state(dim)``: the per-row state arrays' widths and first values; ``update`` changes
    ``values[rows]`` and ``state[...][rows]`` for distinct ``rows`` by ``grads``."""

    name: ClassVar[str] = ""
    lr: float = 0.01

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "betas":
                if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(0 <= b < 1 for b in value)):
                    raise ValueError(f"betas must be two numbers in [0, 1), got {value!r}")
            else:
                _positive(f.name, value, zero_ok=f.name != "lr")

    def spec(self) -> dict[str, Any]:
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        return {"name": self.name, "params": params}

    def state(self, dim: int) -> dict[str, tuple[int, float]]:
        return {}

    def update(self, values: np.ndarray, state: dict[str, np.ndarray], rows: np.ndarray, grads: np.ndarray,
               step: int) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(RowOptimizer):
    name: ClassVar[str] = "sgd"

    def update(self, values, state, rows, grads, step):
        values[rows] -= (self.lr * grads).astype(values.dtype, copy=False)


@dataclass(frozen=True)
class Adagrad(RowOptimizer):
    name: ClassVar[str] = "adagrad"
    lr_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10

    def state(self, dim):
        return {"sum": (dim, self.initial_accumulator_value)}

    def update(self, values, state, rows, grads, step):
        acc = state["sum"][rows] + grads * grads
        state["sum"][rows] = acc
        clr = self.lr / (1 + (step - 1) * self.lr_decay)
        values[rows] -= clr * (grads / (np.sqrt(acc) + self.eps))


@dataclass(frozen=True)
class RowWiseAdagrad(RowOptimizer):
    name: ClassVar[str] = "rowwise_adagrad"
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10

    def state(self, dim):
        return {"sum": (1, self.initial_accumulator_value)}

    def update(self, values, state, rows, grads, step):
        acc = state["sum"][rows] + (grads * grads).mean(axis=1, keepdims=True)
        state["sum"][rows] = acc
        values[rows] -= self.lr * (grads / (np.sqrt(acc) + self.eps))


@dataclass(frozen=True)
class Adam(RowOptimizer):
    """torch.optim.SparseAdam: the moments of a row move only when the row has a gradient."""

    name: ClassVar[str] = "adam"
    lr: float = 0.001
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def state(self, dim):
        return {"exp_avg": (dim, 0.0), "exp_avg_sq": (dim, 0.0)}

    def update(self, values, state, rows, grads, step):
        b1, b2 = self.betas
        m, v = state["exp_avg"][rows], state["exp_avg_sq"][rows]
        m += (grads - m) * (1 - b1)
        v += (grads * grads - v) * (1 - b2)
        state["exp_avg"][rows], state["exp_avg_sq"][rows] = m, v
        step_size = self.lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        values[rows] -= step_size * (m / (np.sqrt(v) + self.eps))


ROW_OPTIMIZERS = {cls.name: cls for cls in (SGD, Adagrad, RowWiseAdagrad, Adam)}


def from_spec(spec: Any) -> RowOptimizer:
    """A row optimizer from its spec; ValueError naming what is wrong."""
    if not (isinstance(spec, dict) and isinstance(spec.get("name"), str) and isinstance(spec.get("params", {}), dict)):
        raise ValueError(f"a row optimizer spec is {{'name': ..., 'params': {{...}}}}, got {spec!r:.200}")
    cls = ROW_OPTIMIZERS.get(spec["name"])
    if cls is None:
        raise ValueError(f"unknown row optimizer {spec['name']!r}; ps has {', '.join(ROW_OPTIMIZERS)}")
    params = dict(spec.get("params", {}))
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"row optimizer {spec['name']!r} has no parameter {', '.join(unknown)}")
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    return cls(**params)
