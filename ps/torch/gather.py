"""allgather, alltoall and reducescatter, and the reductions a sum cannot give (Min, Max,
Product), all made of the servers' sums, as ps/collective/ops.py lays them out (the table of
sizes and its fingerprints, the buffer of rows, the splits, the shares, the folds).

What is ``ps.torch``'s own is the tensors (any dtype torch has, bfloat16 and bool too),
autograd, and the sequencing: ``allgather_async`` returns at once, its rows leaving from the
I/O thread the moment the sizes are in (``_Gathering``).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import torch

from ..collective import Average, Sum, objects, ops, variant
from ..errors import CollectiveError, MismatchError
from . import runtime
from .compression import Compression
from .sums import Group, UnsupportedError, claim, differentiable, hold, member, reduce_op, scaled, sum_async
from .process_sets import Scope, scope


START_WAIT = 60.0       # s: an allgather's rows start on the I/O thread the moment its sizes are in


class Deferred:
    """A handle whose result is ``finish(inner result)``; ``synchronize`` gives it."""

    def __init__(self, inner: Any, finish: Callable[[Any], Any]) -> None:
        self._inner, self._finish, self._value, self._ready = inner, finish, None, False

    def done(self) -> bool:
        return self._ready or self._inner is None or self._inner.done()

    @property
    def waited(self) -> bool:
        return self._ready

    def wait(self) -> Any:
        if not self._ready:
            self._value = self._finish(None if self._inner is None else self._inner.wait())
            self._ready = True
        return self._value

    def abandon(self, exc: Exception) -> None:
        """As ``sums.Handle.abandon``, for the sum this result is made from."""
        if self._inner is not None:
            self._inner.abandon(exc)


def _tag(kind: str, name: str | None) -> str:
    return f"{kind}.{name}" if name is not None else f"{kind}.noname"


def _what(kind: str, name: str | None) -> str:
    """How an error names the call."""
    return f"{kind} of {name!r}" if name is not None else kind


def _form(tensor: torch.Tensor) -> str:
    """What every member's tensor must share: the shape past the first dimension, the dtype."""
    return f"{tuple(tensor.shape[1:])}{tensor.dtype}"


def _table_sum(tag: str, row: list[float], where: Scope) -> Any:
    """Start summing every member's ``row`` into one (size, len(row)) table, in rank order."""
    return sum_async(torch.from_numpy(ops.table_share(row, where.rank, where.size)), f"{tag}.table", Sum,
                     where=where)


def _table(tag: str, row: list[float], what: str, tensor: torch.Tensor, where: Scope) -> np.ndarray:
    """Every member's ``row`` (its last entry the fingerprint of ``tensor``'s shape past the
    first dimension and dtype), as one (size, len(row)) array, in rank order."""
    return _checked(_table_sum(tag, row, where).wait().numpy(), row, what, tensor, where)


def _checked(table: np.ndarray, row: list[float], what: str, tensor: torch.Tensor, where: Scope) -> np.ndarray:
    """``table``, once every member's fingerprint (its last column) matches ours."""
    differ = [where.ranks[r] for r in ops.differing(table, row)]
    if differ:
        raise runtime.job.disagreed(MismatchError(
            f"{what}: rank {runtime.rank()} has a tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype}, but "
            f"rank {differ[0]} has another shape past the first dimension or another dtype (only the first dimension "
            "may differ between workers)"), where.group)
    return table


