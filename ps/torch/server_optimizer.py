"""``ServerOptimizer``: PyTorch's SGD or Adam runs on the servers (``ps.optim.TorchSGD`` /
``TorchAdam``, PyTorch's own kernels), workers push gradients and pull weights.

With ``init(kvstore="dist_async")`` every worker's gradient updates the weights the moment it
arrives (no worker waits for another); with ``dist_sync`` the servers average each step's
gradients first, which equals ``DistributedOptimizer``'s result with the state kept once, on
the servers, instead of on every worker. Each gradient leaves as soon as autograd has it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import optim
from . import runtime
from .sums import as_array


def _spec(optimizer: torch.optim.Optimizer) -> optim.Optimizer:
    """The server twin of ``optimizer``'s one hyper-parameter set, or a clear refusal."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if any(g != groups[0] for g in groups):
        raise ValueError("ServerOptimizer needs one set of hyper-parameters for all parameters "
                         "(param_groups with different settings are not supported)")
    g = groups[0]
    if g.get("maximize") or g.get("differentiable"):
        raise ValueError("ServerOptimizer does not support maximize=True or differentiable=True")
    if type(optimizer) is torch.optim.SGD:
        return optim.TorchSGD(learning_rate=float(g["lr"]), momentum=g["momentum"], dampening=g["dampening"],
                              nesterov=g["nesterov"], wd=g["weight_decay"])
    if type(optimizer) is torch.optim.Adam:
        if g.get("decoupled_weight_decay"):
            raise ValueError("ServerOptimizer runs Adam with L2 weight decay, not decoupled (AdamW)")
        b1, b2 = g["betas"]
        return optim.TorchAdam(learning_rate=float(g["lr"]), beta1=b1, beta2=b2, eps=g["eps"],
                               amsgrad=g["amsgrad"], wd=g["weight_decay"])
    raise ValueError(f"ServerOptimizer runs torch.optim.SGD and torch.optim.Adam on the servers, "
                     f"not {type(optimizer).__name__}")


class ServerOptimizer:
    """Wraps a ``torch.optim.SGD`` or ``Adam``: ``zero_grad()``, ``backward()``, ``step()`` as
    usual. Collective: every worker creates it with the same parameters; rank 0's current
    weights become everyone's. Alone (no cluster) it steps the wrapped optimizer locally."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Any = None):
        self.optimizer = optimizer
        spec = _spec(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        names = dict((p, n) for n, p in named_parameters) if named_parameters is not None else \
            {p: f"param.{i}" for i, p in enumerate(params)}
        missing = [i for i, p in enumerate(params) if p not in names]
        if missing:
            raise ValueError(f"named_parameters does not name {len(missing)} of the optimizer's parameters "
                             f"(indices {missing[:5]})")
        self._names = {p: names[p] for p in params if p.requires_grad}
        self._priority = {p: -i for i, p in enumerate(self._names)}     # first layer first (PS_SEND_WINDOW)
        self._kv = runtime.store()
        self._inflight: dict[torch.Tensor, tuple[Any, np.ndarray]] = {}
        if self._kv is None:
            return
        for p, name in self._names.items():
            if p.dtype != torch.float32:
                raise TypeError(f"parameter {name!r}: ServerOptimizer trains float32 parameters, got {p.dtype}")
            as_array(p.detach(), f"parameter {name!r}")
        if runtime.server_optimizer:
            raise RuntimeError("this job already has a ServerOptimizer: the servers run one optimizer")
        keys = [self._key(p) for p in self._names]
        sync = self._kv.type == "dist_sync"
        if sync:   # a mismatch would leave a sync round open; in async the pull below names it
            runtime.job.check_same_everywhere([(k, tuple(p.shape), np.dtype(np.float32))
                                               for k, p in zip(keys, self._names)])
        self._kv.init(keys, [p.detach().numpy().copy() for p in self._names])   # rank 0's weights win
        for p, value in zip(self._names, self._kv.pull(keys)):
            with torch.no_grad():
                p.copy_(torch.from_numpy(value))
        spec.rescale_grad = 1.0 / self._kv.num_workers if sync else 1.0
        self._kv.set_optimizer(spec)
        runtime.server_optimizer = True
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in self._names]

    def _key(self, p: torch.Tensor) -> str:
        return f"server.{self._names[p]}"

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def _ready(self, p: torch.Tensor) -> None:
        if p in self._inflight:
            raise RuntimeError(f"the gradient of {self._names[p]!r} was computed twice before step()")
        self._send(p)

    def _send(self, p: torch.Tensor) -> None:
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        flat = as_array(grad, f"gradient of {self._names[p]!r}").reshape(p.shape)
        result = np.empty(tuple(p.shape), np.float32)
        self._inflight[p] = (self._kv.pushpull(self._key(p), flat, out=result, block=False,
                                               priority=self._priority[p]), result)

    def step(self, closure: Any = None) -> Any:
        """Wait for the servers' new weights and put them into the parameters."""
        if self._kv is None:
            return self.optimizer.step(closure)
        loss = closure() if closure is not None else None
        for p in self._names:
            if p not in self._inflight:
                self._send(p)
        for p, (handle, result) in list(self._inflight.items()):
            handle.wait()
            with torch.no_grad():
                p.copy_(torch.from_numpy(result))
        self._inflight.clear()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._inflight:
            raise RuntimeError("zero_grad() was called after backward() but before step(): the gradients "
                               "are still on their way to the servers")
        self.optimizer.zero_grad(set_to_none=set_to_none)
