"""A key's state on a server (:class:`KeyState`), its open sync rounds (:class:`Round`) and
the requests they hold, the replies a store makes of a value (:func:`answer`), the sums of
a round's pushes (:func:`sum_frames`, :func:`sum_rows`), and the error a request is refused
with (:class:`StoreError`). Records and arithmetic only: the rules that move them are the
Store's (ps/server/store.py), shared here with the helpers it owns.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..frames import DTYPES, Rows
from ..keys import chunks
from ..message import Entry, Op


class StoreError(Exception):
    """A request the store refuses: the error reply's kind and text."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


class Reply(NamedTuple):
    dest: int                  # worker node id
    entry: Entry
    data: np.ndarray | None


DEAD = -1       # Round.members: a push a dead worker began; its restart finishes it


class Round:
    __slots__ = ("merged", "members", "received", "complete", "waiters", "pulls", "frames", "started",
                 "rows", "row_len", "opened", "skip", "pulling", "streamed", "joinable")

    def __init__(self, opened: float = 0.0) -> None:
        self.opened = opened                    # when its first push arrived (Store's clock)
        self.merged: np.ndarray | None = None   # full-size sum, only for non-elementwise optimizers
        self.members: dict[int, int] = {}       # worker -> ts of its push in this round
        self.received: dict[int, int] = {}      # worker -> elements received so far
        self.complete: set[int] = set()
        self.waiters: list[Waiter] = []         # pushes answered at close
        self.pulls: list[Waiter] = []           # deferred pulls
        self.frames: dict[int, list] = {}       # chunk offset -> [(worker, received array)] not summed yet
        self.started = False                    # a chunk sum went into the value already
        self.rows: list[Rows] | None = None     # row-sparse pushes, in arrival order
        self.row_len = 0
        self.skip: dict[int, int] = {}          # restarted worker -> leading elements its dead self sent
        self.pulling: dict[int, int] = {}       # worker -> op of its pushpull in this round (chunks answered as summed)
        self.streamed: dict[int, dict[int, int]] = {}   # such a worker -> {offset: length} of the chunks it got
        self.joinable = False                   # may close without joined workers (Op.JOINABLE pushes)

    def sent_before(self, sender: int, entry: Entry) -> bool:
        """A chunk a restarted worker's dead self had sent (chunks of a push arrive in order)."""
        skip = self.skip.get(sender)
        return skip is not None and entry.length > 0 and entry.offset + entry.length <= skip


class Waiter(NamedTuple):
    """A request answered when its round closes."""

    worker: int
    entry: Entry
    ids: np.ndarray | None = None           # a row-sparse pull: the rows asked for


class Stall(NamedTuple):
    """A key's oldest open sync round that has waited long: what a stall warning names."""

    key: int
    round: int                  # this key's sync rounds so far, counting this one
    waited: float               # seconds since its first push arrived
    missing: tuple[int, ...]    # workers whose push has not (wholly) arrived
    waiting: tuple[int, ...]    # workers that pushed, or whose pull waits on the round


class KeyState:
    __slots__ = ("key", "value", "dtype_code", "total", "init_src", "init_got", "rounds", "spare",
                 "partial", "merge_dtype", "closed", "applied", "before", "excused")

    def __init__(self, key: int, dtype_code: int, total: int, init_src: tuple[int, int]):
        self.key = key
        self.dtype_code = dtype_code
        self.total = total
        self.value = np.empty(total, DTYPES[dtype_code])
        self.init_src = init_src
        self.init_got = 0
        self.rounds: list[Round] = []
        self.spare: np.ndarray | None = None    # a free buffer for the next round's sum
        self.partial: dict[tuple[int, int], list] = {}  # async: (worker, ts) -> [buffer, got]
        self.merge_dtype = DTYPES[dtype_code]
        self.closed = 0                         # sync rounds applied so far
        self.applied: dict[int, int] = {}       # async: worker -> seq of its last applied push
        # (n, copy of the value after round n) from just before round n + 1 changed it
        # (Store.keep_before): what a restarted worker replaying round n must be answered
        self.before: tuple[int, np.ndarray] | None = None
        self.excused: dict[int, int] = {}       # joined worker -> rounds closed without it (KVStore.join)

    @property
    def ready(self) -> bool:
        return self.init_got == self.total

    def kept(self, seq: int) -> np.ndarray | None:
        """The value as round ``seq`` left it, if the round after it has changed it since."""
        return self.before[1] if self.before is not None and self.before[0] == seq else None