def _need_dims(tensor: Any, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() == 0:
        raise ValueError(f"{what}: a 0-d tensor has no first dimension to concatenate or split on")


def _gather_rows(tensor: torch.Tensor, tag: str, sizes: list[int], where: Scope) -> Deferred:
    """The concatenation of every member's ``tensor`` (the r-th member's has ``sizes[r]`` rows)."""
    layout = ops.rows(sizes, where.rank)
    buf = torch.zeros((layout.buffer, *tensor.shape[1:]), dtype=tensor.dtype)
    buf[layout.start:layout.start + layout.count] = tensor.detach()
    return Deferred(sum_async(buf, f"{tag}.rows", Sum, where=where), lambda out: out[:layout.total])


class _Gathering:
    """An allgather in flight: first the sum of every member's first dimension, then, started
    on the I/O thread the moment those sizes are in, the sum of the rows. So ``allgather_async``
    returns at once, as Horovod's, and no rank waits for another to synchronize before its
    rows leave. ``wait`` runs the checks on the caller's thread; ``sizes`` is set by then.
    In a process set the rows start here, after the sizes: a set's new key is a meeting."""

    def __init__(self, tensor: torch.Tensor, tag: str, what: str, where: Scope) -> None:
        # as it is now: outside a set the rows leave later, from the I/O thread
        self._tensor = tensor.detach() if where.group else tensor.detach().clone()
        self._tag, self._what, self._where = tag, what, where
        self._row = ops.table_row([tensor.shape[0]], _form(tensor))
        self._rows: Deferred | None = None
        self._error: BaseException | None = None
        self._started = threading.Event()
        self.sizes: list[int] = []
        self._table = _table_sum(tag, self._row, where)
        if where.group:     # a process set's new key is a meeting of its members: not on the I/O thread
            self._start_rows(self._table.wait().numpy())
            return
        kv = runtime.store()        # the rows start as a task of their own, not inside reply handling
        self._table.when_summed(lambda table: kv.call_soon(lambda: self._start_rows(table)))

    def _start_rows(self, table: np.ndarray | None) -> None:
        if table is None:           # the sizes' sum failed: wait() raises its error
            self._started.set()
            return
        try:
            rows = table.reshape(self._where.size, -1)
            if ops.differing(rows, self._row):          # shapes differ: wait() names it, no rows leave
                return
            self.sizes = ops.sizes(rows)
            self._rows = _gather_rows(self._tensor, self._tag, self.sizes, self._where)
        except BaseException as exc:    # noqa: BLE001 - raised again by wait, on the caller's thread
            self._error = exc
        finally:
            self._started.set()

    def done(self) -> bool:
        return self._started.is_set() and (self._rows is None or self._rows.done())

    def abandon(self, exc: Exception) -> None:
        """As ``sums.Handle.abandon``: the sizes' sum, and the rows' if they started (rows
        that start later find the sizes' sum failed and send nothing)."""
        self._table.abandon(exc)
        if self._rows is not None:
            self._rows.abandon(exc)

    def wait(self) -> torch.Tensor:
        _checked(self._table.wait().numpy(), self._row, self._what, self._tensor, self._where)
        if not self._started.wait(START_WAIT):
            raise CollectiveError(f"{self._what}: the rows were not started within {START_WAIT:g}s of the sizes "
                                  "arriving (this worker's I/O thread is stuck)")
        if self._error is not None:
            raise self._error
        return self._rows.wait()

    @property
    def waited(self) -> bool:
        return self._rows is not None and self._rows.waited


def _gather(tensor: torch.Tensor, name: str | None, where: Scope, kind: str = "allgather") -> Any:
    """Start gathering ``tensor`` from every member; ``wait()`` gives the concatenation, and
    ``sizes`` then holds every member's first dimension."""
    what = _what(kind, name)
    _need_dims(tensor, what)
    if runtime.store() is None:
        return _Alone(tensor)
    return _Gathering(tensor, _tag(kind, name), what, where)


class _Alone(Deferred):
    """A gathering of one: the tensor itself (a copy), its first dimension the only size."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__(None, lambda _: tensor.detach().clone())
        self.sizes = [tensor.shape[0]]


class _Allgather(torch.autograd.Function):
    """Horovod's gradient: the average of the output's gradient over the workers, this
    rank's rows of it."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):    # noqa: ANN001
        ctx.where = scope(process_set)
        gathering = _gather(tensor, name, ctx.where)
        out = gathering.wait()
        ctx.sizes = gathering.sizes
        return out

    @staticmethod
    def backward(ctx, grad):    # noqa: ANN001
        mine = ops.rows(ctx.sizes, ctx.where.rank)
        return sum_async(grad, None, Average, where=ctx.where).wait().narrow(0, mine.start, mine.count), None, None


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> Deferred:
    where = scope(process_set)
    claim("allgather", name)
    return hold("allgather", name, _gather(tensor, name, where))


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Every worker's (of ``process_set``) ``tensor`` concatenated on the first dimension, in
    rank order (the first dimensions may differ between workers, nothing else may)."""
    where = scope(process_set)
    claim("allgather", name)
    if differentiable(tensor):
        return _Allgather.apply(tensor, name, process_set)
    return _gather(tensor, name, where).wait()


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None, process_set: Any = None) -> Group:
    where = scope(process_set)
    claim("grouped_allgather", name)
    return hold("grouped_allgather", name,
                Group([_gather(t, member(name, i), where) for i, t in enumerate(tensors)]))


class _GroupedAllgather(torch.autograd.Function):
    """Each member's gradient as ``_Allgather``'s, the averages made in one grouped call."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):    # noqa: ANN001
        ctx.where = scope(process_set)
        gathered = [_gather(t, member(name, i), ctx.where) for i, t in enumerate(tensors)]
        outs = tuple(g.wait() for g in gathered)
        ctx.sizes = [g.sizes for g in gathered]
        return outs

    @staticmethod
    def backward(ctx, *grads):    # noqa: ANN001
        averaged = Group([sum_async(g, None, Average, where=ctx.where) for g in grads]).wait()
        mine = [ops.rows(sizes, ctx.where.rank) for sizes in ctx.sizes]
        return (None, None, *(g.narrow(0, m.start, m.count) for g, m in zip(averaged, mine)))


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None, process_set: Any = None) -> list:
    if any(differentiable(t) for t in tensors):
        scope(process_set)
        claim("grouped_allgather", name)
        return list(_GroupedAllgather.apply(name, process_set, *tensors))
    return grouped_allgather_async(tensors, name, process_set).wait()


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list:
    """Every worker's (of ``process_set``) ``obj``, in rank order: any object in a job with
    a signing key, plain data without one (ps/collective/objects.py)."""
    where = scope(process_set)
    kv = runtime.store()
    if kv is None:
        return [obj]
    data = torch.frombuffer(bytearray(objects.dumps(obj, kv, "allgather_object")), dtype=torch.uint8)
    gathering = _gather(data, name, where, "allgather_object")
    raw = gathering.wait().numpy().tobytes()
    sizes = gathering.sizes
    starts = np.cumsum([0, *sizes])
    return [objects.loads(raw[starts[r]:starts[r + 1]], kv, "allgather_object") for r in range(len(sizes))]


