"""``ps.torch.Embedding`` and ``EmbeddingBag``: tables that live on the servers (ps/embed).

Forward deduplicates the batch's ids, pulls only those rows, and builds the output from them
with torch's own ``F.embedding``/``F.embedding_bag``; backward pushes one gradient row per
distinct id, without waiting. The next forward waits for that push first: under ``sync`` its
answer means every worker's gradients were averaged and applied, so the rows it pulls are the
ones one process training on all the workers' batches would have. The table's optimizer runs
on the servers; the modules hold no parameters, so the dense part's ``torch.optim``
optimizer and ``DistributedOptimizer`` never see them.

A process that runs alone (``init()`` outside a cluster) keeps the table itself, with the same
rows and optimizer.
"""
from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..embed import Init, Limits, LocalTable, TableSpec, checkpoint, serving
from ..optim import rowwise
from . import runtime

# torch.compile: the pulls, the checks and the gradient hook run as written, outside the graph
# (they are numpy and messages); the rows they return enter the compiled graph as inputs
_eager = torch.compiler.disable

_names = itertools.count()
_alone: dict[str, LocalTable] = {}     # a process without a cluster: its tables by name, as a server keeps them
_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class _Lookup(NamedTuple):
    """A forward's pull under way: the table, the distinct ids, the pull, each id's index."""

    table: Any
    keys: Any
    pending: Any
    index: torch.Tensor


