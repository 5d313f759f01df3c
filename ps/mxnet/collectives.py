"""Horovod-MXNet's collectives on ps's servers: ``allreduce`` (also in place, grouped, with an
``op`` and scale factors), ``broadcast``, ``allgather``, ``reducescatter`` and ``alltoall`` of
NDArrays.

Each is made of sums over the workers: a name is a key (``collective.tensor_key``, checked
the first time every worker uses it), the servers add the workers' arrays and send the sum
back. A broadcast is the root's array summed with everyone else's zeros; an allgather sums
every worker's rows, each placed at its own offset in zeros; Min, Max and Product are reduced
on each worker from an allgather; a reducescatter is a sum of which each worker keeps its
rows, and an alltoall an allgather of which each keeps the rows sent to it (every worker
receives every row: simple, not bandwidth-optimal). The calls block, as Horovod-MXNet's
results are ready to read when they return. CPU only. ``process_set=`` runs a call among a
process set's members (ps/collective/process_sets.py, as in ``ps.torch``).
"""
from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from ..collective import (GATHERED, Average, Job, ReduceOp, Sum, objects, ops, process_sets, reduce_op, tensor_key,
                          variant, verified)
from ..collective.process_sets import Scope, check_root, check_root_votes, root_vote
from ..errors import MismatchError

job = Job("ps.mxnet", names="hvd.")


class ProcessSet(process_sets.ProcessSet):
    """Horovod's ``hvd.ProcessSet(ranks)`` of ``ps.mxnet``."""


sets = process_sets.ProcessSets(job, ProcessSet)


class RefusedError(ValueError, RuntimeError):
    """A call Horovod refuses with an ``MXNetError`` (a RuntimeError); ps's bad input is a
    ValueError. Both catch it."""


def sums(names: list[str], arrays: list[np.ndarray], where: Scope | None = None) -> list[np.ndarray]:
    """The element-wise sum of each array over every worker (of ``where``, a process set's
    Scope; collective, same names everywhere); a name may come back with another shape (two
    trainers' parameter 0): ``tensor_key``."""
    kv = job.store()
    if kv is None:
        return arrays
    where = where or sets.scope()
    keys = [where.key(tensor_key(n, a.shape, a.dtype)) for n, a in zip(names, arrays)]
    verify = job.ensure_keys([(k, a.shape, a.dtype) for k, a in zip(keys, arrays)], where.group)
    outs = [np.empty(a.shape, a.dtype) for a in arrays]
    handles = [kv.pushpull(k, a.reshape(-1), out=o.reshape(-1), block=False) for k, a, o in zip(keys, arrays, outs)]
    verified([verify], handles, job, where.group)
    for h in handles:
        h.wait()
    return outs


def _reduce_op(op: Any, average: bool | None) -> ReduceOp:
    return reduce_op(op, average, RefusedError, "ps.mxnet")


def _named(kind: str, name: str | None) -> str:
    """Unnamed calls share one key per shape and dtype, so every worker must make them in the
    same order (Horovod numbers them in call order)."""
    return f"{job.names}{kind}.{name if name is not None else 'noname'}"


def _array(tensor: Any, what: str) -> np.ndarray:
    if not isinstance(tensor, mx.nd.NDArray):
        raise TypeError(f"{what}: expected an mx.nd.NDArray, got {type(tensor).__name__}")
    return tensor.asnumpy()


def _like(values: np.ndarray, tensor: Any) -> Any:
    return mx.nd.array(values, ctx=tensor.context, dtype=values.dtype)


def grouped_allreduce(tensors: list[Any], average: bool | None = None, name: str | None = None, priority: int = 0,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
                      op: Any = None) -> list[Any]:
    """Each tensor reduced over every worker (new NDArrays; the inputs are not changed). The
    ``i``-th tensor travels under ``name.i``."""
    where = sets.scope(process_set)
    arrays = [_array(t, f"allreduce of {name!r}") for t in tensors]
    reduce = _reduce_op(op, average)
    how = variant(reduce.name, prescale_factor, postscale_factor)
    results = _reduced(_named("allreduce", name) + how, arrays, reduce, prescale_factor, postscale_factor, where)
    return [_like(r, t) for r, t in zip(results, tensors)]


def _reduced(base: str, arrays: list[np.ndarray], reduce: ReduceOp, prescale: float, postscale: float,
             where: Scope) -> list[np.ndarray]:
    names = [f"{base}.{i}" if len(arrays) > 1 else base for i in range(len(arrays))]
    if reduce in GATHERED:      # scaled in the dtype before and after, as the sums are (Horovod's rule)
        return [ops.scaled(ops.folded(_gather(n, ops.scaled(a, prescale).reshape(1, *a.shape), where)[0], reduce)
                           .reshape(a.shape), postscale) for n, a in zip(names, arrays)]
    totals = sums(names, [ops.scaled(a, prescale) for a in arrays], where)
    factor = postscale / where.size if reduce is Average else postscale
    return [ops.scaled(t, factor) for t in totals]


