"""The one thing ps's servers do for ``ps.torch``: sum a named tensor over every worker.

A name is a key. Its first use is a collective ``init`` (every worker, same order, as every
Horovod collective), after which each call is one pushpull: the servers sum the workers'
tensors and send the sum back (no optimizer runs there). Every collective of ``ops`` and
``gather`` is made of these sums.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from . import runtime
from .compression import Compression


class ReduceOp(NamedTuple):
    name: str


Average = ReduceOp("Average")
Sum = ReduceOp("Sum")
Adasum = ReduceOp("Adasum")
Min = ReduceOp("Min")
Max = ReduceOp("Max")
Product = ReduceOp("Product")
_OPS = {op.name.lower(): op for op in (Average, Sum, Min, Max, Product)}
GATHERED = (Min, Max, Product)        # reduced on the workers, from an allgather
_WIRE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.int8}



def reduce_op(op: Any, average: bool | None = None) -> ReduceOp:
    if op is None:
        return Sum if average is False else Average
    name = op.name if isinstance(op, ReduceOp) else op
    found = _OPS.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"op {name if isinstance(name, str) else op!r} is not supported: ps.torch reduces with "
                         "Average, Sum, Min, Max or Product (no Adasum: the servers sum)")
    return found


def as_array(tensor: torch.Tensor, what: str) -> np.ndarray:
    """The tensor's memory as a numpy array (a view where it can be), or a clear error."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: tensor on device {tensor.device} is not supported: ps.torch moves CPU "
                         "tensors (copy it with .cpu() first)")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported")
    if tensor.dtype == torch.bool:
        tensor = tensor.to(torch.uint8)
    if tensor.dtype not in _WIRE_DTYPES:
        raise TypeError(f"{what}: dtype {tensor.dtype} is not supported (float16/32/64, int8/32/64, uint8, bool)")
    return tensor.detach().contiguous().numpy().reshape(-1)


def ensure_keys(items: list[tuple[str, tuple[int, ...], np.dtype]]) -> None:
    """Initialize the keys not seen yet, after checking every worker asks for the same ones
    (ps/collective.py)."""
    runtime.store()
    if runtime.server_optimizer:
        raise RuntimeError("a ServerOptimizer runs on the servers of this job, and they update every key they "
                           "hold: allreduce and broadcast of new tensors are not available after it is created")
    runtime.job.ensure_keys(items)


class Handle:
    """What ``allreduce_async`` returns; ``synchronize(handle)`` gives the result."""

    def __init__(self, pending: Any, out: torch.Tensor, result: np.ndarray, divide: int,
                 target: torch.Tensor | None, scale: float = 1.0):
        self._pending, self._out, self._result, self._divide, self._target = pending, out, result, divide, target
        self._scale = scale

    def done(self) -> bool:
        return self._pending is None or self._pending.done

    def wait(self) -> torch.Tensor:
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            res = torch.from_numpy(self._result).view(self._out.shape)
            if self._divide > 1:          # true division: an integer tensor's mean, then cast back
                res = torch.true_divide(res, self._divide)
            if self._scale != 1.0:
                res = res * self._scale
            self._out.copy_(res)
            if self._target is not None:
                self._target.copy_(self._out)
        return self._out


def sum_async(tensor: torch.Tensor, name: str | None, reduce: ReduceOp, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, compression: Any = Compression.none,
              target: torch.Tensor | None = None) -> Handle:
    """Start summing (``Average``: averaging) ``tensor`` over every worker: one pushpull."""
    if prescale_factor != 1.0:
        tensor = tensor * prescale_factor
    sent = compression.compress(tensor) if isinstance(tensor, torch.Tensor) else tensor
    flat = as_array(sent, f"allreduce of {name!r}" if name else "allreduce")
    # unnamed: one key per shape and dtype, reused call after call (a new key per call would
    # cost a collective init each time and grow the servers), in the callers' common order
    name = f"allreduce.{name}" if name is not None else f"allreduce.noname.{tuple(tensor.shape)}.{flat.dtype}"
    out = torch.empty_like(tensor)
    kv = runtime.store()
    if kv is None:
        out.copy_(tensor * postscale_factor if postscale_factor != 1.0 else tensor)
        if target is not None:
            target.copy_(out)
        return Handle(None, out, flat, 1, None)
    ensure_keys([(name, tuple(tensor.shape), flat.dtype)])
    result = np.empty_like(flat)
    pending = kv.pushpull(name, flat, out=result, block=False)
    return Handle(pending, out, result, kv.num_workers if reduce is Average else 1, target, postscale_factor)


def differentiable(tensor: Any) -> bool:
    """Whether a collective on ``tensor`` must go through its autograd function (Horovod's
    collectives are differentiable)."""
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


def member(name: str | None, i: int, tensor: torch.Tensor) -> str:
    """The name of a group's ``i``-th tensor: each is a key of its own, named after the group,
    else after its place and shape (the unnamed rule of one key per shape would put two of
    them in one key)."""
    return f"{name}.{i}" if name is not None else f"noname.group.{i}.{tuple(tensor.shape)}"


class Group:
    """The handle of a grouped call: ``synchronize`` gives the list of results."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self) -> list[torch.Tensor]:
        return [h.wait() for h in self._handles]
