"""How a round's sums change a key's value, and how replies read it (:class:`Values`).

The Store decides which round a push joins and when a round closes; this is the
arithmetic it then runs, owned by the Store and called only by it:

* A chunk every worker pushed is summed at once (:meth:`Values.reduce`) and, without an
  optimizer or with an elementwise one, goes straight into the value, so no full-size sum
  is kept; a pushpull that asked for it (``Op.STREAM``) gets that chunk's new value then.
  Other optimizers get the round's full sum at the close (:meth:`Values.close`).
* Row-sparse rounds are summed per row id at the close and only those rows go through the
  optimizer (``Updater.update_rows``: MXNet's lazy update where MXNet has one), or, without
  one, the sum replaces the value and the rows nobody pushed become zero (MXNet's server
  assigns the row_sparse sum). A round where some workers pushed dense and others rows is
  summed dense.
* ``dist_async``: each push goes through the optimizer once whole (:meth:`Values.apply_async`).
* Replies read the value zero-copy and lend it (:meth:`Values.answer`); a value is never
  changed while lent (copy-on-write, ps/server/bufguard.py), and with ``keep_before`` the
  value before a key's latest round is kept for replaying workers (ps/server/restarts.py).

Every change is journaled for a backup when the Store passes its ``journal`` (the sums, not
the pushes: ps/server/replica.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..keys import CHUNK_BYTES
from ..frames import Rows
from ..message import Entry, Op
from .bufguard import BufferGuard
from .events import Event
from .rounds import KeyState, Reply, Round, Waiter, answer, by_worker, sum_dense, sum_frames, sum_rows, uncovered
from .updaters import Optimizers, Updater, apply_rows, whole_key

SPARE_MAX_BYTES = 256 << 10   # keep a key's free merge buffer across rounds only up to this size
SCRATCH_MAX_BYTES = 4 << 20   # keep the chunk-sum scratch up to this size (a chunk is ~1 MiB)


class Values:
    def __init__(self, opts: Optimizers, guard: BufferGuard, chunk_bytes: int = CHUNK_BYTES,
                 keep_before: bool = False):
        self.opts = opts
        self.guard = guard
        self.chunk_bytes = chunk_bytes
        # keep each key's value from before its latest round (a copy per round; on when
        # workers may restart): a worker that died between pushing one key of a step and
        # the next must get the weights its dead self had, not one round newer
        self.keep_before = keep_before
        self._scratch = np.empty(0, np.uint8)  # reused for chunk sums that go through an optimizer

    # -- a sync round ------------------------------------------------------------------------
    def reduce(self, ks: KeyState, rnd: Round, off: int, frames: list, journal: list[Event] | None) -> list[Reply]:
        """Sum one chunk's frames and use the sum right away: assign it to the value (no
        optimizer, as MXNet) or run the elementwise optimizer on this chunk only, so no
        full-size sum is kept. Safe because every worker pushed this chunk, so every worker
        is a member of this round and every pull of the key waits for it to close; the round
        is the first open one, so the value holds the previous round's result. Other
        optimizers get the chunk summed into the round's full-size buffer. The frames are summed
        in rank order, not arrival order: the same inputs give the same bits, so a restarted
        server that redoes a round gets what the dead one would have (and runs repeat).

        A chunk used this way holds its value after the round already, so the round's
        pushpulls get it now (:meth:`_stream`) instead of at the close."""
        frames = by_worker(frames)
        n = frames[0].size
        updater = self.opts.updater(ks.key)
        if whole_key(updater):
            sum_frames(frames, self._merge_buffer(ks, rnd)[off:off + n])
            return []
        if not rnd.started:                    # once per round: copy-on-write, count the update
            self._before_write(ks, ks.closed)
            if updater is not None:
                updater.begin(ks.key, ks.value)
            rnd.started = True
        dst = ks.value[off:off + n]
        if updater is None and ks.merge_dtype == ks.value.dtype:
            total = sum_frames(frames, dst)
        else:   # journaled: a buffer of its own, which the event keeps (the scratch is reused)
            total = sum_frames(frames, self._scratch_for(n, ks.merge_dtype) if journal is None
                               else np.empty(n, ks.merge_dtype))
            if updater is None:
                np.copyto(dst, total, casting="unsafe")
            else:
                updater.update_chunk(ks.key, off, total, ks.value)
        if journal is not None:
            journal.append(Event("chunk", ks.key, off, None, (total if total.base is None else total.copy(),)))
        # with a backup subscribed (journal), even since the round's pushpulls asked, nothing
        # streams: the backup replays closes, not chunks, so the close answers them whole
        return self._stream(ks, rnd, off, n) if rnd.pulling and journal is None else []

    def _stream(self, ks: KeyState, rnd: Round, off: int, n: int) -> list[Reply]:
        """Answer the round's streamed pushpulls (Op.STREAM) with one chunk that will not
        change again this round. At the close a server would otherwise answer a slice only
        once every worker's last chunk arrived, its link idle meanwhile while others wait
        for one straggler (VGG-16's 103 MB slices: seconds); this way the replies follow
        the pushes chunk by chunk. Workers ask for it only across a network: on one machine
        the interleaving cost the Gluon MLP benchmark 9 %. Not while a backup keeps this
        server's replica (``journal``): the close is what it replays. A worker that dies
        mid-round loses its chunks here (``Store.worker_died``): its restart gets them at the close."""
        value, code = ks.value, ks.dtype_code
        lent = False
        replies = []
        for worker, op in rnd.pulling.items():
            rnd.streamed.setdefault(worker, {})[off] = n
            chunk = value[off:off + n]
            if op & Op.HALF_PULL and value.dtype == np.float32:
                chunk = chunk.astype(np.float16)           # a copy: nothing lent
            else:
                op &= ~Op.HALF_PULL
                lent = True
            replies.append(Reply(worker, Entry(rnd.members[worker], op, ks.key, off, n, value.size, code), chunk))
        if lent:
            self.guard.lend(value)
        return replies

    def _scratch_for(self, n: int, dtype: np.dtype) -> np.ndarray:
        """Room for one chunk's sum; only used inside :meth:`reduce`, so one buffer serves all keys."""
        nbytes = n * dtype.itemsize
        if nbytes > self._scratch.nbytes:
            buf = np.empty(nbytes, np.uint8)
            if nbytes > SCRATCH_MAX_BYTES:
                return buf.view(dtype)
            self._scratch = buf
        return self._scratch[:nbytes].view(dtype)

    def _merge_buffer(self, ks: KeyState, rnd: Round) -> np.ndarray:
        if rnd.merged is None:
            spare, ks.spare = ks.spare, None
            if spare is None or self.guard.busy(spare) or spare.dtype != ks.merge_dtype:
                spare = np.empty(ks.total, ks.merge_dtype)
            rnd.merged = spare
        return rnd.merged

    def close(self, ks: KeyState, rnd: Round, journal: list[Event] | None) -> None:
        """The round ``rnd`` closed: what was not used chunk by chunk changes the value now."""
        if rnd.rows is not None:               # no copy kept: the value may be a whole embedding
            self._close_rows(ks, rnd, journal)  # table, and its rows are pulled apart from their push
            return
        merged = rnd.merged
        if merged is None:                     # used chunk by chunk already
            return
        self._before_write(ks, ks.closed - 1)
        self.opts.updater(ks.key)(ks.key, merged, ks.value)
        if journal is not None:
            journal.append(Event("whole", ks.key, 0, None, (merged.copy(),)))
        ks.spare = merged if merged.nbytes <= SPARE_MAX_BYTES else None

    def _close_rows(self, ks: KeyState, rnd: Round, journal: list[Event] | None) -> None:
        row_len = rnd.row_len
        updater = self.opts.updater(ks.key)
        if rnd.frames:                          # some workers pushed dense: sum dense
            grad = sum_dense(rnd.frames, rnd.rows, ks.total, row_len, ks.merge_dtype)
            rnd.frames = {}
            self._writable(ks)
            if updater is None:
                np.copyto(ks.value, grad, casting="unsafe")
            else:
                updater(ks.key, grad, ks.value)
            if journal is not None:
                journal.append(Event("dense", ks.key, 0, None, (grad,)))
            return
        rows, summed = sum_rows(rnd.rows, row_len, ks.merge_dtype)
        self._writable(ks)
        apply_rows(updater, ks.key, ks.value.reshape(-1, row_len), rows, summed)
        if journal is not None:
            journal.append(Event("rows", ks.key, 0, row_len, (rows, summed.reshape(-1))))

    def _before_write(self, ks: KeyState, closed: int) -> None:
        """Round ``closed + 1`` is about to change the value (after round ``closed``). With
        ``keep_before`` the array as it is becomes the kept one (never written again, so
        replies may still read it) and the round writes into a fresh copy, which no reply
        reads: one copy per round, never a second one for copy-on-write. Else copy-on-write."""
        if self.keep_before:
            ks.before = (closed, ks.value)
            ks.value = ks.value.copy()
        else:
            self._writable(ks)

    def _writable(self, ks: KeyState) -> None:
        """Copy-on-write (ps/server/bufguard.py): never change a value a reply may still read."""
        ks.value = self.guard.writable(ks.value)

    # -- dist_async --------------------------------------------------------------------------
    def apply_async(self, ks: KeyState, sender: int, entry: Entry, data: Any, updater: Updater,
                    journal: list[Event] | None) -> list[Reply]:
        """One async push, dense or rows, through ``updater``, once it is whole (before: [])."""
        if entry.length != entry.total:
            data = _whole_push(ks, sender, entry, data)
            if data is None:
                return []
        self._writable(ks)
        if entry.op & Op.ROWS:
            row_len = entry.row_len
            values = data.values.reshape(-1, row_len).astype(ks.merge_dtype, copy=False)
            updater.update_rows(ks.key, data.ids, values, ks.value.reshape(-1, row_len))
            kind, info, arrays = "arows", row_len, (data.ids, values)
        else:
            grad = data.astype(ks.value.dtype, copy=False)
            updater(ks.key, grad, ks.value)
            kind, info, arrays = "async", None, (grad,)
        if entry.seq:
            ks.applied[sender] = entry.seq
        if journal is not None:
            journal.append(Event(kind, ks.key, 0, [sender, entry.seq, info], tuple(a.copy() for a in arrays)))
        return self.answer(ks, Waiter(sender, entry))

    # -- replies -----------------------------------------------------------------------------
    def answer(self, ks: KeyState, waiter: Waiter, skip: dict[int, int] | None = None) -> list[Reply]:
        """``skip``: the chunks (offset -> length) a pushpull got already (:meth:`_stream`);
        the rest of the slice is answered. Replies that read the value lend it."""
        ranges = None
        if skip and waiter.entry.op & Op.PULL:
            ranges = uncovered(skip, ks.total)
            if not ranges:
                return []                  # the usual case: every chunk went out as it was summed
        replies = answer(ks.value, waiter, self.chunk_bytes, ranges)
        if replies[0].data is not None and np.may_share_memory(replies[0].data, ks.value):
            self.guard.lend(ks.value)
        return replies


def _whole_push(ks: KeyState, sender: int, entry: Entry, data: Any) -> Any:
    """An async push that came in chunks, once its last one is here (None before): the chunks
    wait in ``ks.partial`` (dense: copied into place; rows: kept, then joined)."""
    rows = entry.op & Op.ROWS
    part = ks.partial.get((sender, entry.ts))
    if part is None:
        part = ks.partial[(sender, entry.ts)] = [[] if rows else np.empty(entry.total, ks.merge_dtype), 0]
    if rows:
        part[0].append(data)
    else:
        part[0][entry.offset:entry.offset + entry.length] = data
    part[1] += entry.length
    if part[1] < entry.total:
        return None
    got = ks.partial.pop((sender, entry.ts))[0]
    return Rows(np.concatenate([p.ids for p in got]), np.concatenate([p.values for p in got])) if rows else got
