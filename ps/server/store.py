"""A server's keys and their rounds: its sync/async rules. Pure: no sockets, no threads.

Every call takes one request entry and returns the replies it makes due, so the
server only has to send what the store returns. Rules (design §5, MXNet's where sane):

* ``init``: the first init of a key sets it; a second one is an error.
* ``dist_sync``: pushes are summed per *round*; a round holds one push per distinct
  worker (a second push from the same worker opens the next round). When every worker
  the round needs has pushed (ps/server/quorum.py), the optimizer runs (or the sum
  *replaces* the value, as MXNet assigns) and every push and pushpull of the round is
  answered. A pull waits only if its worker has a push in an open round; otherwise it is
  answered at once. A chunk every worker pushed is summed at once, and streamed to the
  pushpulls that ask for it (ps/server/values.py has the arithmetic).
* ``dist_async``: each push goes through the optimizer at once.
* Row-sparse pushes (``Op.ROWS``) join the same rounds, summed per row id at the close.
* A bad request gets an error reply; nothing else changes.
* Recovery (PS_MAX_RESTARTS): pushes and pulls carry their worker's count of pushes to the
  key (``Entry.seq``), so what a restarted worker replays, or resends to a restarted server,
  is answered, not applied twice (ps/server/restarts.py). With ``journal`` set, every change
  to a value is recorded as an :class:`Event` (the sums, not the pushes) for a backup
  server to replay (ps/server/replica.py).

Rounds change only through the Store: the helpers it owns and alone calls are
:class:`Values` (the arithmetic of a round's sums) and :class:`Restarts` (replays); the
:class:`Quorum` (who must push) only reads rounds.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import compression as comp
from ..frames import DTYPES, Rows
from ..keys import CHUNK_BYTES
from ..message import Entry, Op, id_to_rank
from .bufguard import BufferGuard
from .events import Event, Joins, Replays
from .quorum import Quorum
from .restarts import Restarts
from .rounds import DEAD, KeyState, Reply, Round, Stall, StoreError, Waiter
from .updaters import Optimizers, Updater, whole_key
from .values import Values

logger = logging.getLogger(__name__)


class Store:
    def __init__(self, num_workers: int, sync: bool = True, name: str = "server",
                 guard: BufferGuard | None = None, chunk_bytes: int = CHUNK_BYTES,
                 clock: Callable[[], float] = time.monotonic, keep_before: bool = False):
        self.num_workers = num_workers
        self.clock = clock
        self.sync = sync
        self.name = name
        self.guard = guard or BufferGuard()
        self.keys: dict[int, KeyState] = {}
        self.opts = Optimizers()
        self.compression: dict[str, Any] | None = None
        self.journal: list[Event] | None = None  # recorded changes, for a backup (ps/server/replica.py)
        # who must push to a round: every worker, a key's members (a Horovod process set),
        # less the workers in Horovod's join; and the workers that closed their store
        self.quorum = Quorum(num_workers)
        self.rounds_closed = 0             # sync rounds closed, all keys (the dashboard)
        # the sums of a round into the value, and the replies that read it (keep_before:
        # the value before a key's latest round is kept for restarted workers)
        self.values = Values(self.opts, self.guard, chunk_bytes, keep_before)
        # restarted workers re-running steps their dead self did, and their settings counted
        self.restarts = Restarts(self.keys, self.values, self.opts, self.record)

    @property
    def members(self) -> dict[int, frozenset[int]]:
        """Keys only some workers push: key -> their node ids (the quorum's)."""
        return self.quorum.members

    @property
    def joins(self) -> Joins:
        """The workers in Horovod's join (the quorum's)."""
        return self.quorum.joins

    @property
    def replays(self) -> Replays:
        """Restarted workers replaying their scripts (the restarts')."""
        return self.restarts.replays

    # -- entry point ---------------------------------------------------------------------
    def handle(self, sender: int, entry: Entry, data: np.ndarray | None) -> list[Reply]:
        """Apply one request entry; the replies it makes due (pull data are views of
        values, lent to the replies through the guard: see ps/server/bufguard.py)."""
        op = entry.op
        try:
            if op & Op.ROWS:
                if op & Op.PUSH:
                    return self.push_rows(sender, entry, data)
                return self._pull(self._rows_key(entry, data.ids), Waiter(sender, entry, data.ids))
            if op & Op.INIT:
                return self.init(sender, entry, data)
            if op & Op.PUSH:
                return self.push(sender, entry, data)
            if op & Op.PULL:
                return self._pull(self._ready_key(entry), Waiter(sender, entry))
            raise StoreError("ProtocolError", f"entry for key {entry.key} has no operation (op={op})")
        except StoreError as exc:
            return [self._error(sender, entry, exc.kind, str(exc))]

    def _error(self, dest: int, entry: Entry, kind: str, text: str) -> Reply:
        return Reply(dest, entry.failed(kind, f"{self.name}: {text}"), None)

    def _ready_key(self, entry: Entry) -> KeyState:
        key, total, code = entry.key, entry.total, entry.dtype_code
        ks = self.keys.get(key)
        if ks is None or not ks.ready:
            raise StoreError("KeyError", f"key {key} is not initialized; call kv.init({key}, value) "
                                         "on every worker first")
        if code != ks.dtype_code:
            raise StoreError("TypeError", f"key {key}: dtype {DTYPES[code]} does not match the "
                                          f"initialized dtype {DTYPES[ks.dtype_code]}")
        if total != ks.total and not entry.op & Op.ROWS:    # rows entries count rows
            raise StoreError("ValueError", f"key {key}: {total} elements sent but this server holds "
                                           f"{ks.total} (shape differs from the initialized value)")
        return ks

    def _rows_key(self, entry: Entry, ids: np.ndarray) -> KeyState:
        key, row_len = entry.key, entry.row_len
        ks = self._ready_key(entry)
        if ks.total % row_len:
            raise StoreError("ValueError", f"key {key}: rows of {row_len} elements do not tile the "
                                           f"{ks.total} elements this server holds (shape differs)")
        if ids.size and int(ids.max()) >= ks.total // row_len:
            raise StoreError("IndexError", f"key {key}: row {int(ids.max())} of this server's slice is "
                                           f"out of range (it holds {ks.total // row_len} rows)")
        return ks

    # -- init ----------------------------------------------------------------------------
    def init(self, sender: int, entry: Entry, data: np.ndarray) -> list[Reply]:
        ts, key, off, n, total, code = entry.ts, entry.key, entry.offset, entry.length, entry.total, entry.dtype_code
        ks = self.keys.get(key)
        if ks is None:
            ks = self.keys[key] = KeyState(key, code, total, (sender, ts))
            if self.opts.multi_precision(key) and DTYPES[code] == np.float16:
                ks.merge_dtype = np.dtype(np.float32)
        elif ks.ready and (ks.init_src[0] < 0 or sender in self.replays.replaying):  # restored, or replayed
            return [Reply(sender, Entry(ts, entry.op, key, 0, 0, total, code), None)] if off + n == total else []
        elif ks.init_src != (sender, ts):
            raise StoreError("ValueError", f"key {key} is already initialized; a key can be "
                                           "initialized only once")
        elif code != ks.dtype_code or total != ks.total:
            raise StoreError("ValueError", f"key {key}: init chunks disagree on dtype or size")
        ks.value[off:off + n] = data
        ks.init_got += n
        if ks.ready:
            if self.journal is not None:
                self.journal.append(Event("init", key, 0, [code, total], (ks.value.copy(),)))
            return [Reply(sender, Entry(ts, entry.op, key, 0, 0, total, code), None)]
        return []

    def _create(self, entry: Entry) -> None:
        """The first push of a declared key (KVStore.declare) makes it: zeros, ready."""
        code, total = entry.dtype_code, entry.total
        if not 0 <= code < len(DTYPES) or total < 0:
            raise StoreError("ProtocolError", f"key {entry.key}: dtype code {code} or size {total} is not valid")
        ks = self.keys[entry.key] = KeyState(entry.key, code, total, (-1, -1))
        ks.value[:] = 0
        ks.init_got = total
        self.record(Event("init", entry.key, 0, [code, total], (ks.value.copy(),)))

    # -- push ----------------------------------------------------------------------------
    def push(self, sender: int, entry: Entry, data: np.ndarray) -> list[Reply]:
        if entry.op & Op.CREATE and entry.key not in self.keys:
            self._create(entry)
        ks = self._ready_key(entry)
        again = self._admit(ks, sender, entry)
        if again is not None:
            return again
        if entry.op & (Op.TWO_BIT | Op.FP16):
            data = self._decompress(entry, data, ks)
        if not self.sync:
            return self._push_async(sender, entry, data, ks)
        rnd = self._round_for(ks, sender, entry.ts)
        if rnd.sent_before(sender, entry):
            return []                        # its dead self sent this chunk: counted already
        if entry.op & Op.JOINABLE:
            rnd.joinable = True
        if entry.op & Op.STREAM and entry.op & Op.PULL:
            rnd.pulling[sender] = entry.op
        streamed = self._gather(ks, rnd, sender, entry.offset, entry.length, data)
        return streamed + self._count(ks, rnd, sender, entry, ks.total)

    def push_rows(self, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        ks = self._rows_key(entry, data.ids)
        again = self._admit(ks, sender, entry)
        if again is not None:
            return again
        if not self.sync:
            return self._push_async(sender, entry, data, ks)
        rnd = self._round_for(ks, sender, entry.ts)
        if rnd.sent_before(sender, entry):
            return []
        if rnd.rows is None:
            rnd.rows = []
        rnd.rows.append((sender, data))
        rnd.row_len = entry.row_len
        return self._count(ks, rnd, sender, entry, entry.total)    # rows entries count rows

    def _admit(self, ks: KeyState, sender: int, entry: Entry) -> list[Reply] | None:
        """The guards of every push, dense or rows: one from a worker the key is not for, or
        that closed its store, is refused; one this store holds already is answered, not
        applied twice. None: a new push, which ends its worker's replay."""
        quorum = self.quorum
        if quorum.members or quorum.closed:
            refused = quorum.refusal(ks.key, sender)
            if refused is not None:
                raise StoreError(*refused)
        restarts = self.restarts
        if entry.seq and restarts.holds(ks, sender, entry.seq, self.sync):
            return restarts.answer_again(ks, sender, entry, self.sync)
        if sender in restarts.replays.replaying:
            restarts.caught_up(sender)
        return None

    def _push_async(self, sender: int, entry: Entry, data: Any, ks: KeyState) -> list[Reply]:
        updater = self.opts.updater(ks.key)
        if updater is None:
            raise StoreError("RuntimeError", "dist_async needs an optimizer on the servers: call "
                                             "kv.set_optimizer(...) before the first push")
        return self.values.apply_async(ks, sender, entry, data, updater, self.journal)

    def _decompress(self, entry: Entry, data: np.ndarray, ks: KeyState) -> np.ndarray:
        try:
            return comp.decode_push(entry.op, data, entry.length, ks.merge_dtype, self.compression)
        except comp.UnsetError as exc:
            raise StoreError("RuntimeError", f"key {ks.key}: {exc}") from None

    # -- sync rounds -------------------------------------------------------------------------
    def _round_for(self, ks: KeyState, sender: int, ts: int) -> Round:
        for rnd in ks.rounds:
            if rnd.members.get(sender) == ts:
                return rnd
        for rnd in ks.rounds:
            if rnd.members.get(sender, DEAD) == DEAD:    # absent, or begun by its dead self
                rnd.members[sender] = ts
                return rnd
        rnd = Round(self.clock())
        rnd.members[sender] = ts
        ks.rounds.append(rnd)
        return rnd

    def _gather(self, ks: KeyState, rnd: Round, sender: int, off: int, n: int, data: np.ndarray) -> list[Reply]:
        """Hold each worker's chunk (the received frame, no copy) until every worker sent it,
        then sum them in one pass (:meth:`Values.reduce`). A later round's complete chunks
        wait until it is the first open round: rounds change the value in order."""
        pend = rnd.frames.get(off)
        if pend is None:
            pend = rnd.frames[off] = []
        elif pend[0][1].size != n:
            raise StoreError("ProtocolError", f"key {ks.key}: workers cut the value into different chunks "
                             f"({pend[0][1].size} and {n} elements at offset {off}): PS_CHUNK_BYTES must be "
                             "the same on every worker")
        pend.append((sender, data))
        quorum = self.quorum
        full = len(pend) >= self.num_workers if quorum.plain else quorum.chunk_full(ks.key, rnd, pend)
        if full and (rnd is ks.rounds[0] or whole_key(self.opts.updater(ks.key))):
            return self.values.reduce(ks, rnd, off, rnd.frames.pop(off), self.journal)
        return []

    def _count(self, ks: KeyState, rnd: Round, sender: int, entry: Entry, whole: int) -> list[Reply]:
        """Count one chunk of a worker's push; once ``whole`` arrived, the push is complete."""
        got = rnd.received.get(sender, 0) + entry.length
        rnd.received[sender] = got
        if got < whole:
            return []
        rnd.complete.add(sender)
        rnd.waiters.append(Waiter(sender, entry))
        return self._close_rounds(ks)

    def _close_rounds(self, ks: KeyState) -> list[Reply]:
        replies: list[Reply] = []
        quorum, values = self.quorum, self.values
        plain = quorum.plain                # the usual case: every worker, nobody joined
        while ks.rounds and (len(ks.rounds[0].complete) >= self.num_workers if plain
                             else quorum.round_full(ks.key, ks.rounds[0])):
            rnd = ks.rounds.pop(0)
            ks.closed += 1
            self.rounds_closed += 1
            if not plain and quorum.joins.joined:
                self._excuse(ks, rnd)
            values.close(ks, rnd, self.journal)
            if self.journal is not None:
                self.journal.append(Event("close", ks.key, 0, ks.closed))
            for waiter in rnd.waiters:         # pushes; a pushpull got its chunks as they were summed
                replies += values.answer(ks, waiter, rnd.streamed.get(waiter.worker))
            for waiter in rnd.pulls:
                replies += values.answer(ks, waiter)
            if ks.rounds:                      # chunks the next round completed while it waited
                nxt = ks.rounds[0]
                for off in [o for o, pend in nxt.frames.items()
                            if (len(pend) >= self.num_workers if plain else quorum.chunk_full(ks.key, nxt, pend))]:
                    replies += values.reduce(ks, nxt, off, nxt.frames.pop(off), self.journal)
        if quorum.some_stopped:
            replies += self._fail_doomed(ks)
        return replies

    def _excuse(self, ks: KeyState, rnd: Round) -> None:
        """``rnd`` closed without the joined workers it needed: count it for each."""
        excused = self.quorum.excused(ks.key, rnd)
        for w in excused:
            ks.excused[w] = ks.excused.get(w, 0) + 1
        if excused:
            self.record(Event("excused", ks.key, 0, [[w, 1] for w in excused]))

    # -- pull ----------------------------------------------------------------------------
    def _pull(self, ks: KeyState, waiter: Waiter) -> list[Reply]:
        """A pull, dense or rows, waits only for its worker's own push to the key."""
        replayed = self.restarts.replayed_pull(ks, waiter, self.sync)
        if replayed is not None:
            return replayed
        for rnd in reversed(ks.rounds):
            if waiter.worker in rnd.members:      # wait for this worker's own push to be applied
                rnd.pulls.append(waiter)
                return []
        return self.values.answer(ks, waiter)

    # -- stalls --------------------------------------------------------------------------
    def stalls(self, after: float, workers: list[int]) -> list[Stall]:
        """Every key whose oldest open sync round has waited ``after`` seconds or more for
        some of ``workers`` (PS_STALL_WARNING): the server names them, since otherwise a
        stuck worker leaves everyone else waiting in silence."""
        now = self.clock()
        found = []
        for ks in self.keys.values():
            if not ks.rounds or now - ks.rounds[0].opened < after:
                continue
            rnd = ks.rounds[0]
            missing = self.quorum.missing(ks.key, rnd, workers)
            waiting = tuple(sorted(rnd.complete | {p.worker for p in rnd.pulls}))
            found.append(Stall(ks.key, ks.closed + 1, now - rnd.opened, missing, waiting))
        return found

    # -- workers restarting (PS_MAX_RESTARTS) -----------------------------------------------
    def worker_died(self, worker: int) -> None:
        """A worker died and its restart is awaited (Restarts.died)."""
        self.restarts.died(worker)

    def pushed(self, worker: int) -> dict[int, int]:
        """Per key, the pushes of ``worker`` this store holds whole: where a restart resumes."""
        return self.restarts.pushed(worker, self.sync)

    def setting_resent(self, worker: int, cid: Any) -> bool:
        return self.restarts.setting_resent(worker, cid)

    def setting_made_before(self, worker: int, cmd: str, cid: Any = None) -> bool:
        return self.restarts.setting_made_before(worker, cmd, cid)

    def setting_applied(self, worker: int, cmd: str, cid: Any = None) -> None:
        self.restarts.setting_applied(worker, cmd, cid)

    def record(self, event: Event) -> None:
        """Journal a change for the backup, if one subscribed."""
        if self.journal is not None:
            self.journal.append(event)

    # -- workers leaving -----------------------------------------------------------------
    def worker_closed(self, worker: int) -> list[Reply]:
        """A worker closed its store: rounds still missing its push can never complete."""
        self.quorum.close(worker)
        replies: list[Reply] = []
        for ks in self.keys.values():
            replies += self._fail_doomed(ks)
        return replies

    def _fail_doomed(self, ks: KeyState) -> list[Reply]:
        """Fail the rounds of ``ks`` that can never complete (a worker they need closed its
        store, or joined), answering every request they hold with why."""
        replies: list[Reply] = []
        keep = []
        for rnd in ks.rounds:
            doom = self.quorum.doom(ks.key, rnd)
            if doom is None:
                keep.append(rnd)
                continue
            unanswered = [Waiter(w, Entry(t, Op.PUSH, ks.key, 0, 0, ks.total, ks.dtype_code))
                          for w, t in rnd.members.items() if w not in rnd.complete]
            for waiter in rnd.waiters + rnd.pulls + unanswered:
                replies.append(self._error(waiter.worker, waiter.entry, *doom))
        ks.rounds = keep
        return replies

    def drop_open(self, workers: frozenset[int] | None = None) -> dict[int, int]:
        """Forget every open sync round, unanswered (a deadlock verdict: the workers' waits
        can never end, and each fails its own requests); ``workers``: only the rounds of the
        keys just these workers push (a process set's). Returns, per key that had one, its
        rounds closed so far, from which its workers number their next pushes. A round a
        chunk of which went into the value already (every worker had pushed it) is kept."""
        closed = {}
        for ks in self.keys.values():
            if workers is not None and self.quorum.members.get(ks.key) != workers:
                continue
            keep = [rnd for rnd in ks.rounds if rnd.started]
            if len(keep) < len(ks.rounds):
                ks.rounds = keep
                closed[ks.key] = ks.closed + len(keep)
        return closed

    # -- workers joining (Horovod's join: uneven data) --------------------------------------
    def join(self, worker: int) -> list[Reply]:
        """``worker`` has nothing more to push until every worker joined: rounds pushed
        JOINABLE close without it (its share zero), every other round it is needed in fails.
        Returns the replies of the rounds that close or fail now."""
        self._quorum_event(Event("join", 0, 0, worker))
        replies: list[Reply] = []
        for ks in self.keys.values():
            if ks.rounds and ks.rounds[0].joinable:
                rnd = ks.rounds[0]
                for off in [o for o, pend in rnd.frames.items() if self.quorum.chunk_full(ks.key, rnd, pend)]:
                    replies += self.values.reduce(ks, rnd, off, rnd.frames.pop(off), self.journal)
                replies += self._close_rounds(ks)
            else:
                replies += self._fail_doomed(ks)
        return replies

    def leave(self, worker: int) -> tuple[int, list[tuple[int, int]]]:
        """Every worker joined; ``worker`` pushes again. Returns the last worker to join, and
        per key the rounds closed without ``worker`` (its next push of the key counts after
        them). The join ends for this store when every joined worker left."""
        again = self.quorum.left_before(worker)
        if again is not None:
            return again                    # resent to this server's restart: the same answer
        last = self.quorum.last_to_join(worker)
        skipped = [(ks.key, ks.excused.pop(worker)) for ks in self.keys.values() if worker in ks.excused]
        self._quorum_event(Event("leave", 0, 0, [worker, last, skipped]))
        return last, skipped

    def _quorum_event(self, event: Event) -> None:
        self.quorum.apply(event)
        self.record(event)

    # -- server commands -----------------------------------------------------------------
    def set_updater(self, updater: Updater | None, multi_precision: bool = False, ns: int = 0) -> None:
        """Raises RuntimeError while a sync round has been applied in part (chunk by chunk):
        the rest of it would go through a different optimizer."""
        started = sorted(k for k in self.half_applied() if self.opts.namespace(k) == ns)
        if started:
            raise RuntimeError(f"cannot change the optimizer while sync rounds of keys {started} are "
                               "half applied; set it before training or between steps")
        self.opts.set(ns, updater, multi_precision)
        self._merge_dtypes([ks.key for ks in self.keys.values() if self.opts.namespace(ks.key) == ns])

    def set_namespace(self, keys: list[int], ns: int) -> None:
        """Put ``keys`` in namespace ``ns`` (idempotent: every worker of the store says so)."""
        new = [k for k in keys if self.opts.namespace(k) != ns]
        if not new:
            return
        started = sorted(set(new) & set(self.half_applied()))
        if started:
            raise RuntimeError(f"cannot move keys {started} to namespace {ns} while their sync rounds are "
                               "half applied; move them before they are pushed")
        self.opts.assign(new, ns)
        self._merge_dtypes([k for k in new if k in self.keys])
        self.record(Event("ns", ns, 0, new))

    def set_members(self, keys: list[int], workers: list[int]) -> None:
        """Only ``workers`` (node ids) push ``keys`` (idempotent: sent before the keys' init)."""
        new, group = self.quorum.group(keys, workers)
        if not new:
            return
        started = sorted(k for k in new if k in self.keys and (self.keys[k].rounds or self.keys[k].closed))
        if started:
            raise RuntimeError(f"cannot restrict keys {started} to workers {sorted(id_to_rank(w) for w in group)}: "
                               "they were pushed already")
        self._quorum_event(Event("members", 0, 0, [new, sorted(group)]))

    def _merge_dtypes(self, keys: list[int]) -> None:
        for key in keys:                # fp16 keys sum in fp32 under multi_precision
            ks = self.keys[key]
            wide = self.opts.multi_precision(key) and ks.value.dtype == np.float16
            ks.merge_dtype = np.dtype(np.float32) if wide else ks.value.dtype

    # -- recovery (PS_MAX_RESTARTS) ----------------------------------------------------------
    def half_applied(self) -> list[int]:
        """Keys whose open sync round changed the value in part (chunk by chunk): a snapshot
        now would hold half a round."""
        return [ks.key for ks in self.keys.values() if any(r.started for r in ks.rounds)]

    def restore_key(self, key: int, dtype_code: int, value: np.ndarray, closed: int,
                    applied: dict[int, int], excused: dict[int, int]) -> None:
        """A key as a replica held it (a restarted server): initialized, ``closed`` sync rounds."""
        ks = self.keys[key] = KeyState(key, dtype_code, value.size, (-1, -1))
        ks.value = value
        ks.init_got = value.size
        ks.closed = closed
        ks.applied = dict(applied)
        ks.excused = dict(excused)

    def stats(self) -> dict[str, Any]:
        return {"keys": len(self.keys), "bytes": sum(ks.value.nbytes for ks in self.keys.values())}
