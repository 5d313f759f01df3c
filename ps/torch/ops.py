"""Horovod's allreduce and broadcast, each one of ``sums``' sums (ps/torch/sums.py).

Broadcast is the sum with zeros from every rank but the root, so it costs one round trip;
a two-number sum beside it (how many workers called themselves the root, and the roots
they named) tells every worker alike when they disagree on ``root_rank``. Min, Max and
Product, which a sum cannot give, reduce an allgather (ps/torch/gather.py).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import torch

from ..collective import (GATHERED, Adasum, Average, Max, Min, Product, ReduceOp, Sum, objects, tensor_key,
                          variant, verified)
from ..collective.process_sets import check_root, check_root_votes, root_vote
from ..errors import MismatchError
from . import runtime
from .compression import Compression
from .gather import reduce_gathered
from .optimizer import local_step
from .process_sets import Scope, scope
from .sums import (Group, Handle, as_array, claim, differentiable, ensure_keys, hold, member, reduce_op,
                   sum_async)

# unnamed broadcast_object calls, in the common order of the workers of each process set
_objects: dict[int, itertools.count] = {}


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None, *, compression: Any = Compression.none,
                    _target: torch.Tensor | None = None) -> Any:
    """Start summing (averaging, ...) ``tensor`` over every worker (of ``process_set``);
    ``synchronize`` the handle."""
    where = scope(process_set)
    reduce = reduce_op(op, average)
    claim("allreduce", name)
    if reduce in GATHERED:
        return hold("allreduce", name, reduce_gathered(tensor, reduce, name, prescale_factor, postscale_factor,
                                                       _target, where))
    return hold("allreduce", name, sum_async(tensor, name, reduce, prescale_factor, postscale_factor, compression,
                                             _target, where=where, joinable=True,
                                             variant=variant(reduce.name, prescale_factor, postscale_factor)))


class _Allreduce(torch.autograd.Function):
    """Horovod's allreduce is differentiable: the gradient is the same allreduce of the
    output's gradient (every worker runs backward, as every worker ran forward)."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale, postscale, compression, process_set):    # noqa: ANN001
        ctx.args = (average, op, prescale, postscale, process_set)
        return allreduce_async(tensor, average, name, op, prescale, postscale, process_set,
                               compression=compression).wait()

    @staticmethod
    def backward(ctx, grad):    # noqa: ANN001
        average, op, prescale, postscale, process_set = ctx.args
        return (allreduce_async(grad, average, None, op, prescale, postscale, process_set).wait(),
                None, None, None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    """The mean (default), sum, min, max or product of ``tensor`` over every worker, as a new
    tensor; differentiable, as Horovod's."""
    if differentiable(tensor):
        scope(process_set)
        return _Allreduce.apply(tensor, average, name, op, prescale_factor, postscale_factor, compression,
                                process_set)
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
    claim("grouped_allreduce", name)
    return hold("grouped_allreduce", name, Group([
        allreduce_async(t, average, member(name, i), op, prescale_factor, postscale_factor, process_set,
                        compression=compression, _target=t if _inplace else None)
        for i, t in enumerate(tensors)]))


class _GroupedAllreduce(torch.autograd.Function):
    """The gradient of each member is the same grouped allreduce of the outputs' gradients."""

    @staticmethod
    def forward(ctx, average, name, op, prescale, postscale, compression, process_set, *tensors):    # noqa: ANN001
        ctx.args = (average, op, prescale, postscale, process_set)
        return tuple(grouped_allreduce_async(list(tensors), average, name, op, prescale, postscale, process_set,
                                             compression=compression).wait())

    @staticmethod
    def backward(ctx, *grads):    # noqa: ANN001
        average, op, prescale, postscale, process_set = ctx.args
        return (None,) * 7 + tuple(grouped_allreduce_async(list(grads), average, None, op, prescale,
                                                           postscale, process_set).wait())


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list[torch.Tensor]:
    """Every tensor of the list allreduced, all in flight together; differentiable."""
    if any(differentiable(t) for t in tensors):
        scope(process_set)
        return list(_GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, compression,
                                            process_set, *tensors))
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


def synchronize(handle: Any) -> Any:
    return handle.wait()


def poll(handle: Any) -> bool:
    return handle.done()


# -- broadcast -------------------------------------------------------------------------
def _same_root(root_rank: int, name: str | None, what: str, where: Scope) -> tuple[Callable[[], None], ...]:
    """Start the sum that shows whether every worker named ``root_rank``; the returned check
    (run when it is in) raises MismatchError on every worker alike if not."""
    if runtime.store() is None:
        return ()
    me = runtime.rank()
    handle = sum_async(torch.from_numpy(root_vote(root_rank, me)),
                       f"broadcast.root.{name}" if name is not None else "broadcast.root", Sum, where=where)
    return (lambda: check_root_votes(handle.wait().tolist(), root_rank, me, where, what),)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None,
                    _target: torch.Tensor | None = None) -> Handle:
    where = scope(process_set)
    check_root(root_rank, where, f"broadcast of {name!r}" if name else "broadcast")
    claim("broadcast", name)
    send = tensor.detach() if runtime.rank() == root_rank else torch.zeros_like(tensor)
    key = f"broadcast.{name}" if name is not None else None
    handle = sum_async(send, key, Sum, target=_target, where=where,
                       checks=_same_root(root_rank, name, f"broadcast of {name!r}" if name else "broadcast", where))
    return hold("broadcast", name, handle)