def reduce_gathered(tensor: torch.Tensor, op: Any, name: str | None, prescale: float, postscale: float,
                    target: torch.Tensor | None, where: Scope) -> Deferred:
    """Min, Max or Product over the workers: gather every rank's tensor, reduce here. Scaled in
    the tensor's dtype before and after, as the sums are (Horovod's rule, ps/collective/ops.py)."""
    sent = scaled(tensor.detach(), prescale)
    scaling = variant("Average", prescale, postscale)
    handle = _gather(sent.reshape(1, *sent.shape), f"{name or 'noname'}{scaling}" if scaling else name, where,
                     f"allreduce.{op.name.lower()}")

    def finish(every: torch.Tensor) -> torch.Tensor:
        wide = every.float() if every.dtype == torch.bfloat16 else every      # numpy has no bfloat16
        out = scaled(torch.from_numpy(ops.folded(wide.numpy(), op)).to(tensor.dtype), postscale)
        if target is not None:
            target.copy_(out)
        return out
    return Deferred(handle, finish)


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: Any = Average,
                           process_set: Any = None) -> Callable[[], torch.Tensor]:
    """Horovod's sum (or average) of sparse COO tensors: an allgather of every worker's
    indices and values. Returns a callable that gives the (uncoalesced) result."""
    where = scope(process_set)
    reduce = reduce_op(op)
    if reduce not in (Average, Sum):
        raise UnsupportedError(f"sparse allreduce of {name!r}: op {reduce.name} is not supported (Average or Sum)")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError(f"sparse_allreduce_async of {name!r} takes a sparse COO tensor, got "
                        f"{type(tensor).__name__ if not isinstance(tensor, torch.Tensor) else tensor.layout}")
    tag = f"sparse.{name}" if name is not None else None
    indices = _gather(tensor._indices().transpose(0, 1).contiguous(), f"{tag}.indices" if tag else None, where)
    values = _gather(tensor._values(), f"{tag}.values" if tag else None, where)

    def result() -> torch.Tensor:
        v, i = values.wait(), indices.wait()
        if reduce is Average:
            v = v / where.size
        return torch.sparse_coo_tensor(i.transpose(0, 1), v, tensor.size())
    return result


