"""PyTorch's SGD and Adam, for the servers of a ``ps.torch.ServerOptimizer`` job.

They run PyTorch's own tensor operations, in the order ``torch.optim``'s single-tensor path
(the CPU default) runs them, on tensors that share the server's numpy memory: PyTorch's CPU
kernels fuse multiply-adds and have their own ``sqrt``, so numpy arithmetic would differ in
the last bit. Imported lazily: a server needs torch only when a job sends one of these.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import Optimizer, register


def _tensor(torch: Any, a: np.ndarray) -> Any:
    """A tensor on ``a``'s memory (a copy if the array is read-only, such as a received frame)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RuntimeError("this job runs PyTorch's update rules on the servers (ps.torch.ServerOptimizer), "
                           "but torch is not installed where the servers run: pip install torch") from None
    return torch


@register
class TorchSGD(Optimizer):
    """``torch.optim.SGD``: weight decay added to the gradient, momentum buffer started from
    the first gradient, optional dampening and Nesterov."""

    elementwise = True
    modules = ("torch",)
    _hyper = ("momentum", "dampening", "nesterov")

    def __init__(self, momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum, self.dampening, self.nesterov = float(momentum), float(dampening), bool(nesterov)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return np.zeros_like(weight) if self.momentum else None

    def _step(self, key, w, g, buf, lr, wd):
        torch = _torch()
        p, d = torch.from_numpy(w), _tensor(torch, g)
        if self.rescale_grad != 1.0:
            d = d.mul(self.rescale_grad)
        if wd:
            d = d.add(p, alpha=wd)
        if self.momentum:
            b = torch.from_numpy(buf)
            if self.index_update_count[key] == 1:
                b.copy_(d)
            else:
                b.mul_(self.momentum).add_(d, alpha=1 - self.dampening)
            d = d.add(b, alpha=self.momentum) if self.nesterov else b
        p.add_(d, alpha=-lr)


@register
class TorchAdam(Optimizer):
    """``torch.optim.Adam`` (L2 weight decay added to the gradient; ``amsgrad``)."""

    elementwise = True
    modules = ("torch",)
    _hyper = ("beta1", "beta2", "eps", "amsgrad")

    def __init__(self, learning_rate: float | None = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, amsgrad: bool = False, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.eps, self.amsgrad = float(beta1), float(beta2), float(eps), bool(amsgrad)

    def create_state(self, key: int, weight: np.ndarray) -> Any:
        return [np.zeros_like(weight) for _ in range(3 if self.amsgrad else 2)]

    def _step(self, key, w, g, state, lr, wd):
        torch = _torch()
        p, grad = torch.from_numpy(w), _tensor(torch, g)
        exp_avg, exp_avg_sq = torch.from_numpy(state[0]), torch.from_numpy(state[1])
        if self.rescale_grad != 1.0:
            grad = grad.mul(self.rescale_grad)
        if wd:
            grad = grad.add(p, alpha=wd)
        exp_avg.lerp_(grad, 1 - self.beta1)
        exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        step = float(self.index_update_count[key])
        bias_correction1 = 1 - self.beta1 ** step
        bias_correction2 = 1 - self.beta2 ** step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5
        if self.amsgrad:
            peak = torch.from_numpy(state[2])
            torch.maximum(peak, exp_avg_sq, out=peak)
            denom = (peak.sqrt() / bias_correction2_sqrt).add_(self.eps)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
        p.addcdiv_(exp_avg, denom, value=-step_size)