class _Table(nn.Module):
    """What both modules share: the table, the lookup, the push of its gradient."""

    def __init__(self, embedding_dim: int, name: str | None, optimizer: rowwise.RowOptimizer | None,
                 init: Init | None, consistency: str, dtype: torch.dtype, limits: Limits | None):
        super().__init__()
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.spec = TableSpec(name if name is not None else f"embedding{next(_names)}", embedding_dim,
                              optimizer if optimizer is not None else rowwise.SGD(), init or Init(), consistency,
                              _DTYPES[dtype], limits or Limits())
        self.embedding_dim = embedding_dim
        self._table: Any = None
        self._pushed: Any = None        # the last push's handle
        self._owed = False              # a training forward whose gradient has not been pushed
        self._prefetched: tuple[torch.Tensor, _Lookup] | None = None     # prefetch(): ids, their pull

    def extra_repr(self) -> str:
        s = self.spec
        return f"{s.dim}, name={s.name!r}, optimizer={s.optimizer}, consistency={s.consistency!r}"

    def table(self) -> Any:
        """The table this module reads (made and declared on the first call)."""
        if self._table is None:
            kv = runtime.store()          # raises if init() has not run
            self._table = _local_table(self.spec) if kv is None else kv.table(self.spec)
        return self._table

    def flush(self) -> None:
        """Wait until the last gradient pushed was applied (before reading the table elsewhere)."""
        table = self.table()
        if self._owed and self.spec.waits_for_all:
            # a training forward whose output got no gradient: the round still needs this
            # worker's push, or every other worker would wait for it
            self._pushed = table.push(_NO_IDS, _no_rows(self.spec), block=False)
        self._owed = False
        pushed, self._pushed = self._pushed, None
        if pushed is not None:
            pushed.wait()

    def save(self, path: str, incremental: bool = False) -> int:
        """Write the table to the new directory ``path`` (one worker calls it, between steps:
        under ``sync`` no round closes meanwhile, since this worker has not pushed the next);
        ``incremental``: only the rows updated since the last save. The rows written."""
        self.flush()
        return checkpoint.save(self.table(), path, incremental)

    def load(self, path: str) -> int:
        """Put a saved table's rows into this one, on however many servers it has now (one
        worker calls it before training; the others wait, e.g. at ``hvd.barrier()``)."""
        self.flush()
        return checkpoint.load(self.table(), path)

    def export(self, path: str) -> int:
        """Write every row to the new directory ``path`` for serving (``ps.embed.Rows`` reads
        it, with no cluster and no torch); one worker calls it, between steps."""
        self.flush()
        return serving.export(self.table(), path)

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct ids' rows (a leaf that pushes its gradient) and each id's index into them."""
        return self._finish(self._start(ids))

    @_eager
    def _start(self, ids: torch.Tensor) -> _Lookup:
        """Check ``ids`` and start pulling the rows of the distinct ones (not waiting)."""
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"{type(self).__name__} {self.spec.name!r}: input must be a tensor of ids, "
                            f"got {type(ids).__name__}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"{type(self).__name__} {self.spec.name!r}: ids must be an integer tensor "
                            f"(torch.long), got {ids.dtype}")
        self.flush()
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0].shape == ids.shape and torch.equal(prefetched[0], ids):
            return prefetched[1]
        return self._begin(ids, ahead=0)

    def _begin(self, ids: torch.Tensor, ahead: int) -> _Lookup:
        table = self.table()
        unique, inverse = torch.unique(ids.detach().reshape(-1).to(torch.int64, copy=False), sorted=True,
                                       return_inverse=True)
        keys = unique.numpy()
        return _Lookup(table, keys, table.pull(keys, block=False, ahead=ahead), inverse.view(ids.shape))

    def prefetch(self, ids: torch.Tensor) -> None:
        """Start pulling the next batch's rows now, while this step computes (``async`` and
        ``ssp`` tables only): the next forward with equal ``ids`` uses them. Under ``ssp:S`` the
        server answers once every worker is within S steps of the next one, as it would the
        next forward's own pull; the rows may lack this worker's own last update, which is
        still on its way."""
        if self.spec.consistency == "sync":
            raise ValueError(f"{type(self).__name__} {self.spec.name!r}: prefetch() reads rows before this "
                             "step's sync round closes, so they would not be one process's; use an async or "
                             "ssp table")
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"{type(self).__name__} {self.spec.name!r}: ids must be an integer tensor (torch.long)")
        self._prefetched = (ids.detach().clone(), self._begin(ids, ahead=1))

    @_eager
    def _finish(self, lookup: _Lookup) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(lookup.pending.wait())
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_()
            table, keys = lookup.table, lookup.keys
            rows.register_hook(lambda grad: self._push(table, keys, grad))
            self._owed = True
        return rows, lookup.index

    def _push(self, table: Any, keys: Any, grad: torch.Tensor) -> None:
        self._owed = False
        self._pushed = table.push(keys, grad.detach().contiguous().numpy(), block=False)


def _local_table(spec: TableSpec) -> LocalTable:
    table = _alone.get(spec.name)
    if table is None:
        table = _alone[spec.name] = LocalTable(spec)
    problem = table.spec.mismatch(spec)
    if problem:
        raise ValueError(problem)
    return table


_NO_IDS = torch.empty(0, dtype=torch.int64).numpy()


def _no_rows(spec: TableSpec) -> Any:
    return torch.empty((0, spec.dim), dtype=getattr(torch, spec.dtype)).numpy()


class Embedding(_Table):
    """``torch.nn.Embedding`` with its table on the servers: any int64 id, no
    ``num_embeddings``; a row is made the first time its id is looked up."""

    def __init__(self, embedding_dim: int, *, name: str | None = None,
                 optimizer: rowwise.RowOptimizer | None = None, init: Init | None = None,
                 consistency: str = "sync", dtype: torch.dtype = torch.float32, limits: Limits | None = None):
        super().__init__(embedding_dim, name, optimizer, init, consistency, dtype, limits)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows, index = self._rows(ids)
        return F.embedding(index, rows)


class EmbeddingBag(_Table):
    """``torch.nn.EmbeddingBag`` (``mode`` sum or mean; ``offsets``, ``per_sample_weights``,
    ``include_last_offset`` as there) with its table on the servers."""

    def __init__(self, embedding_dim: int, mode: str = "mean", *, include_last_offset: bool = False,
                 name: str | None = None, optimizer: rowwise.RowOptimizer | None = None, init: Init | None = None,
                 consistency: str = "sync", dtype: torch.dtype = torch.float32, limits: Limits | None = None):
        if mode not in ("sum", "mean"):
            raise ValueError(f"EmbeddingBag mode must be 'sum' or 'mean', got {mode!r}")
        super().__init__(embedding_dim, name, optimizer, init, consistency, dtype, limits)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        self._check(input, offsets, per_sample_weights)
        rows, index = self._rows(input)
        return F.embedding_bag(index, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset)

    @_eager
    def _check(self, input: Any, offsets: Any, weights: Any) -> None:
        """torch's own checks, before any request: a bad batch is named here, not on a server."""
        name = f"EmbeddingBag {self.spec.name!r}"
        if not isinstance(input, torch.Tensor) or input.dim() not in (1, 2):
            raise ValueError(f"{name}: input must be a 1-d tensor of ids with offsets, or 2-d (bags of equal "
                             f"size), got {getattr(input, 'shape', type(input).__name__)}")
        if input.dim() == 2 and offsets is not None:
            raise ValueError(f"{name}: offsets must be None when input is 2-d, got {tuple(offsets.shape)}")
        if input.dim() == 1:
            if offsets is None:
                raise ValueError(f"{name}: a 1-d input needs offsets (where each bag starts)")
            if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.dtype.is_floating_point:
                raise ValueError(f"{name}: offsets must be a 1-d integer tensor, got "
                                 f"{getattr(offsets, 'dtype', type(offsets).__name__)} "
                                 f"{tuple(getattr(offsets, 'shape', ()))}")
            n = input.numel()
            if len(offsets) and (int(offsets[0]) != 0 or bool((offsets[1:] < offsets[:-1]).any())
                                 or int(offsets[-1]) > n or (self.include_last_offset and int(offsets[-1]) != n)):
                o = offsets[:9].tolist()
                raise ValueError(f"{name}: offsets {o[:8]}{'...' if len(offsets) > 8 else ''} do not match an input "
                                 f"of {n} ids: they must start at 0, never decrease, and end at most at {n}"
                                 f"{f' (exactly {n}, include_last_offset)' if self.include_last_offset else ''}")
        if weights is not None:
            if self.mode != "sum":
                raise ValueError(f"{name}: per_sample_weights need mode='sum', this bag's mode is {self.mode!r}")
            if not isinstance(weights, torch.Tensor) or weights.shape != input.shape:
                raise ValueError(f"{name}: per_sample_weights of shape {tuple(getattr(weights, 'shape', ()))} "
                                 f"for input of shape {tuple(input.shape)}")


