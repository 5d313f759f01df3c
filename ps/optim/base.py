"""Server-side optimizers in numpy, with MXNet 1.9.1's update rules.

Optimizers travel as a msgpack-able *spec* (``{"name": ..., "params": {...}}``),
never as code: a server only ever builds optimizers from this registry.

Interface used by the server (``ps/server/store.py``)::

    updater = Updater(from_spec(spec))
    updater(key, grad, weight)     # flat 1-D numpy arrays; updates ``weight`` in place
    # or, for elementwise optimizers, one update in slices (see Updater):
    updater.begin(key, weight); updater.update_chunk(key, off, grad_chunk, weight)

Each update redoes the arithmetic of the MXNet kernel that MXNet's own ``get_updater``
runs: hyper-parameters turned into numbers as MXNet's op parser does, then the same
operations in the same order and dtype. That is what makes results bit-identical to
MXNet's rather than merely close; ``docs/optimizers.md`` has the details and measurements.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .lr_scheduler import LRScheduler, scheduler_from_spec
from .numerics import clip, f32

logger = logging.getLogger(__name__)

REGISTRY: dict[str, type[Optimizer]] = {}


def register(cls: type[Optimizer]) -> type[Optimizer]:
    REGISTRY[cls.__name__.lower()] = cls
    return cls


def _key(k: Any) -> int:
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        return int(k)
    if isinstance(k, str) and k.lstrip("-").isdigit():
        return int(k)  # int keys that a strict msgpack map turned into str
    raise ValueError(f"per-key multipliers need int keys (the worker maps str keys to ints), got {k!r}")


class Optimizer:
    """Hyper-parameters and per-key bookkeeping shared by every optimizer (MXNet ``Optimizer``).

    ``learning_rate=None`` means MXNet's default: the scheduler's lr, or 0.01 without one.
    A given ``learning_rate`` overrides the scheduler's ``base_lr``, as MXNet does.
    """

    _hyper: tuple[str, ...] = ()  # subclass parameters, spec names = attribute names
    # True when element i of the new weight and states depends only on element i of the
    # weight, gradient and states (given lr, wd and the update count): the server may then
    # update each chunk as soon as its gradient is summed (Updater.begin/update_chunk)
    # instead of keeping a full-size sum per key.
    elementwise = False
    # True where MXNet's update of a row_sparse gradient changes only the gradient's rows
    # (its "lazy update"); otherwise the rows not in the gradient count as zero gradient.
    # Only an elementwise optimizer can be lazy (Updater.update_rows runs it on those rows).
    lazy_rows = False
    # modules its update imports that take seconds to import (torch): a server imports them on a
    # thread of its own when the optimizer is set, not on its I/O thread at the first push
    modules: tuple[str, ...] = ()

    def __init__(self, learning_rate: float | None = None, wd: float = 0.0, rescale_grad: float = 1.0,
                 clip_gradient: float | None = None, lr_mult: dict | None = None,
                 wd_mult: dict | None = None, multi_precision: bool = False, begin_num_update: int = 0,
                 lr_scheduler: dict | LRScheduler | None = None, num_update: int | None = None):
        self.lr_scheduler = scheduler_from_spec(lr_scheduler)
        if self.lr_scheduler is None and learning_rate is None:
            learning_rate = 0.01
        self.lr = None if learning_rate is None else float(learning_rate)
        if self.lr_scheduler is not None and self.lr is not None and self.lr_scheduler.base_lr != self.lr:
            logger.info("learning rate from lr_scheduler has been overwritten by learning_rate")
            self.lr_scheduler.base_lr = self.lr
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        self.clip_gradient = None if clip_gradient is None else float(clip_gradient)
        self.lr_mult = {_key(k): float(v) for k, v in (lr_mult or {}).items()}
        self.wd_mult = {_key(k): float(v) for k, v in (wd_mult or {}).items()}
        self.multi_precision = bool(multi_precision)
        self.begin_num_update = int(begin_num_update)
        self.num_update = self.begin_num_update if num_update is None else int(num_update)
        self.index_update_count: dict[int, int] = {}

    @property
    def learning_rate(self) -> float:
        if self.lr_scheduler is not None:
            return self.lr_scheduler(self.num_update)
        assert self.lr is not None  # None only ever comes with a scheduler
        return self.lr

    def set_learning_rate(self, lr: float) -> None:
        """Set the lr, as MXNet: with a scheduler this raises (a ``UserWarning`` *exception*).

        Raises
        ------
        UserWarning
            The optimizer has an lr scheduler, which owns the learning rate.

        Example::

            opt.set_learning_rate(0.05)
        """
        if self.lr_scheduler is not None:
            raise UserWarning("LRScheduler of the optimizer has already been defined. Note that "
                              "set_learning_rate can mutate the value of the learning rate of the "
                              "optimizer only when the LRScheduler of the optimizer is undefined.")
        self.lr = float(lr)

    def _params(self) -> dict[str, Any]:
        sched = self.lr_scheduler
        return dict(learning_rate=None if sched is not None else self.lr, wd=self.wd,
                    rescale_grad=self.rescale_grad, clip_gradient=self.clip_gradient,
                    lr_mult=dict(self.lr_mult), wd_mult=dict(self.wd_mult),
                    multi_precision=self.multi_precision, begin_num_update=self.begin_num_update,
                    num_update=self.num_update,
                    lr_scheduler=None if sched is None else sched.to_spec(),
                    **{k: getattr(self, k) for k in self._hyper})

    def to_spec(self) -> dict[str, Any]:
        """A msgpack-able description from which :func:`from_spec` rebuilds this optimizer.

        ``lr_mult``/``wd_mult`` have int keys: unpack with ``strict_map_key=False``.
        """
        return {"name": type(self).__name__.lower(), "params": self._params()}

    # -- per-key bookkeeping, as MXNet's Optimizer --------------------------------------
    def update_count(self, key: int) -> None:
        count = self.index_update_count.get(key, self.begin_num_update) + 1
        self.index_update_count[key] = count
        self.num_update = max(count, self.num_update)

    def get_lr(self, key: int) -> float:
        return self.learning_rate * self.lr_mult.get(key, 1.0)

    def get_wd(self, key: int) -> float:
        return self.wd * self.wd_mult.get(key, 1.0)

    def kernel_clip(self) -> float | None:
        """Clip bound for C++-kernel optimizers: MXNet passes it only if truthy, the kernel needs >= 0."""
        c = self.clip_gradient
        return c if c and c >= 0 else None

    def clip_grad(self, dt: type, x: np.ndarray) -> np.ndarray:
        c = self.kernel_clip()
        return x if c is None else clip(x, f32(dt, -c), f32(dt, c))

    def clip_nd(self, dt: type, x: np.ndarray) -> np.ndarray:
        """``nd.clip`` in MXNet's Python-level optimizers: any bound that is not None applies."""
        c = self.clip_gradient
        return x if c is None else clip(x, f32(dt, -c), f32(dt, c))

    # -- states and updates ---------------------------------------------------------------
    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return None

    def create_state_multi_precision(self, key: int, weight: np.ndarray) -> Any:
        """An fp16 weight under ``multi_precision`` gets ``(fp32 master copy, state of the master)``."""
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (master, self.create_state(key, master))
        return self.create_state(key, weight)

    def update(self, key: int, weight: np.ndarray, grad: np.ndarray, state: Any) -> None:
        self.step(key, weight, grad, state, *self.begin_update(key))

    def update_multi_precision(self, key: int, weight: np.ndarray, grad: np.ndarray, state: Any) -> None:
        self.step_multi_precision(key, weight, grad, state, *self.begin_update(key))

    def begin_update(self, key: int) -> tuple[float, float]:
        """Count one update of ``key`` and return its ``(lr, wd)``.

        Split from the arithmetic so that an update applied slice by slice counts once and
        uses one lr: the count moves the lr schedule and Adam's bias correction.
        """
        self.update_count(key)
        return self.get_lr(key), self.get_wd(key)

    def step(self, key: int, weight: np.ndarray, grad: np.ndarray, state: Any, lr: float, wd: float) -> None:
        grad = grad.astype(weight.dtype, copy=False)  # kernels compute in the weight's dtype
        self._step(key, weight, grad, state, lr, wd)

    def step_multi_precision(self, key: int, weight: np.ndarray, grad: np.ndarray, state: Any,
                             lr: float, wd: float) -> None:
        """Update the fp32 master with an fp32 copy of the gradient, then round it into the weight."""
        if self.multi_precision and weight.dtype == np.float16:
            master, inner = state
            self.step(key, master, grad.astype(np.float32), inner, lr, wd)
            np.copyto(weight, master, casting="same_kind")
        else:
            self.step(key, weight, grad, state, lr, wd)

    def _step(self, key: int, w: np.ndarray, g: np.ndarray, state: Any, lr: float, wd: float) -> None:
        raise NotImplementedError


def modules_of(spec: Any) -> tuple[str, ...]:
    """The slow imports (:attr:`Optimizer.modules`) the optimizer ``spec`` names needs; none for a
    malformed spec (setting it then fails, and says why)."""
    name = spec.get("name") if isinstance(spec, dict) else None
    cls = REGISTRY.get(name.lower()) if isinstance(name, str) else None
    return cls.modules if cls is not None else ()


def from_spec(spec: dict[str, Any]) -> Optimizer:
    """Build an optimizer from its spec.

    Raises
    ------
    ValueError
        The spec is malformed, names an optimizer ps does not know, or has bad parameters.

    Example::

        opt = from_spec({"name": "sgd", "params": {"learning_rate": 0.1, "momentum": 0.9}})
    """
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"an optimizer spec is a dict with a 'name', not {spec!r:.200}")  # noqa: TRY004
    cls = REGISTRY.get(spec["name"].lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {spec['name']!r}; ps knows: {', '.join(sorted(REGISTRY))}")
    try:
        return cls(**spec.get("params", {}))
    except TypeError as e:
        raise ValueError(f"bad parameters for optimizer {spec['name']!r}: {e}") from None