class _Broadcast(torch.autograd.Function):
    """Horovod's gradient: the average of the output's gradient, on the root only."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):    # noqa: ANN001
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):    # noqa: ANN001
        reduced = allreduce_async(grad, True, process_set=ctx.process_set).wait()
        if runtime.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor`` on every worker (of ``process_set``; a new tensor);
    differentiable."""
    if differentiable(tensor):
        scope(process_set)
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> Handle:
    """``broadcast_async`` into ``tensor`` itself (at ``synchronize``)."""
    return broadcast_async(tensor, root_rank, name, process_set, _target=tensor)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    with torch.no_grad():
        return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast_parameters(params: Any, root_rank: int = 0, process_set: Any = None) -> None:
    """Overwrite every tensor in ``params`` (a state_dict, or (name, tensor) pairs such as
    ``model.named_parameters()``) with rank ``root_rank``'s, in place; one round trip."""
    where = scope(process_set)
    items = list(params.items()) if hasattr(params, "items") else list(params)
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
            raise ValueError(f"broadcast_parameters takes a state_dict or (name, tensor) pairs, got {entry!r:.80}")
    kv = runtime.store()
    if kv is None:
        return
    check_root(root_rank, where, "broadcast_parameters")
    flats = []
    for name, t in items:
        if isinstance(t, torch.Tensor):
            flat = as_array(t, f"broadcast of {name!r}")
            flats.append((where.key(tensor_key(f"broadcast.{name}", tuple(t.shape), flat.dtype)), t, flat))
    verify = ensure_keys([(key, tuple(t.shape), flat.dtype) for key, t, flat in flats], where)
    pending = []
    for key, t, flat in flats:
        send = flat if kv.rank == root_rank else np.zeros_like(flat)
        result = np.empty_like(flat)
        pending.append((t, result, kv.pushpull(key, send, out=result, block=False)))
    checks = _same_root(root_rank, "parameters", "broadcast_parameters", where)
    verified((verify, *checks), [handle for _, _, handle in pending], runtime.job, where.group)
    for t, result, handle in pending:
        handle.wait()
    for t, result, _ in pending:
        with torch.no_grad():
            t.copy_(torch.from_numpy(result).view(t.shape).to(t.dtype))


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Rank ``root_rank``'s ``obj`` on every worker: any object in a job with a signing key,
    plain data without one (ps/collective/objects.py)."""
    where = scope(process_set)
    kv = runtime.store()
    if kv is None:
        return obj
    check_root(root_rank, where, "broadcast_object")
    data = objects.dumps(obj, kv, "broadcast_object") if kv.rank == root_rank else b""
    tag = name or f"object.{next(_objects.setdefault(where.group, itertools.count()))}"
    n = int(broadcast(torch.tensor([len(data)], dtype=torch.int64), root_rank, f"{tag}.len", process_set).item())
    buf = torch.zeros(n, dtype=torch.uint8)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    got = broadcast(buf, root_rank, f"{tag}.data", process_set)
    return obj if kv.rank == root_rank else objects.loads(got.numpy().tobytes(), kv, "broadcast_object")


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, model: Any = None) -> None:
    """Rank ``root_rank``'s optimizer state (momentum buffers, Adam moments and step counts)
    and hyper-parameters on every worker, in place. A worker whose optimizer has no state
    yet (a fresh one, where the root loaded a checkpoint) makes it first with a step on zero
    gradients, as Horovod does, but keeps its parameters as they were."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state (as in Horovod)")
    if runtime.store() is None:
        return
    _fresh_grads(optimizer, model)
    layout = _layout(optimizer)
    theirs = broadcast_object(layout, root_rank)
    if theirs != layout and not optimizer.state:
        _make_state(optimizer)
        layout = _layout(optimizer)
    if theirs != layout:
        raise runtime.job.disagreed(MismatchError(
            f"rank {runtime.rank()}'s optimizer state differs in layout from rank {root_rank}'s (different "
            "optimizers, or parameters that only some workers have trained?)"))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    states = [(i, optimizer.state[p]) for i, p in enumerate(params) if p in optimizer.state]
    broadcast_parameters([(f"optstate.{i}.{k}", v) for i, st in states for k, v in sorted(st.items())
                          if isinstance(v, torch.Tensor)], root_rank)
    scalars = {f"{i}.{k}": v for i, st in states for k, v in st.items() if not isinstance(v, torch.Tensor)}
    got = broadcast_object(scalars, root_rank)
    for i, st in states:
        for k in list(st):
            if f"{i}.{k}" in got:
                st[k] = got[f"{i}.{k}"]
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for group, options in zip(optimizer.param_groups, broadcast_object(hyper, root_rank)):
        group.update(options)


def _layout(optimizer: torch.optim.Optimizer) -> list:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [[i, sorted((k, tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__)
                       for k, v in optimizer.state[p].items())]
            for i, p in enumerate(params) if p in optimizer.state]


def _fresh_grads(optimizer: torch.optim.Optimizer, model: Any) -> None:
    """Zero gradients where there are none, as Horovod leaves them (its state-making step
    needs them; a script may read them after the broadcast)."""
    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse:
                    p.grad = p.grad.to_sparse()


def _make_state(optimizer: torch.optim.Optimizer) -> None:
    """One step of the optimizer's own class (not the distributed one, which every worker
    would have to join) on zero gradients; the parameters keep their values."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    kept = [p.detach().clone() for p in params]
    local_step(optimizer)
    with torch.no_grad():
        for p, value in zip(params, kept):
            p.copy_(value)


__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "ReduceOp", "allreduce", "allreduce_",
           "allreduce_async", "allreduce_async_", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
           "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "poll", "synchronize"]