class EmbeddingBagCollection(nn.Module):
    """Several ``EmbeddingBag`` tables looked up together, as a click model's categorical
    features are: the pulls of all of them leave at once (one message per server) and their
    pushes too, instead of one round trip per table.

    ``forward(ids)``: ``ids`` of shape (batch, tables) (one id per bag) or (batch, tables, n)
    (n ids per bag); returns (batch, tables, dim). ``names`` or a count: each table's name
    (``f"{prefix}{i}"`` for a count); the other arguments are every table's."""

    def __init__(self, tables: int | list[str], embedding_dim: int, mode: str = "sum", *, prefix: str = "bag",
                 optimizer: rowwise.RowOptimizer | None = None, init: Init | None = None,
                 consistency: str = "sync", dtype: torch.dtype = torch.float32, limits: Limits | None = None):
        super().__init__()
        names = [f"{prefix}{i}" for i in range(tables)] if isinstance(tables, int) else list(tables)
        if not names:
            raise ValueError("EmbeddingBagCollection needs at least one table")
        self.bags = nn.ModuleList(EmbeddingBag(embedding_dim, mode, name=n, optimizer=optimizer, init=init,
                                               consistency=consistency, dtype=dtype, limits=limits) for n in names)
        self.embedding_dim = embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() not in (2, 3) or ids.shape[1] != len(self.bags):
            raise ValueError(f"EmbeddingBagCollection of {len(self.bags)} tables: ids must be (batch, "
                             f"{len(self.bags)}) or (batch, {len(self.bags)}, ids per bag), got "
                             f"{tuple(getattr(ids, 'shape', ())) or type(ids).__name__}")
        per_bag = ids if ids.dim() == 3 else ids.unsqueeze(2)
        lookups = [bag._start(per_bag[:, t]) for t, bag in enumerate(self.bags)]     # every pull on its way
        outs = []
        for bag, lookup in zip(self.bags, lookups):
            rows, index = bag._finish(lookup)
            outs.append(F.embedding_bag(index, rows, mode=bag.mode))
        return torch.stack(outs, 1)

    def prefetch(self, ids: torch.Tensor) -> None:
        """Start pulling the next batch's rows of every table now (``async`` and ``ssp`` only;
        see ``EmbeddingBag.prefetch``): ``ids`` as the next ``forward`` will get them."""
        per_bag = ids if ids.dim() == 3 else ids.unsqueeze(2)
        for t, bag in enumerate(self.bags):
            bag.prefetch(per_bag[:, t])

    def flush(self) -> None:
        for bag in self.bags:
            bag.flush()