# -- alltoall --------------------------------------------------------------------------
def _splits(tensor: torch.Tensor, splits: Any, what: str, where: Scope) -> list[int]:
    n, rows = where.size, tensor.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(f"{what}: the first dimension ({rows}) does not split evenly over {n} workers; "
                             "pass splits")
        return [rows // n] * n
    got = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if len(got) != n or any(not float(s).is_integer() or s < 0 for s in got) or sum(got) != rows:
        raise ValueError(f"{what}: splits {got} must be {n} non-negative integers (one per worker) that add up "
                         f"to the first dimension, {rows}")
    return [int(s) for s in got]


def _alltoall(tensor: torch.Tensor, splits: Any, name: str | None, where: Scope) -> tuple[torch.Tensor, list[int]]:
    what = _what("alltoall", name)
    _need_dims(tensor, what)
    mine = _splits(tensor, splits, what, where)
    if runtime.store() is None:
        return tensor.detach().clone(), mine
    tag = _tag("alltoall", name)
    table = _table(tag, ops.table_row(mine, _form(tensor)), what, tensor, where)   # row i: what member i sends
    every = _gather_rows(tensor, tag, ops.sizes(table), where).wait()
    parts = ops.received(table, where.rank)
    return torch.cat([every[start:start + count] for start, count in parts]), [count for _, count in parts]


class _Alltoall(torch.autograd.Function):
    """The gradient goes back the way the rows came: an alltoall by the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):    # noqa: ANN001
        ctx.where = scope(process_set)
        out, ctx.received = _alltoall(tensor, splits, name, ctx.where)
        received = torch.tensor(ctx.received, dtype=torch.int64)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _received):    # noqa: ANN001
        return _alltoall(grad, ctx.received, None, ctx.where)[0], None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None) -> Any:
    """Rank r sends ``splits[j]`` rows of ``tensor`` (in order) to each rank j and gets the
    rows every rank sent it, in rank order. Returns them, and with ``splits`` given also
    how many came from each rank, as Horovod does."""
    where = scope(process_set)
    claim("alltoall", name)
    if differentiable(tensor):
        out, got = _Alltoall.apply(tensor, splits, name, process_set)
        received = got.tolist()
    else:
        out, received = _alltoall(tensor, splits, name, where)
    if splits is None:
        return out
    return out, torch.tensor(received, dtype=splits.dtype if isinstance(splits, torch.Tensor) else torch.int32)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = None) -> Deferred:
    result = alltoall(tensor, splits, name, process_set)
    return Deferred(None, lambda _: result)


# -- reducescatter ---------------------------------------------------------------------
def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average, process_set: Any = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                        compression: Any = Compression.none) -> Deferred:
    where = scope(process_set)
    reduce = reduce_op(op)
    what = _what("reducescatter", name)
    if reduce not in (Average, Sum):
        raise UnsupportedError(f"{what}: op {reduce.name} is not supported (Average or Sum)")
    _need_dims(tensor, what)
    claim("reducescatter", name)
    start, rows = ops.share(tensor.shape[0], where.size, where.rank)
    key = f"reducescatter.{name}" if name is not None else "reducescatter.noname"
    handle = sum_async(tensor.detach(), key, reduce, prescale_factor, postscale_factor, compression, where=where)
    return hold("reducescatter", name, Deferred(handle, lambda full: full.narrow(0, start, rows).clone()))


class _Reducescatter(torch.autograd.Function):
    """Horovod's gradient: the allgather of the output's gradient (times the worker count
    for Sum, and the scale factors)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, compression, process_set):    # noqa: ANN001
        ctx.args = (reduce_op(op), prescale, postscale, process_set)
        return reducescatter_async(tensor, name, op, process_set, prescale, postscale,
                                   compression=compression).wait()

    @staticmethod
    def backward(ctx, grad):    # noqa: ANN001
        op, prescale, postscale, process_set = ctx.args
        grad = grad * (scope(process_set).size if op is Sum else 1) * prescale * postscale
        return allgather(grad, process_set=process_set), None, None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = Compression.none,
                  op: Any = Average, process_set: Any = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """The average (or sum) over the workers, split on the first dimension: each rank keeps
    its part (the first ``rows % size`` ranks one row more)."""
    scope(process_set)
    if differentiable(tensor):
        return _Reducescatter.apply(tensor, name, op, prescale_factor, postscale_factor, compression, process_set)
    return reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor,
                               compression=compression).wait()


def grouped_reducescatter_async(tensors: list[torch.Tensor], name: str | None = None, op: Any = Average,
                                process_set: Any = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, *, compression: Any = Compression.none) -> Group:
    claim("grouped_reducescatter", name)
    return hold("grouped_reducescatter", name, Group([
        reducescatter_async(t, member(name, i), op, process_set, prescale_factor, postscale_factor,
                            compression=compression)
        for i, t in enumerate(tensors)]))


class _GroupedReducescatter(torch.autograd.Function):
    """Each member's gradient as ``_Reducescatter``'s, gathered in one grouped call."""

    @staticmethod
    def forward(ctx, name, op, prescale, postscale, compression, process_set, *tensors):    # noqa: ANN001
        ctx.args = (reduce_op(op), prescale, postscale, process_set)
        return tuple(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale, postscale,
                                                 compression=compression).wait())

    @staticmethod
    def backward(ctx, *grads):    # noqa: ANN001
        op, prescale, postscale, process_set = ctx.args
        factor = (scope(process_set).size if op is Sum else 1) * prescale * postscale
        return (None,) * 6 + tuple(grouped_allgather([g * factor for g in grads], process_set=process_set))


def grouped_reducescatter(tensors: list[torch.Tensor], name: str | None = None, compression: Any = Compression.none,
                          op: Any = Average, process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list:
    if any(differentiable(t) for t in tensors):
        scope(process_set)
        return list(_GroupedReducescatter.apply(name, op, prescale_factor, postscale_factor, compression,
                                                process_set, *tensors))
    return grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor,
                                       compression=compression).wait()


__all__ = ["allgather", "allgather_async", "allgather_object", "alltoall", "alltoall_async", "grouped_allgather",
           "grouped_allgather_async", "grouped_reducescatter", "grouped_reducescatter_async", "reducescatter",
           "reducescatter_async"]