def grouped_allreduce_(tensors: list[Any], average: bool | None = None, name: str | None = None, priority: int = 0,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
                       op: Any = None) -> list[Any]:
    """``grouped_allreduce`` into the tensors themselves."""
    for t, r in zip(tensors, grouped_allreduce(tensors, average, name, priority, prescale_factor, postscale_factor,
                                               process_set, op)):
        t[:] = r
    return tensors


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
              op: Any = None) -> Any:
    """The mean (``average=False`` or ``op=hvd.Sum``: sum; Min, Max, Product) of ``tensor``
    over every worker, as a new NDArray."""
    (out,) = grouped_allreduce([tensor], average, name, priority, prescale_factor, postscale_factor, process_set, op)
    return out


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
               op: Any = None) -> Any:
    """``allreduce`` into ``tensor`` itself."""
    grouped_allreduce_([tensor], average, name, priority, prescale_factor, postscale_factor, process_set, op)
    return tensor


def broadcast_values(names: list[str], values: list[np.ndarray], root_rank: int, what: str,
                     where: Scope | None = None) -> list[np.ndarray]:
    """Rank ``root_rank``'s values on every worker (of ``where``; the root is a rank of the
    job, as in Horovod): its arrays summed with everyone else's zeros, beside a two-number sum
    that shows whether every worker named the same root."""
    where = where or sets.scope()
    check_root(root_rank, where, what)
    me = job.rank()
    sends = [v if me == root_rank else np.zeros_like(v) for v in values]
    *got, votes = sums([*names, f"{job.names}broadcast.root"], [*sends, root_vote(root_rank, me)], where)
    if job.store() is not None:
        check_root_votes(votes, root_rank, me, where, what)
    return got


def broadcast(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: Any = None) -> Any:
    """Rank ``root_rank``'s ``tensor`` on every worker, as a new NDArray."""
    where = sets.scope(process_set)
    what = f"broadcast of {name!r}" if name is not None else "broadcast"
    (got,) = broadcast_values([_named("broadcast", name)], [_array(tensor, what)], root_rank, what, where)
    return _like(got, tensor)


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: Any = None) -> Any:
    """``broadcast`` into ``tensor`` itself."""
    tensor[:] = broadcast(tensor, root_rank, name, priority, process_set)
    return tensor


def allgather(tensor: Any, name: str | None = None, priority: int = 0, process_set: Any = None) -> Any:
    """Every worker's ``tensor`` concatenated on the first dimension, in rank order; the first
    dimension may differ between workers, the rest of the shape and the dtype may not."""
    where = sets.scope(process_set)
    what = f"allgather of {name!r}" if name is not None else "allgather"
    a = _array(tensor, what)
    if a.ndim == 0:
        raise ValueError(f"{what}: a scalar has no first dimension to concatenate on (reshape it to (1,))")
    return _like(_gather(_named("allgather", name), a, where, what)[0], tensor)


def _gather(base: str, a: np.ndarray, where: Scope, what: str | None = None) -> tuple[np.ndarray, list[int]]:
    """The rows of every worker (ps/collective/ops.py), and how many each gave."""
    if job.store() is None:
        return a.copy(), [a.shape[0]]
    counts = ops.sizes(_table(base, [a.shape[0]], a, where, what))
    return _rows(base, a, counts, where), counts


def _table(base: str, values: list[int], a: np.ndarray, where: Scope, what: str | None) -> np.ndarray:
    """Every worker's row of the table (``values``, then the fingerprint of the rest of ``a``'s
    shape and its dtype); MismatchError, on every worker alike, if a fingerprint differs."""
    row = ops.table_row(values, f"{a.shape[1:]}{a.dtype}")
    (table,) = sums([f"{base}.table"], [ops.table_share(row, where.rank, where.size)], where)
    if ops.differing(table, row):
        raise job.disagreed(MismatchError(f"{what or base}: the workers' tensors differ past the first dimension or "
                                          f"in dtype (rank {where.rank} has shape {a.shape} and dtype {a.dtype})"), where.group)
    return table


def _rows(base: str, a: np.ndarray, counts: list[int], where: Scope) -> np.ndarray:
    """The concatenation of every worker's rows (``counts[r]`` of them from the r-th)."""
    layout = ops.rows(counts, where.rank)
    (every,) = sums([f"{base}.rows"], [ops.placed(a, layout)], where)
    return every[:layout.total]


def grouped_allgather(tensors: list[Any], name: str | None = None, priority: int = 0,
                      process_set: Any = None) -> list[Any]:
    """``allgather`` of each tensor; the ``i``-th travels under ``name.i``."""
    base = name if name is not None else "noname.group"
    return [allgather(t, f"{base}.{i}", priority, process_set) for i, t in enumerate(tensors)]


