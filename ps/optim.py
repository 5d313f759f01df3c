"""Server-side optimizers in numpy, with MXNet 1.9.1's update rules.

Optimizers travel as a msgpack-able *spec* (``{"name": ..., "params": {...}}``),
never as code: a server only ever builds optimizers from this registry.

Interface used by the server (``ps/store.py``)::

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
import math
from typing import Any

import msgpack
import numpy as np

from ._mxnumerics import _clip, _f32, _kernel_momentum, _pow, _scalar, _sign, _sum_sq, _tuple_f32, _zeros
from .lr_scheduler import LRScheduler, scheduler_from_spec

logger = logging.getLogger(__name__)

REGISTRY: dict[str, type[Optimizer]] = {}
_BLOCK = 1 << 16   # elements per block of the in-place updates (two scratch blocks stay in L2)

_STATE_FORMAT = "ps.optim.states/1"


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
        self._index_update_count: dict[int, int] = {}

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
    def _update_count(self, key: int) -> None:
        count = self._index_update_count.get(key, self.begin_num_update) + 1
        self._index_update_count[key] = count
        self.num_update = max(count, self.num_update)

    def _get_lr(self, key: int) -> float:
        return self.learning_rate * self.lr_mult.get(key, 1.0)

    def _get_wd(self, key: int) -> float:
        return self.wd * self.wd_mult.get(key, 1.0)

    def _kernel_clip(self) -> float | None:
        """Clip bound for C++-kernel optimizers: MXNet passes it only if truthy, the kernel needs >= 0."""
        c = self.clip_gradient
        return c if c and c >= 0 else None

    def _clip_grad(self, dt: type, x: np.ndarray) -> np.ndarray:
        c = self._kernel_clip()
        return x if c is None else _clip(x, _f32(dt, -c), _f32(dt, c))

    def _clip_nd(self, dt: type, x: np.ndarray) -> np.ndarray:
        """``nd.clip`` in MXNet's Python-level optimizers: any bound that is not None applies."""
        c = self.clip_gradient
        return x if c is None else _clip(x, _f32(dt, -c), _f32(dt, c))

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
        self._update_count(key)
        return self._get_lr(key), self._get_wd(key)

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


