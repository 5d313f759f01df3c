"""Horovod's MXNet calls on ps: ``import ps.mxnet as hvd`` runs the Horovod-MXNet template
(``hvd.DistributedOptimizer`` around an ``mx.optimizer``, ``gluon.Trainer(..., kvstore=None)``).

The workers' gradients are averaged through the servers (one key per parameter index, summed
in sync rounds, no optimizer there) before the wrapped optimizer updates the local weights,
so N workers make one process's update on the N batches together. Uses its own numpy
``ps.KVStore``: do not also create an MXNet ``dist_*`` kvstore in the same process.
"""
from __future__ import annotations

import os
from typing import Any

import mxnet as mx
import numpy as np

from .. import selfstart
from ..kvstore import KVStore

_state: dict[str, Any] = {"kv": None, "alone": False, "keys": set()}


def init() -> None:
    """Join the job named by the ``DMLC_*`` variables; alone (size 1) without them."""
    if _state["kv"] is not None or _state["alone"]:
        return
    selfstart.start()           # under mpirun/srun without ps.launch: make the rendezvous here
    if "DMLC_PS_ROOT_URI" not in os.environ:
        _state["alone"] = True
        return
    _state["kv"] = KVStore("dist_sync")


def _kv() -> KVStore | None:
    if _state["kv"] is None and not _state["alone"]:
        raise ValueError("ps.mxnet.init() has not been called")
    return _state["kv"]


def rank() -> int:
    kv = _kv()
    return 0 if kv is None else kv.rank


def size() -> int:
    kv = _kv()
    return 1 if kv is None else kv.num_workers


def _local() -> list[int]:
    kv = _kv()
    return [0] if kv is None else kv.local_workers


def local_rank() -> int:
    return _local().index(rank())


def local_size() -> int:
    return len(_local())


def _sum(names: list[str], arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The element-wise sum of each array over every worker (collective, same names everywhere)."""
    kv = _kv()
    if kv is None:
        return arrays
    new = [(n, a) for n, a in zip(names, arrays) if n not in _state["keys"]]
    if new:
        kv.init([n for n, _ in new], [np.zeros_like(a) for _, a in new])
        _state["keys"].update(n for n, _ in new)
    outs = [np.empty_like(a) for a in arrays]
    handles = [kv.pushpull(n, a, out=o, block=False) for n, a, o in zip(names, arrays, outs)]
    for h in handles:
        h.wait()
    return outs


def allreduce(tensor: mx.nd.NDArray, average: bool = True, name: str | None = None) -> mx.nd.NDArray:
    """The mean (``average=False``: sum) of ``tensor`` over every worker, as a new NDArray.
    ``name`` is required in a job (it is the key every worker must use)."""
    if name is None and _kv() is not None:
        raise ValueError("ps.mxnet.allreduce needs a name= (the key every worker uses for this tensor)")
    (total,) = _sum([f"hvd.allreduce.{name}"], [tensor.asnumpy()])
    if average:
        total = total / size()
    return mx.nd.array(total, ctx=tensor.context, dtype=tensor.dtype)


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite ``params`` (a Gluon ``ParameterDict``, or a dict of NDArrays such as
    ``Module.get_params()[0]``) with rank ``root_rank``'s values, in place."""
    if _kv() is None:
        return
    if not isinstance(root_rank, int) or not 0 <= root_rank < size():
        raise ValueError(f"root_rank {root_rank!r} is out of range for a job of {size()} workers")
    items = sorted(params.items())
    values = []
    for name, p in items:
        if isinstance(p, mx.gluon.Parameter):
            try:
                values.append(p.data().asnumpy())
            except mx.gluon.parameter.DeferredInitializationError:
                raise ValueError(f"parameter {name!r} is not initialized yet (deferred): run one forward pass "
                                 "or give the layer its input size before broadcast_parameters") from None
        else:
            values.append(p.asnumpy())
    sends = [v if rank() == root_rank else np.zeros_like(v) for v in values]
    for (name, p), got in zip(items, _sum([f"hvd.broadcast.{n}" for n, _ in items], sends)):
        if isinstance(p, mx.gluon.Parameter):
            p.set_data(mx.nd.array(got, dtype=got.dtype))
        else:
            p[:] = got


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Averages each gradient over the workers, then lets ``optimizer`` update the weight.
    Every other attribute (lr, rescale_grad, which ``Trainer.step`` sets, states) is the
    wrapped optimizer's."""

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0):
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps an mx.optimizer.Optimizer, got {type(optimizer).__name__}")
        if gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor is not supported by ps.mxnet")
        object.__setattr__(self, "_optimizer", optimizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_optimizer"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._optimizer, name, value)

    def create_state(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def _average(self, index: Any, grad: Any) -> None:
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(grad, (list, tuple)) else [grad]
        sums = _sum([f"hvd.grad.{i}" for i in indices], [g.asnumpy() for g in grads])
        n = size()
        for g, total in zip(grads, sums):
            g[:] = total / n if n > 1 else total

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._average(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._average(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)
