"""The update rules: MXNet 1.9.1's optimizers, redone in numpy kernel by kernel (see base.py)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import Optimizer, register
from .numerics import clip, f32, kernel_momentum, power, scalar, sign, sum_sq, tuple_f32, zeros

BLOCK = 1 << 16   # elements per block of the in-place updates (two scratch blocks stay in L2)


@register
class SGD(Optimizer):
    """SGD with optional momentum: MXNet's ``multi_sgd[_mom]_update`` kernel, which its updater runs."""

    elementwise = True
    _hyper = ("momentum", "lazy_update")  # lazy_update only matters for row-sparse grads

    def __init__(self, momentum: float = 0.0, lazy_update: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum, self.lazy_update = float(momentum), bool(lazy_update)

    @property
    def lazy_rows(self) -> bool:
        return self.lazy_update

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return np.zeros_like(weight) if self.momentum != 0.0 else None

    def _step(self, key, w, g, mom, lr, wd):
        """Block by block, in place: the same operations in the same order as
        ``new = m*mom - (lr*wd)*w - (lr*rs)*g; w += new``, so results are bit-identical,
        but each block stays in cache and no full-size temporary is allocated (3-4x faster
        on a 20 MB key, which a server updates every step)."""
        dt = w.dtype.type
        lr_, rs = tuple_f32(dt, lr), f32(dt, self.rescale_grad)
        clip = self.kernel_clip()
        m, wdl, lrs = kernel_momentum(dt, self.momentum), lr_ * tuple_f32(dt, wd), lr_ * rs
        zero_mom = m * dt(0)
        wf, gf = w.reshape(-1), g.reshape(-1)
        mf = mom.reshape(-1) if mom is not None else None
        size = min(BLOCK, wf.size)
        step_buf, decay_buf = np.empty(size, w.dtype), np.empty(size, w.dtype)
        for i in range(0, wf.size, BLOCK):
            ww, gg = wf[i:i + BLOCK], gf[i:i + BLOCK]
            step, decay = step_buf[:ww.size], decay_buf[:ww.size]
            if clip:
                np.multiply(self.clip_grad(dt, rs * gg), lr_, out=step)
            else:
                np.multiply(gg, lrs, out=step)
            np.multiply(ww, wdl, out=decay)
            if mf is not None:
                new = mf[i:i + BLOCK]
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
        lr_, wd_, rs = f32(dt, lr), f32(dt, wd), f32(dt, self.rescale_grad)
        if mom is None:
            step = lr_ * self.clip_grad(dt, rs * g) if self.kernel_clip() else (lr_ * rs) * g
            w[...] = (dt(1) - lr_ * wd_) * w - step
            return
        m, gr = kernel_momentum(dt, self.momentum), self.clip_grad(dt, rs * g)
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

    @property
    def lazy_rows(self) -> bool:
        return self.lazy_update

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return zeros(weight, 2)

    def _step(self, key, w, g, state, lr, wd):
        mean, var = state
        t = self.index_update_count[key]
        lr *= math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        dt = w.dtype.type
        b1, b2 = f32(dt, self.beta1), f32(dt, self.beta2)
        gr = self.clip_grad(dt, g * f32(dt, self.rescale_grad) + w * f32(dt, wd))
        mean[...] = b1 * mean + (dt(1) - b1) * gr
        var[...] = b2 * var + (dt(1) - b2) * gr * gr
        w[...] = w - f32(dt, lr) * mean / (np.sqrt(var) + f32(dt, self.epsilon))


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
        g = self.clip_nd(dt, g * scalar(dt, self.rescale_grad))
        history += g * g
        div = g / np.sqrt(history + scalar(dt, self.eps))
        w += (div + w * scalar(dt, wd)) * scalar(dt, -lr)


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
        return zeros(weight, 3 if self.centered else 1)

    def _step(self, key, w, g, state, lr, wd):
        dt = w.dtype.type
        g1, lr_, eps = f32(dt, self.gamma1), f32(dt, lr), f32(dt, self.epsilon)
        gr = self.clip_grad(dt, f32(dt, self.rescale_grad) * g + f32(dt, wd) * w)
        if self.centered:
            n, mean_g, delta = state
            n[...] = (dt(1) - g1) * gr * gr + g1 * n
            mean_g[...] = (dt(1) - g1) * gr + g1 * mean_g
            delta[...] = f32(dt, self.gamma2) * delta - lr_ * gr / np.sqrt(n - mean_g * mean_g + eps)
            new = w + delta
        else:
            (n,) = state
            n[...] = (dt(1) - g1) * (gr * gr) + g1 * n
            new = w - lr_ * (gr / np.sqrt(n + eps))
        cw = self.clip_weights
        w[...] = clip(new, f32(dt, -cw), f32(dt, cw)) if cw and cw >= 0 else new


@register
class AdaDelta(Optimizer):
    """AdaDelta (NDArray ops in MXNet, like AdaGrad; no learning rate involved)."""

    elementwise = True
    _hyper = ("rho", "epsilon")

    def __init__(self, rho: float = 0.90, epsilon: float = 1e-5, **kwargs: Any):
        super().__init__(**kwargs)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return zeros(weight, 2)

    def _step(self, key, w, g, state, lr, wd):
        acc_g, acc_delta = state
        dt = w.dtype.type
        rho, one_rho, eps = scalar(dt, self.rho), scalar(dt, 1.0 - self.rho), scalar(dt, self.epsilon)
        g = self.clip_nd(dt, g * scalar(dt, self.rescale_grad))
        acc_g *= rho
        acc_g += one_rho * g * g
        delta = np.sqrt(acc_delta + eps) / np.sqrt(acc_g + eps) * g
        acc_delta *= rho
        acc_delta += one_rho * delta * delta
        w -= delta + w * scalar(dt, wd)


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
        lr_, wd_ = f32(dt, lr), f32(dt, wd)
        if mom is None:  # signSGD: rescale_grad, clip_gradient and wd_lh play no part
            w[...] = (dt(1) - lr_ * wd_) * w - lr_ * sign(g)
            return
        m, rs = kernel_momentum(dt, self.momentum), f32(dt, self.rescale_grad)
        one_m = dt(1) - m
        step = one_m * self.clip_grad(dt, rs * g) if self.kernel_clip() else one_m * rs * g
        mom[...] = m * mom - one_m * wd_ * w - step
        w[...] = (dt(1) - lr_ * f32(dt, self.wd_lh)) * w + lr_ * sign(mom)


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
        return zeros(weight, 2)

    def _step(self, key, w, g, state, lr, wd):
        z, n = state
        dt = w.dtype.type
        lr_, l1 = f32(dt, lr), f32(dt, self.lamda1)
        gr = self.clip_grad(dt, g * f32(dt, self.rescale_grad))
        z += gr - (np.sqrt(n + gr * gr) - np.sqrt(n)) * w / lr_
        n += gr * gr
        w[...] = ((sign(z) * l1 - z) / ((f32(dt, self.beta) + np.sqrt(n)) / lr_ + f32(dt, wd))
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
        return zeros(weight, 2)

    def update_multi_precision(self, key, weight, grad, state):
        # MXNet's multi_mp_lamb_update takes the weight norm from the fp16 weight, not the master.
        if not (self.multi_precision and weight.dtype == np.float16):
            return self.update(key, weight, grad, state)
        master, inner = state
        self.update_count(key)
        grad = grad.astype(np.float32)
        self._lamb(key, master, grad, inner, self.get_lr(key), self.get_wd(key), weight)
        np.copyto(weight, master, casting="same_kind")

    def _step(self, key, w, g, state, lr, wd):
        self._lamb(key, w, g, state, lr, wd, w)

    def _lamb(self, key, w, g, state, lr, wd, norm_of):
        mean, var = state
        dt = w.dtype.type
        b1, b2 = f32(dt, self.beta1), f32(dt, self.beta2)
        gr = self.clip_grad(dt, g * f32(dt, self.rescale_grad))
        mean[...] = b1 * mean + (dt(1) - b1) * gr
        var[...] = b2 * var + (dt(1) - b2) * gr * gr
        m, v = mean, var
        if self.bias_correction:
            t = self.index_update_count[key]
            m, v = mean / (dt(1) - power(b1, t)), var / (dt(1) - power(b2, t))
        # The kernel's unqualified sqrt() is the C double one, so this line runs in double.
        upd = (m / (np.sqrt(v.astype(np.float64)) + np.float64(f32(dt, self.epsilon)))
               + (tuple_f32(dt, wd) * w)).astype(dt)
        w -= dt(tuple_f32(dt, lr) * self._trust_ratio(norm_of, upd)) * upd

    def _trust_ratio(self, w: np.ndarray, upd: np.ndarray) -> np.float32:
        r1, r2 = np.sqrt(sum_sq(w)), np.sqrt(sum_sq(upd))
        if self.lower_bound and self.lower_bound >= 0:
            r1 = max(r1, f32(np.float32, self.lower_bound))
        if self.upper_bound and self.upper_bound >= 0:
            r1 = min(r1, f32(np.float32, self.upper_bound))
        return np.float32(1) if r1 == 0 or r2 == 0 else r1 / r2


@register
class Test(Optimizer):
    """MXNet's ``test`` optimizer (``weight += rescale_grad * grad``; its tests use it), so
    their jobs run without MXNet on the servers. Like MXNet's, it counts no updates."""

    elementwise = True
    lazy_rows = True    # a row the gradient lacks gets += 0: unchanged either way

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return None

    def begin_update(self, key: int) -> tuple[float, float]:
        return 0.0, 0.0

    def _step(self, key, w, g, state, lr, wd):
        w += g * f32(w.dtype.type, self.rescale_grad)
