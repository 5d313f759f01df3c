"""Horovod's allreduce and broadcast, each one of ``sums``' sums (ps/torch/sums.py).

Broadcast is the sum with zeros from every rank but the root, so it costs one round trip and
needs no other message. Min, Max and Product, which a sum cannot give, reduce an allgather
(ps/torch/gather.py).
"""
from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import torch

from . import runtime
from .compression import Compression
from .gather import reduce_gathered
from .process_sets import check as check_process_set
from .sums import (GATHERED, Adasum, Average, Group, Handle, Max, Min, Product, ReduceOp, Sum, as_array,
                   differentiable, ensure_keys, member, reduce_op, sum_async)

_objects = itertools.count()        # unnamed broadcast_object calls, in the workers' common order


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None, *, compression: Any = Compression.none,
                    _target: torch.Tensor | None = None) -> Any:
    """Start summing (averaging, ...) ``tensor`` over every worker; ``synchronize`` the handle."""
    check_process_set(process_set)
    reduce = reduce_op(op, average)
    if reduce in GATHERED:
        return reduce_gathered(tensor, reduce, name, prescale_factor, postscale_factor, _target)
    return sum_async(tensor, name, reduce, prescale_factor, postscale_factor, compression, _target)


class _Allreduce(torch.autograd.Function):
    """Horovod's allreduce is differentiable: the gradient is the same allreduce of the
    output's gradient (every worker runs backward, as every worker ran forward)."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale, postscale, compression):    # noqa: ANN001
        ctx.args = (average, op, prescale, postscale)
        return allreduce_async(tensor, average, name, op, prescale, postscale, compression=compression).wait()

    @staticmethod
    def backward(ctx, grad):    # noqa: ANN001
        average, op, prescale, postscale = ctx.args
        return (allreduce_async(grad, average, None, op, prescale, postscale).wait(),
                None, None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    """The mean (default), sum, min, max or product of ``tensor`` over every worker, as a new
    tensor; differentiable, as Horovod's."""
    if differentiable(tensor):
        check_process_set(process_set)
        return _Allreduce.apply(tensor, average, name, op, prescale_factor, postscale_factor, compression)
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set,
                           compression=compression).wait()


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> Any:
    """``allreduce_async`` whose result is written back into ``tensor`` by ``synchronize``."""
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set, _target=tensor)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set).wait()


def grouped_allreduce_async(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None, *, compression: Any = Compression.none,
                            _inplace: bool = False) -> Group:
    return Group([allreduce_async(t, average, member(name, i, t), op, prescale_factor, postscale_factor, process_set,
                                  compression=compression, _target=t if _inplace else None)
                  for i, t in enumerate(tensors)])


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list[torch.Tensor]:
    """Every tensor of the list allreduced, all in flight together."""
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                                   compression=compression).wait()


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> Group:
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                                   _inplace=True)


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None) -> list[torch.Tensor]:
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set).wait()


def synchronize(handle: Handle) -> torch.Tensor:
    return handle.wait()


def poll(handle: Handle) -> bool:
    return handle.done()


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None,
                    _target: torch.Tensor | None = None) -> Handle:
    check_process_set(process_set)
    _check_root(root_rank)
    send = tensor.detach() if runtime.rank() == root_rank else torch.zeros_like(tensor)
    key = f"broadcast.{name}" if name is not None else None
    return allreduce_async(send, name=key, op=Sum, _target=_target)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor`` on every worker (a new tensor)."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> Handle:
    """``broadcast_async`` into ``tensor`` itself (at ``synchronize``)."""
    return broadcast_async(tensor, root_rank, name, process_set, _target=tensor)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    with torch.no_grad():
        return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite every tensor in ``params`` (a state_dict, or (name, tensor) pairs such as
    ``model.named_parameters()``) with rank ``root_rank``'s, in place; one round trip."""
    items = list(params.items()) if hasattr(params, "items") else list(params)
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
            raise ValueError(f"broadcast_parameters takes a state_dict or (name, tensor) pairs, got {entry!r:.80}")
    kv = runtime.store()
    if kv is None:
        return
    _check_root(root_rank)
    flats = [(f"broadcast.{name}", t, as_array(t, f"broadcast of {name!r}"))
             for name, t in items if isinstance(t, torch.Tensor)]
    ensure_keys([(key, tuple(t.shape), flat.dtype) for key, t, flat in flats])
    pending = []
    for key, t, flat in flats:
        send = flat if kv.rank == root_rank else np.zeros_like(flat)
        result = np.empty_like(flat)
        pending.append((t, result, kv.pushpull(key, send, out=result, block=False)))
    for t, result, handle in pending:
        handle.wait()
        with torch.no_grad():
            t.copy_(torch.from_numpy(result).view(t.shape).to(t.dtype))


def _check_root(root_rank: int) -> None:
    size = runtime.size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < size:
        raise ValueError(f"root_rank {root_rank!r} is out of range for a job of {size} workers")


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Rank ``root_rank``'s JSON-serializable ``obj`` on every worker. Unlike Horovod's, not a
    pickle: what comes back from the servers is never unpickled (docs/security.md)."""
    if runtime.store() is None:
        return obj
    _check_root(root_rank)
    data = json.dumps(obj).encode() if runtime.rank() == root_rank else b""
    tag = name or f"object.{next(_objects)}"
    n = int(broadcast(torch.tensor([len(data)], dtype=torch.int64), root_rank, name=f"{tag}.len").item())
    buf = torch.zeros(n, dtype=torch.uint8)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    got = broadcast(buf, root_rank, name=f"{tag}.data.{n}")
    return json.loads(got.numpy().tobytes().decode())


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Rank ``root_rank``'s optimizer state (momentum buffers, Adam moments and step counts)
    and hyper-parameters on every worker, in place. Every worker must hold the same layout
    of state: a fresh optimizer everywhere is fine (then only hyper-parameters move)."""
    if runtime.store() is None:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    states = [(i, optimizer.state[p]) for i, p in enumerate(params) if p in optimizer.state]
    layout = [[i, sorted([k, list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__]
                         for k, v in st.items())] for i, st in states]
    if broadcast_object(layout, root_rank) != json.loads(json.dumps(layout)):
        raise ValueError(f"rank {runtime.rank()}'s optimizer state differs in layout from rank {root_rank}'s "
                         "(did only some workers load a checkpoint or take a step?)")
    broadcast_parameters([(f"optstate.{i}.{k}", v) for i, st in states for k, v in sorted(st.items())
                          if isinstance(v, torch.Tensor)], root_rank)
    scalars = {f"{i}.{k}": v for i, st in states for k, v in st.items() if not isinstance(v, torch.Tensor)}
    got = broadcast_object(scalars, root_rank)
    for i, st in states:
        for k in list(st):
            if f"{i}.{k}" in got:
                st[k] = got[f"{i}.{k}"]
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for group, theirs in zip(optimizer.param_groups, broadcast_object(hyper, root_rank)):
        for k, v in theirs.items():
            group[k] = tuple(v) if isinstance(group.get(k), tuple) else v


__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "ReduceOp", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
           "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "poll", "synchronize"]