def answer(value: np.ndarray, waiter: Waiter, chunk_bytes: int,
           ranges: list[tuple[int, int]] | None = None) -> list[Reply]:
    """The replies to ``waiter`` from ``value`` (a key's slice): an acknowledgement for a
    plain push; else the slice, or the ``ranges`` of it still to send, or the rows a
    row-sparse pull asked for, in chunks of ``chunk_bytes``. A whole float32 slice asked for
    in half precision (fp16 compression both ways) goes as float16 copies; only those are
    halved, and the reply says so. Whole slices are views of ``value``: whoever owns it must
    lend it while the replies are in flight (ps/server/bufguard.py)."""
    dest, req, ids = waiter
    ts, op, key, code, row_len = req.ts, req.op, req.key, req.dtype_code, req.row_len
    if not op & Op.PULL:
        return [Reply(dest, Entry(ts, op, key, 0, 0, req.total, code, None, row_len), None)]
    if ids is not None:                # the rows asked for, copied
        value = value.reshape(-1, row_len)[ids].reshape(-1)
    if op & Op.HALF_PULL:
        if ids is None and value.dtype == np.float32:
            return [Reply(dest, Entry(ts, op, key, off, n, value.size, code, None, row_len),
                          value[off:off + n].astype(np.float16))
                    for off, n in cuts(value.size, 2, chunk_bytes, ranges)]
        op &= ~Op.HALF_PULL
    return [Reply(dest, Entry(ts, op, key, off, n, value.size, code, None, row_len), value[off:off + n])
            for off, n in cuts(value.size, value.itemsize, chunk_bytes, ranges)]


def cuts(size: int, itemsize: int, chunk_bytes: int, ranges: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """Reply chunks of a whole slice, or of the ``ranges`` of it still to send."""
    if ranges is None:
        return chunks(size, itemsize, chunk_bytes)
    return [(start + off, n) for start, length in ranges for off, n in chunks(length, itemsize, chunk_bytes)]


def by_worker(pairs: list) -> list:
    """[(worker, item)] -> the items in worker order."""
    if len(pairs) == 2:                         # the common small case, without a sort
        (a, x), (b, y) = pairs
        return [x, y] if a < b else [y, x]
    return [item for _, item in sorted(pairs, key=_first)]


def _first(pair: tuple) -> Any:
    return pair[0]


def uncovered(sent: dict[int, int], total: int) -> list[tuple[int, int]]:
    """The (offset, length) ranges of [0, total) outside the chunks ``sent``."""
    gaps, pos = [], 0
    for start, length in sorted(sent.items()):
        if start > pos:
            gaps.append((pos, start - pos))
        pos = max(pos, start + length)
    if pos < total:
        gaps.append((pos, total - pos))
    return gaps


def sum_frames(frames: list, dst: np.ndarray) -> np.ndarray:
    """``dst = frames[0] + frames[1] + ...`` in arrival order, in ``dst``'s dtype (fp16
    frames of a multi-precision or fp16-compressed push add up in fp32)."""
    rest = frames[1:]
    if rest and frames[0].dtype == rest[0].dtype == dst.dtype:
        np.add(frames[0], rest[0], out=dst)
        rest = rest[1:]
    else:
        np.copyto(dst, frames[0], casting="unsafe")
    for more in rest:
        np.add(dst, more, out=dst, casting="unsafe")
    return dst


def sum_dense(frames: dict[int, list], rows: list, total: int, row_len: int, dtype: np.dtype) -> np.ndarray:
    """A round where some workers pushed dense (``frames``: offset -> [(worker, frame)]) and
    others rows (``rows``: [(worker, Rows)]), summed dense, each in rank order."""
    grad = np.zeros(total, dtype)
    for off, pend in frames.items():
        for frame in by_worker(pend):
            np.add(grad[off:off + frame.size], frame, out=grad[off:off + frame.size], casting="unsafe")
    by_row = grad.reshape(-1, row_len)
    for data in by_worker(rows):
        by_row[data.ids] += data.values.reshape(-1, row_len)
    return grad


def sum_rows(rows: list, row_len: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """A round's row-sparse pushes (``rows``: [(worker, Rows)]) summed per row id: the
    sorted ids and their sums, one row each."""
    pushes = by_worker(rows)
    ids = np.unique(np.concatenate([data.ids for data in pushes])).astype(np.int64)
    summed = np.zeros((ids.size, row_len), dtype)
    for data in pushes:                     # in rank order, as dense sums; ids distinct per push
        summed[np.searchsorted(ids, data.ids)] += data.values.reshape(-1, row_len)
    return ids, summed
