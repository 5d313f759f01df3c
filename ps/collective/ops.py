"""Horovod's collectives made of sums, written once for both adapters, on numpy arrays.

The servers only add. A gather is still a sum: every member of a scope writes its rows into
its own place of a buffer of zeros, and the sum of the buffers is the concatenation (x + 0 is
x exactly, in every dtype). The first dimensions differ from member to member, so a small sum
first, the table, tells every member all of them; the last column of each member's row is a
fingerprint of the rest of its tensor's shape and its dtype, so a mismatch is named on every
member, with the rank that differs, instead of a round that never closes. The buffer's first
dimension is rounded up to a power of two, so varying sizes reuse a few keys. An alltoall's
table row holds what a member sends each other member, and its gather is of every member's
whole tensor, of which each keeps the rows sent to it. A reducescatter is a sum of which each
member keeps its share of rows. Min, Max and Product are reduced on each member from a
gather. Scaling (prescale, postscale) is Horovod's CPU rule, in the tensor's own dtype.

Costs, against Horovod's: a gather moves the whole buffer to and from every worker (N times a
member's rows each way, where Horovod's ring moves N - 1 times); alltoall is a gather of every
member's whole tensor; reducescatter is an allreduce. Fine for metrics, embeddings and routing
tables; not a fast path.

What stays with each adapter is its tensors (NDArray, ``torch.Tensor`` <-> numpy), the keys of
its sums and their sequencing: MXNet's calls block, ``ps.torch`` starts a gather's rows from
the I/O thread the moment the table's sum is in. Both compose the steps below.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np


class ReduceOp(NamedTuple):
    """Horovod's ``hvd.Sum``, ``hvd.Average``, ...: the servers add; Min, Max and Product are
    reduced on each worker from an allgather (GATHERED)."""
    name: str


Average = ReduceOp("Average")
Sum = ReduceOp("Sum")
Adasum = ReduceOp("Adasum")
Min = ReduceOp("Min")
Max = ReduceOp("Max")
Product = ReduceOp("Product")
REDUCE_OPS = {op.name.lower(): op for op in (Average, Sum, Min, Max, Product)}
GATHERED = (Min, Max, Product)
_FOLDS = {Min: np.minimum, Max: np.maximum, Product: np.multiply}


def reduce_op(op: Any, average: bool | None, refused: Callable[[str], Exception], api: str) -> ReduceOp:
    """Horovod's ``op=`` (``hvd.Sum``, ..., or its name), else ``average`` (the default: Average);
    ``refused(message)`` is the error for one ps does not have. Both at once is an error, as
    in Horovod (``op`` supersedes ``average``)."""
    if op is None:
        return Average if average is None or average else Sum
    if average is not None:
        raise ValueError(f"op={op!r} and average={average!r}: the op parameter supersedes average, give only one")
    name = op.name if isinstance(op, ReduceOp) else op
    found = REDUCE_OPS.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise refused(f"op {name if isinstance(name, str) else op!r} is not supported: {api} reduces with Average, "
                      "Sum, Min, Max or Product (no Adasum: the servers sum)")
    return found


def fingerprint(text: str) -> float:
    """40 bits of a hash of ``text``, exact as a float64 (a sum over the workers stays exact)."""
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=5).digest(), "little"))


# -- scaling -----------------------------------------------------------------------------
def work_dtype(dtype: Any) -> np.dtype:
    """The dtype Horovod's CPU ``ScaleBuffer`` multiplies a tensor of ``dtype`` in: an integer
    by a double factor (the product cast back, so truncated toward zero), float16 in float32,
    float32 and float64 in their own."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def scaled(a: np.ndarray, factor: float) -> np.ndarray:
    """``a * factor`` in ``a``'s dtype, as Horovod scales before and after a reduction (every
    op: Sum, Average, Min, Max, Product); ``a`` itself for a factor of 1 and for bools, which
    have no scale."""
    if factor == 1.0 or a.dtype == np.bool_:
        return a
    return (a.astype(work_dtype(a.dtype), copy=False) * factor).astype(a.dtype, copy=False)


def folded(every: np.ndarray, op: ReduceOp) -> np.ndarray:
    """Min, Max or Product over the first dimension of a gather (one row per member), in the
    gathered dtype (a product of integers wraps as it does in that dtype); an array even when
    the members' tensors are 0-d (numpy's reduce gives a scalar then)."""
    return np.asarray(_FOLDS[op].reduce(every, axis=0)).astype(every.dtype, copy=False)


# -- the table: what each member puts in, checked --------------------------------------------
def table_row(values: Sequence[int], form: str) -> list[float]:
    """A member's row of the table: ``values`` (its rows; an alltoall's, the rows for each
    member), then the fingerprint of ``form`` (the rest of its tensor's shape and its dtype,
    as the adapter writes them)."""
    return [*(float(v) for v in values), fingerprint(form)]


def table_share(row: Sequence[float], rank: int, size: int) -> np.ndarray:
    """What a member adds to the table's sum: its ``row`` at its place, zeros elsewhere."""
    share = np.zeros((size, len(row)), np.float64)
    share[rank] = row
    return share


def differing(table: np.ndarray, row: Sequence[float]) -> list[int]:
    """The places (in the scope) of the members whose fingerprint is not ours: empty when
    every member's tensor has our form."""
    return [int(r) for r in np.flatnonzero(table[:, -1] != row[-1])]


def sizes(table: np.ndarray) -> list[int]:
    """The rows each member puts in the gather: its row of the table without the fingerprint,
    added up."""
    return [int(x) for x in table[:, :-1].sum(axis=1)]


# -- the gather's buffer -------------------------------------------------------------------
class Span(NamedTuple):
    """Some consecutive rows: a member's share of a reducescatter, what it got from another
    member in an alltoall."""
    start: int
    count: int


class Rows(NamedTuple):
    """Where a member's rows go in a gather's buffer."""
    start: int          # its first row in the concatenation
    count: int          # its rows
    total: int          # the concatenation's rows (every member's)
    buffer: int         # the summed buffer's rows: ``total`` rounded up to a power of two


def rows(counts: Sequence[int], rank: int) -> Rows:
    """The layout of a gather of ``counts[r]`` rows from each member ``r``, for ``rank``."""
    total = int(sum(counts))
    return Rows(int(sum(counts[:rank])), int(counts[rank]), total, 1 << max(total - 1, 0).bit_length())


def placed(a: np.ndarray, layout: Rows) -> np.ndarray:
    """What a member adds to the rows' sum: ``a`` at its place in a buffer of zeros."""
    buf = np.zeros((layout.buffer, *a.shape[1:]), a.dtype)
    buf[layout.start:layout.start + layout.count] = a
    return buf


# -- alltoall and reducescatter ---------------------------------------------------------------
def received(table: np.ndarray, rank: int) -> list[Span]:
    """An alltoall's table (row ``s``: the rows member ``s`` sends each member, then the
    fingerprint): for each member in turn, where the rows it sent ``rank`` lie in the gather
    of every member's whole tensor."""
    sent = table[:, :-1].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sent.sum(axis=1))])
    return [Span(int(starts[s] + sent[s, :rank].sum()), int(sent[s, rank])) for s in range(len(sent))]


def share(rows: int, size: int, rank: int) -> Span:
    """Horovod's split of ``rows`` over ``size`` members: ``rank``'s rows (the first
    ``rows % size`` members get one more)."""
    each, extra = divmod(rows, size)
    return Span(rank * each + min(rank, extra), each + (rank < extra))