def grouped_reducescatter(tensors: list[Any], op: Any = None, name: str | None = None, priority: int = 0,
                          process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """Each tensor summed (``op=hvd.Average``, the default: averaged) over every worker; each
    worker gets its rows of the result (the first dimension split as evenly as it goes, the
    first ranks one row more)."""
    where = sets.scope(process_set)
    reduce = _reduce_op(op, None)
    what = f"reducescatter of {name!r}" if name is not None else "reducescatter"
    if reduce not in (Average, Sum):
        raise RefusedError(f"{what}: op {reduce.name} is not supported (Average or Sum)")
    for t in tensors:
        if not isinstance(t, mx.nd.NDArray) or t.ndim == 0:
            raise RefusedError(f"{what}: a scalar cannot be scattered: every tensor needs a first dimension")
    summed = _reduced(_named("reducescatter", name), [t.asnumpy() for t in tensors], reduce, prescale_factor,
                      postscale_factor, where)
    n, r = where.size, where.rank
    parts = []
    for total, t in zip(summed, tensors):
        start, count = ops.share(total.shape[0], n, r)
        parts.append(_like(total[start:start + count], t))
    return parts


def reducescatter(tensor: Any, op: Any = None, name: str | None = None, priority: int = 0, process_set: Any = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """``tensor`` summed (averaged) over every worker, of which this worker gets its rows."""
    (out,) = grouped_reducescatter([tensor], op, name, priority, process_set, prescale_factor, postscale_factor)
    return out


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, priority: int = 0,
             process_set: Any = None) -> Any:
    """Rows ``splits[k]`` of ``tensor`` (in order) go to worker ``k``; returns what every
    worker sent here, in rank order, and, if ``splits`` was given, how many rows came from
    each. Without ``splits`` the first dimension is split evenly."""
    where = sets.scope(process_set)
    what = f"alltoall of {name!r}" if name is not None else "alltoall"
    a = _array(tensor, what)
    n, me = where.size, where.rank
    if a.ndim == 0:
        raise RefusedError(f"{what}: a scalar cannot be split: the tensor needs a first dimension")
    if splits is None:
        if a.shape[0] % n:
            raise RefusedError(f"{what}: the first dimension ({a.shape[0]}) does not split evenly over {n} workers "
                               "(give splits=)")
        sizes = np.full(n, a.shape[0] // n, np.int64)
    else:
        raw = splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else np.asarray(splits)
        if raw.dtype.kind not in "iu":
            raise RefusedError(f"{what}: splits must be integers (int32), got {raw.dtype}")
        sizes = raw.astype(np.int64).reshape(-1)
        if sizes.size != n or (sizes < 0).any() or sizes.sum() != a.shape[0]:
            raise RefusedError(f"{what}: splits {sizes.tolist()} must be {n} counts >= 0 that add up to the first "
                               f"dimension ({a.shape[0]})")
    base = _named("alltoall", name)
    table = _table(base, sizes.tolist(), a, where, what)     # row s: what member s sends to each member
    every = _rows(base, a, ops.sizes(table), where)
    parts = ops.received(table, me)
    out = _like(np.concatenate([every[start:start + count] for start, count in parts]), tensor)
    if splits is None:
        return out
    return out, mx.nd.array([count for _, count in parts], dtype="int32")


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Rank ``root_rank``'s ``obj`` on every worker: any object in a job with a signing key,
    plain data without one (ps/collective/objects.py)."""
    where = sets.scope(process_set)
    kv = job.store()
    if kv is None:
        return obj
    what = "broadcast_object"
    data = np.frombuffer(objects.dumps(obj, kv, what), np.uint8) if job.rank() == root_rank else np.zeros(0, np.uint8)
    tag = _named("broadcast_object", name)
    (n,) = broadcast_values([f"{tag}.len"], [np.array([data.size], np.int64)], root_rank, what, where)
    buf = data if data.size else np.zeros(int(n[0]), np.uint8)
    (got,) = broadcast_values([f"{tag}.data"], [buf], root_rank, what, where)
    return obj if job.rank() == root_rank else objects.loads(got.tobytes(), kv, what)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every worker's ``obj``, in rank order (ps/collective/objects.py says what may travel)."""
    where = sets.scope(process_set)
    kv = job.store()
    if kv is None:
        return [obj]
    what = "allgather_object"
    data = np.frombuffer(objects.dumps(obj, kv, what), np.uint8)
    raw, sizes = _gather(_named("allgather_object", name), data, where, what)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [objects.loads(raw[starts[r]:starts[r + 1]].tobytes(), kv, what) for r in range(len(sizes))]