@register
class SGD(Optimizer):
    """SGD with optional momentum: MXNet's ``multi_sgd[_mom]_update`` kernel, which its updater runs."""

    elementwise = True
    _hyper = ("momentum", "lazy_update")  # lazy_update only matters for row-sparse grads

    def __init__(self, momentum: float = 0.0, lazy_update: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum, self.lazy_update = float(momentum), bool(lazy_update)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return np.zeros_like(weight) if self.momentum != 0.0 else None

    def _step(self, key, w, g, mom, lr, wd):
        """Block by block, in place: the same operations in the same order as
        ``new = m*mom - (lr*wd)*w - (lr*rs)*g; w += new``, so results are bit-identical,
        but each block stays in cache and no full-size temporary is allocated (3-4x faster
        on a 20 MB key, which a server updates every step)."""
        dt = w.dtype.type
        lr_, rs = _tuple_f32(dt, lr), _f32(dt, self.rescale_grad)
        clip = self._kernel_clip()
        m, wdl, lrs = _kernel_momentum(dt, self.momentum), lr_ * _tuple_f32(dt, wd), lr_ * rs
        zero_mom = m * dt(0)
        wf, gf = w.reshape(-1), g.reshape(-1)
        mf = mom.reshape(-1) if mom is not None else None
        size = min(_BLOCK, wf.size)
        step_buf, decay_buf = np.empty(size, w.dtype), np.empty(size, w.dtype)
        for i in range(0, wf.size, _BLOCK):
            ww, gg = wf[i:i + _BLOCK], gf[i:i + _BLOCK]
            step, decay = step_buf[:ww.size], decay_buf[:ww.size]
            if clip:
                np.multiply(self._clip_grad(dt, rs * gg), lr_, out=step)
            else:
                np.multiply(gg, lrs, out=step)
            np.multiply(ww, wdl, out=decay)
            if mf is not None:
                new = mf[i:i + _BLOCK]
                np.multiply(new, m, out=new)
            else:
                new = decay
                np.subtract(zero_mom, decay, out=new)
                decay = None
            if decay is not None:
                np.subtract(new, decay, out=new)
            np.subtract(new, step, out=new)
            np.add(ww, new, out=ww)


@register
class NAG(Optimizer):
    """Nesterov momentum (``nag_mom_update``; ``sgd_update`` without momentum).

    MXNet runs the kernel in place, so the momentum update reads the *new* weight;
    ps does the same.
    """

    elementwise = True
    _hyper = ("momentum",)

    def __init__(self, momentum: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum = float(momentum)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return np.zeros_like(weight) if self.momentum != 0.0 else None

    def _step(self, key, w, g, mom, lr, wd):
        dt = w.dtype.type
        lr_, wd_, rs = _f32(dt, lr), _f32(dt, wd), _f32(dt, self.rescale_grad)
        if mom is None:
            step = lr_ * self._clip_grad(dt, rs * g) if self._kernel_clip() else (lr_ * rs) * g
            w[...] = (dt(1) - lr_ * wd_) * w - step
            return
        m, gr = _kernel_momentum(dt, self.momentum), self._clip_grad(dt, rs * g)
        mom *= m
        w[...] = (w - mom) + (m + dt(1)) * (mom - lr_ * (gr + wd_ * w))
        mom[...] = mom - lr_ * (gr + wd_ * w)


@register
class Adam(Optimizer):
    """Adam (``adam_update``), bias correction folded into the lr as MXNet does."""

    elementwise = True
    _hyper = ("beta1", "beta2", "epsilon", "lazy_update")

    def __init__(self, learning_rate: float | None = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, lazy_update: bool = True, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.lazy_update = bool(lazy_update)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return _zeros(weight, 2)

    def _step(self, key, w, g, state, lr, wd):
        mean, var = state
        t = self._index_update_count[key]
        lr *= math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        dt = w.dtype.type
        b1, b2 = _f32(dt, self.beta1), _f32(dt, self.beta2)
        gr = self._clip_grad(dt, g * _f32(dt, self.rescale_grad) + w * _f32(dt, wd))
        mean[...] = b1 * mean + (dt(1) - b1) * gr
        var[...] = b2 * var + (dt(1) - b2) * gr * gr
        w[...] = w - _f32(dt, lr) * mean / (np.sqrt(var) + _f32(dt, self.epsilon))


@register
class AdaGrad(Optimizer):
    """AdaGrad; MXNet writes it with NDArray ops, so scalars are doubles and clipping always applies."""

    elementwise = True
    _hyper = ("eps",)

    def __init__(self, eps: float = 1e-7, **kwargs: Any):
        super().__init__(**kwargs)
        self.eps = float(eps)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return np.zeros_like(weight)

    def _step(self, key, w, g, history, lr, wd):
        dt = w.dtype.type
        g = self._clip_nd(dt, g * _scalar(dt, self.rescale_grad))
        history += g * g
        div = g / np.sqrt(history + _scalar(dt, self.eps))
        w += (div + w * _scalar(dt, wd)) * _scalar(dt, -lr)


@register
class RMSProp(Optimizer):
    """RMSProp: Tieleman & Hinton (``rmsprop_update``) or Graves' centered (``rmspropalex_update``)."""

    elementwise = True
    _hyper = ("gamma1", "gamma2", "epsilon", "centered", "clip_weights")

    def __init__(self, learning_rate: float | None = 0.001, gamma1: float = 0.9, gamma2: float = 0.9,
                 epsilon: float = 1e-8, centered: bool = False, clip_weights: float | None = None,
                 **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.gamma1, self.gamma2, self.epsilon = float(gamma1), float(gamma2), float(epsilon)
        self.centered = bool(centered)
        self.clip_weights = None if clip_weights is None else float(clip_weights)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return _zeros(weight, 3 if self.centered else 1)

    def _step(self, key, w, g, state, lr, wd):
        dt = w.dtype.type
        g1, lr_, eps = _f32(dt, self.gamma1), _f32(dt, lr), _f32(dt, self.epsilon)
        gr = self._clip_grad(dt, _f32(dt, self.rescale_grad) * g + _f32(dt, wd) * w)
        if self.centered:
            n, mean_g, delta = state
            n[...] = (dt(1) - g1) * gr * gr + g1 * n
            mean_g[...] = (dt(1) - g1) * gr + g1 * mean_g
            delta[...] = _f32(dt, self.gamma2) * delta - lr_ * gr / np.sqrt(n - mean_g * mean_g + eps)
            new = w + delta
        else:
            (n,) = state
            n[...] = (dt(1) - g1) * (gr * gr) + g1 * n
            new = w - lr_ * (gr / np.sqrt(n + eps))
        cw = self.clip_weights
        w[...] = _clip(new, _f32(dt, -cw), _f32(dt, cw)) if cw and cw >= 0 else new


@register
class AdaDelta(Optimizer):
    """AdaDelta (NDArray ops in MXNet, like AdaGrad; no learning rate involved)."""

    elementwise = True
    _hyper = ("rho", "epsilon")

    def __init__(self, rho: float = 0.90, epsilon: float = 1e-5, **kwargs: Any):
        super().__init__(**kwargs)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return _zeros(weight, 2)

    def _step(self, key, w, g, state, lr, wd):
        acc_g, acc_delta = state
        dt = w.dtype.type
        rho, one_rho, eps = _scalar(dt, self.rho), _scalar(dt, 1.0 - self.rho), _scalar(dt, self.epsilon)
        g = self._clip_nd(dt, g * _scalar(dt, self.rescale_grad))
        acc_g *= rho
        acc_g += one_rho * g * g
        delta = np.sqrt(acc_delta + eps) / np.sqrt(acc_g + eps) * g
        acc_delta *= rho
        acc_delta += one_rho * delta * delta
        w -= delta + w * _scalar(dt, wd)


@register
class Signum(Optimizer):
    """Signum (``signum_update``) or, without momentum, signSGD (``signsgd_update``)."""

    elementwise = True
    _hyper = ("momentum", "wd_lh")

    def __init__(self, learning_rate: float | None = 0.01, momentum: float = 0.9, wd_lh: float = 0.0,
                 **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum, self.wd_lh = float(momentum), float(wd_lh)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return np.zeros_like(weight) if self.momentum != 0.0 else None

    def _step(self, key, w, g, mom, lr, wd):
        dt = w.dtype.type
        lr_, wd_ = _f32(dt, lr), _f32(dt, wd)
        if mom is None:  # signSGD: rescale_grad, clip_gradient and wd_lh play no part
            w[...] = (dt(1) - lr_ * wd_) * w - lr_ * _sign(g)
            return
        m, rs = _kernel_momentum(dt, self.momentum), _f32(dt, self.rescale_grad)
        one_m = dt(1) - m
        step = one_m * self._clip_grad(dt, rs * g) if self._kernel_clip() else one_m * rs * g
        mom[...] = m * mom - one_m * wd_ * w - step
        w[...] = (dt(1) - lr_ * _f32(dt, self.wd_lh)) * w + lr_ * _sign(mom)


@register
class Ftrl(Optimizer):
    """FTRL-proximal (``ftrl_update``); state is ``(z, n)`` as in MXNet."""

    elementwise = True
    _hyper = ("lamda1", "beta")

    def __init__(self, lamda1: float = 0.01, learning_rate: float | None = 0.1, beta: float = 1,
                 **kwargs: Any):
        # MXNet's Ftrl sets lr after the base class, so it never overrides a scheduler's base_lr.
        super().__init__(**kwargs)
        if learning_rate is not None:
            self.lr = float(learning_rate)
        self.lamda1, self.beta = float(lamda1), float(beta)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return _zeros(weight, 2)

    def _step(self, key, w, g, state, lr, wd):
        z, n = state
        dt = w.dtype.type
        lr_, l1 = _f32(dt, lr), _f32(dt, self.lamda1)
        gr = self._clip_grad(dt, g * _f32(dt, self.rescale_grad))
        z += gr - (np.sqrt(n + gr * gr) - np.sqrt(n)) * w / lr_
        n += gr * gr
        w[...] = ((_sign(z) * l1 - z) / ((_f32(dt, self.beta) + np.sqrt(n)) / lr_ + _f32(dt, wd))
                  * (np.abs(z) > l1).astype(dt))


@register
class LAMB(Optimizer):
    """LAMB as MXNet's updater runs it (``multi_lamb_update``).

    The trust ratio uses the norms of the array the server holds, i.e. its slice of a
    parameter that was split across servers -- exactly what an MXNet server does.
    """

    elementwise = False   # the trust ratio takes norms over the whole array
    _hyper = ("beta1", "beta2", "epsilon", "lower_bound", "upper_bound", "bias_correction")

    def __init__(self, learning_rate: float | None = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-6, lower_bound: float | None = None,
                 upper_bound: float | None = None, bias_correction: bool = True, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.lower_bound = None if lower_bound is None else float(lower_bound)
        self.upper_bound = None if upper_bound is None else float(upper_bound)
        self.bias_correction = bool(bias_correction)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return _zeros(weight, 2)

    def update_multi_precision(self, key, weight, grad, state):
        # MXNet's multi_mp_lamb_update takes the weight norm from the fp16 weight, not the master.
        if not (self.multi_precision and weight.dtype == np.float16):
            return self.update(key, weight, grad, state)
        master, inner = state
        self._update_count(key)
        grad = grad.astype(np.float32)
        self._lamb(key, master, grad, inner, self._get_lr(key), self._get_wd(key), weight)
        np.copyto(weight, master, casting="same_kind")

    def _step(self, key, w, g, state, lr, wd):
        self._lamb(key, w, g, state, lr, wd, w)

    def _lamb(self, key, w, g, state, lr, wd, norm_of):
        mean, var = state
        dt = w.dtype.type
        b1, b2 = _f32(dt, self.beta1), _f32(dt, self.beta2)
        gr = self._clip_grad(dt, g * _f32(dt, self.rescale_grad))
        mean[...] = b1 * mean + (dt(1) - b1) * gr
        var[...] = b2 * var + (dt(1) - b2) * gr * gr
        m, v = mean, var
        if self.bias_correction:
            t = self._index_update_count[key]
            m, v = mean / (dt(1) - _pow(b1, t)), var / (dt(1) - _pow(b2, t))
        # The kernel's unqualified sqrt() is the C double one, so this line runs in double.
        upd = (m / (np.sqrt(v.astype(np.float64)) + np.float64(_f32(dt, self.epsilon)))
               + (_tuple_f32(dt, wd) * w)).astype(dt)
        w -= dt(_tuple_f32(dt, lr) * self._trust_ratio(norm_of, upd)) * upd

    def _trust_ratio(self, w: np.ndarray, upd: np.ndarray) -> np.float32:
        r1, r2 = np.sqrt(_sum_sq(w)), np.sqrt(_sum_sq(upd))
        if self.lower_bound and self.lower_bound >= 0:
            r1 = max(r1, _f32(np.float32, self.lower_bound))
        if self.upper_bound and self.upper_bound >= 0:
            r1 = min(r1, _f32(np.float32, self.upper_bound))
        return np.float32(1) if r1 == 0 or r2 == 0 else r1 / r2


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


# -- state save/load without pickle --------------------------------------------------------
def _pack(state: Any) -> Any:
    if state is None:
        return None
    if isinstance(state, np.ndarray):
        return {"dtype": state.dtype.str, "shape": list(state.shape), "data": state.tobytes()}
    return [_pack(s) for s in state]


def _unpack(obj: Any) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return np.frombuffer(obj["data"], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    return tuple(_unpack(s) for s in obj)


def _layout(state: Any) -> Any:
    if state is None or isinstance(state, np.ndarray):
        return None if state is None else (state.dtype.str, state.size)
    return tuple(_layout(s) for s in state)


def _slice(state: Any, off: int, n: int) -> Any:
    if state is None or isinstance(state, np.ndarray):
        return None if state is None else state[off:off + n]
    return tuple(_slice(s, off, n) for s in state)


class Updater:
    """Applies one optimizer to many keys, keeping a state per key (MXNet ``get_updater``).

    ``updater(key, grad, weight)`` is one whole update. For an :attr:`elementwise`
    optimizer the same update can also be done in pieces, which is how a server avoids a
    full-size gradient sum::

        updater.begin(key, weight)                    # counts the update, fixes lr and wd
        updater.update_chunk(key, off, grad_chunk, weight)   # any order, each slice once

    and gives bit-identical results.
    """

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.states: dict[int, Any] = {}
        self._loaded: set[int] = set()  # keys whose state came from set_states, checked on first use
        self._lr_wd: dict[int, tuple[float, float]] = {}   # key -> (lr, wd) of its update in pieces

    @property
    def elementwise(self) -> bool:
        """Only a class that says so itself: a subclass inheriting ``elementwise = True`` may
        have changed the arithmetic (and would then be updated chunk by chunk wrongly)."""
        return bool(type(self.optimizer).__dict__.get("elementwise", False))

    def __call__(self, key: int, grad: np.ndarray, weight: np.ndarray) -> None:
        self.optimizer.update_multi_precision(key, weight, grad, self._state(key, weight))

    def begin(self, key: int, weight: np.ndarray) -> None:
        """Start one update of ``key`` (the full ``weight``), to be done by :meth:`update_chunk`."""
        if not self.elementwise:
            raise TypeError(f"{type(self.optimizer).__name__} is not elementwise: it cannot update in chunks")
        self._state(key, weight)
        self._lr_wd[key] = self.optimizer.begin_update(key)

    def update_chunk(self, key: int, off: int, grad: np.ndarray, weight: np.ndarray) -> None:
        """Update ``weight[off:off + grad.size]`` (and the same slice of the states) in place."""
        n = grad.size
        self.optimizer.step_multi_precision(key, weight[off:off + n], grad, _slice(self.states[key], off, n),
                                            *self._lr_wd[key])

    def _state(self, key: int, weight: np.ndarray) -> Any:
        if key not in self.states:
            self.states[key] = self.optimizer.create_state_multi_precision(key, weight)
        elif key in self._loaded:
            self._check_loaded(key, weight)
        return self.states[key]

    def _check_loaded(self, key: int, weight: np.ndarray) -> None:
        fresh = self.optimizer.create_state_multi_precision(key, weight)
        if _layout(fresh) != _layout(self.states[key]):
            raise ValueError(f"loaded optimizer state for key {key} does not fit its {weight.size}-element "
                             f"{weight.dtype} weight: states must come from the same job layout and "
                             f"optimizer settings")
        self._loaded.discard(key)

    def get_states(self) -> bytes:
        """Serialize per-key states, update counts, num_update and the lr schedule (msgpack, no pickle).

        Example::

            blob = updater.get_states(); other.set_states(blob)
        """
        opt = self.optimizer
        return msgpack.packb({
            "format": _STATE_FORMAT,
            "optimizer": opt.to_spec(),
            "update_counts": [[k, v] for k, v in opt._index_update_count.items()],
            "states": [[k, _pack(s)] for k, s in self.states.items()],
        }, use_bin_type=True)

    def set_states(self, data: bytes) -> None:
        """Restore what :meth:`get_states` saved, so training continues exactly.

        The blob must come from the same job layout (same keys, servers and key slicing):
        states are per server slice and are checked against the weight size on first use.
        Hyper-parameters stay those of the current optimizer; the learning rate, its
        scheduler state, ``num_update`` and the per-key update counts are restored.

        Raises
        ------
        ValueError
            The blob is not an optimizer state, or was saved by another optimizer type.

        Example::

            updater.set_states(open("opt.states", "rb").read())
        """
        try:
            saved = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise ValueError(f"not an optimizer state blob: {e}") from None
        if not isinstance(saved, dict) or saved.get("format") != _STATE_FORMAT:
            raise ValueError("not an optimizer state blob saved by ps.optim.Updater.get_states")
        name, params = saved["optimizer"]["name"], saved["optimizer"]["params"]
        opt = self.optimizer
        if name != type(opt).__name__.lower():
            raise ValueError(f"optimizer states were saved by {name!r}, cannot load into "
                             f"{type(opt).__name__.lower()!r}")
        opt.num_update = int(params["num_update"])
        opt._index_update_count = {int(k): int(v) for k, v in saved["update_counts"]}
        opt.lr_scheduler = scheduler_from_spec(params["lr_scheduler"])
        if params["learning_rate"] is not None:
            opt.lr = float(params["learning_rate"])
        self.states = {int(k): _unpack(s) for k, s in saved["states"]}
        self._loaded = set(self.states)

