"""A server's key/value state and its sync/async rules. Pure: no sockets, no threads.

Every call takes one request entry and returns the replies it makes due, so the
server only has to send what the store returns. Rules (design §5, MXNet's where sane):

* ``init``: the first init of a key sets it; a second one is an error.
* ``dist_sync``: pushes are summed per *round*; a round holds one push per distinct
  worker (a second push from the same worker opens the next round). When every worker
  has pushed, the optimizer runs (or the sum *replaces* the value, as MXNet assigns) and
  every push and pushpull of the round is answered. A pull waits only if its worker has a
  push in an open round; otherwise it is answered at once. Without an optimizer or with
  an elementwise one, each chunk is used as soon as every worker has pushed it, so no
  full-size sum is kept (see ``_reduce``), and the round's pushpulls that ask for it
  (``Op.STREAM``: workers across a network) get that chunk's new value right then
  (``_stream``), not at the close; other optimizers get the round's full sum, and all
  pushpulls the value at the close.
* ``dist_async``: each push goes through the optimizer at once.
* Row-sparse pushes (``Op.ROWS``) join the same rounds; at the close the rows are summed
  per row id and only those rows go through the optimizer (``Updater.update_rows``: MXNet's
  lazy update where MXNet has one), or, without an optimizer, the sum replaces the value
  and the rows nobody pushed become zero (MXNet's server assigns the row_sparse sum). A
  round where some workers pushed dense and others rows is summed dense.
* A bad request gets an error reply; nothing else changes.
* Recovery (PS_MAX_RESTARTS): a push carries its worker's count of pushes to the key
  (``Entry.seq``), so a push resent to a restarted server that its replica already holds is
  answered, not applied twice; a pull carries the pushes so far, the round whose value a
  restarted worker asks for (:meth:`Store._replayed_pull`). With ``journal`` set, every
  change to a value is recorded as an :class:`Event` (the sums, not the pushes) for a backup
  server to replay (ps/server/replica.py).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

import numpy as np

from .. import compression as comp
from ..keys import CHUNK_BYTES
from ..message import DTYPES, Entry, Op, Rows, id_to_rank, node_name, worker_id
from .bufguard import BufferGuard
from .events import Event, Joins, Replays
from .rounds import DEAD, KeyState, Reply, Round, Stall, Waiter, answer, by_worker, sum_frames, uncovered
from .updaters import Optimizers, Updater, apply_rows, whole_key

logger = logging.getLogger(__name__)


SPARE_MAX_BYTES = 256 << 10   # keep a key's free merge buffer across rounds only up to this size
SCRATCH_MAX_BYTES = 4 << 20   # keep the chunk-sum scratch up to this size (a chunk is ~1 MiB)


class StoreError(Exception):
    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


class Store:
    def __init__(self, num_workers: int, sync: bool = True, name: str = "server",
                 guard: BufferGuard | None = None, chunk_bytes: int = CHUNK_BYTES,
                 clock: Callable[[], float] = time.monotonic, keep_before: bool = False):
        self.num_workers = num_workers
        self.clock = clock
        self.sync = sync
        self.name = name
        self.guard = guard or BufferGuard()
        self.chunk_bytes = chunk_bytes
        self.keys: dict[int, KeyState] = {}
        self.opts = Optimizers()
        # keys only some workers push (a Horovod process set): key -> those workers' node ids;
        # their rounds close when those workers pushed. Every other key waits for all.
        self.members: dict[int, frozenset[int]] = {}
        # workers that joined (KVStore.join, Horovod's uneven data): rounds pushed JOINABLE close
        # without them, their share zero; other rounds they were needed in fail. In the replica.
        self.joins = Joins()
        self.compression: dict[str, Any] | None = None
        self.closed_workers: set[int] = set()
        self.journal: list[Event] | None = None  # recorded changes, for a backup (ps/server/replica.py)
        # restarted workers re-running steps their dead self did, and their settings counted;
        # in the replica with the rest, so a server restart judges them as its dead self would
        self.replays = Replays()
        # keep each key's value from before its latest round (a copy per round; on when
        # workers may restart): a worker that died between pushing one key of a step and
        # the next must get the weights its dead self had, not one round newer
        self.keep_before = keep_before
        self._scratch = np.empty(0, np.uint8)  # reused for chunk sums that go through an optimizer

    # -- entry point ---------------------------------------------------------------------
    def handle(self, sender: int, entry: Entry, data: np.ndarray | None) -> list[Reply]:
        """Apply one request entry; the replies it makes due (pull data are views of
        values, lent to the replies through the guard: see ps/server/bufguard.py)."""
        op = entry.op
        try:
            if op & Op.ROWS:
                if op & Op.PUSH:
                    return self.push_rows(sender, entry, data)
                return self.pull_rows(sender, entry, data)
            if op & Op.INIT:
                return self.init(sender, entry, data)
            if op & Op.PUSH:
                return self.push(sender, entry, data)
            if op & Op.PULL:
                return self.pull(sender, entry)
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

    def _needed(self, ks: KeyState) -> int:
        """How many workers' pushes close a round of ``ks``."""
        group = self.members.get(ks.key)
        return self.num_workers if group is None else len(group)

    def _required(self, ks: KeyState) -> Iterable[int]:
        group = self.members.get(ks.key)
        return self._all_workers() if group is None else group

    def _round_full(self, ks: KeyState, rnd: Round) -> bool:
        """Every worker ``rnd`` needs pushed whole, or is excused by a join."""
        if self.joins.joined and rnd.joinable:
            return all(w in rnd.complete or w in self.joins.joined for w in self._required(ks))
        return len(rnd.complete) >= self._needed(ks)

    def _chunk_full(self, ks: KeyState, rnd: Round, pend: list) -> bool:
        """Every worker ``rnd`` needs sent this chunk (``pend``), or is excused by a join."""
        if self.joins.joined and rnd.joinable:
            have = {w for w, _ in pend}
            return all(w in have or w in self.joins.joined for w in self._required(ks))
        return len(pend) >= self._needed(ks)

    def _excuse(self, ks: KeyState, rnd: Round) -> None:
        """``rnd`` closed without the joined workers it needed: count it for each."""
        group = self.members.get(ks.key)
        excused = [w for w in self.joins.joined if w not in rnd.complete and (group is None or w in group)]
        for w in excused:
            ks.excused[w] = ks.excused.get(w, 0) + 1
        if excused:
            self.record(Event("excused", ks.key, 0, [[w, 1] for w in excused]))

    def _check_member(self, ks: KeyState, sender: int) -> None:
        group = self.members.get(ks.key)
        if group is not None and sender not in group:
            raise StoreError("ValueError", f"key {ks.key} is pushed only by workers "
                                           f"{sorted(id_to_rank(w) for w in group)}, not by {self._who(sender)}")

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
        if self.members:
            self._check_member(ks, sender)
        if sender in self.closed_workers:
            raise StoreError("PeerLostError", f"{self._who(sender)} already closed its store")
        if self._applied_before(ks, sender, entry):
            return self._answer_again(ks, sender, entry)
        self._caught_up(sender)
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

    def _applied_before(self, ks: KeyState, sender: int, entry: Entry) -> bool:
        """A push this store already holds: resent after a server restart, or replayed by a
        restarted worker (its dead self pushed it, whole, into a closed or open round)."""
        seq = entry.seq
        if not seq:
            return False
        if not self.sync:
            return seq <= ks.applied.get(sender, 0)
        if seq > ks.closed + len(ks.rounds):      # the usual case: a new push (no loop on the hot path)
            return False
        return seq <= ks.closed + self._complete_open(ks, sender)

    @staticmethod
    def _complete_open(ks: KeyState, worker: int) -> int:
        """How many of the key's leading open rounds hold a whole push of ``worker``."""
        n = 0
        for rnd in ks.rounds:
            if worker not in rnd.complete:
                break
            n += 1
        return n

    def _answer_again(self, ks: KeyState, sender: int, entry: Entry) -> list[Reply]:
        """Answer such a push once, at its last chunk (chunks of one push arrive in order),
        with the value after its round: now if closed, else when it closes."""
        if entry.offset + entry.length < entry.total:
            return []
        if entry.op & Op.PULL and sender in self.replays.replaying:
            self._check_replay(ks, sender, entry.seq)
        index = entry.seq - ks.closed - 1
        if self.sync and 0 <= index < len(ks.rounds):
            ks.rounds[index].pulls.append(Waiter(sender, entry))
            return []
        kept = ks.kept(entry.seq) if self.sync else None
        if kept is not None:
            # the next round has changed the value since (its dead self pushed into it, or
            # began to): answer with the value after this push's own round
            return answer(kept, Waiter(sender, entry), self.chunk_bytes)
        replies = self._answer(ks, Waiter(sender, entry))
        if self.sync and ks.rounds and ks.rounds[0].started:
            # the open round writes its next chunks into the value in place: copy-on-write
            # runs only at a round's first chunk (streamed chunks are final for their round,
            # so a check per chunk would copy the value at every chunk); a whole slice lent
            # now would change under the transport, so this rare reply is a copy
            replies = [r._replace(data=r.data.copy()) if r.data is not None else r for r in replies]
        return replies

    def _check_replay(self, ks: KeyState, sender: int, seq: int) -> None:
        """A restarted worker replaying its script asks for the value after round ``seq`` (a
        pull: after the rounds it has pushed so far). With an
        optimizer here that is the weights, and the latest are the right answer; without one
        the value is a round's sum (the weights live on the workers: MXNet's
        update_on_kvstore=False, a Horovod-style job, a numpy KVStore without set_optimizer),
        and the sums of the rounds its dead self finished are gone: refuse, instead of handing
        it another round's sum to train on."""
        if not self.sync or not ks.closed or self.opts.updater(ks.key) is not None:
            return
        if seq >= ks.closed or ks.kept(seq) is not None:
            return                      # this round's own sum is here, or still to come (an open round)
        raise StoreError("CollectiveError", (
            f"{self._who(sender)} was restarted and re-runs its script, but key {ks.key} has no optimizer on the "
            f"servers: its value is the sum of round {ks.closed}, not weights, and the sums of the rounds its dead "
            "self finished are gone (the weights live on the workers: update_on_kvstore=False, or a "
            "Horovod-style job). A worker of such a job cannot be restarted into it: start the job again"))

    def _count(self, ks: KeyState, rnd: Round, sender: int, entry: Entry, whole: int) -> list[Reply]:
        """Count one chunk of a worker's push; once ``whole`` arrived, the push is complete."""
        got = rnd.received.get(sender, 0) + entry.length
        rnd.received[sender] = got
        if got < whole:
            return []
        rnd.complete.add(sender)
        rnd.waiters.append(Waiter(sender, entry))
        return self._close_rounds(ks)

    # -- rows ----------------------------------------------------------------------------
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

    def push_rows(self, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        ks = self._rows_key(entry, data.ids)
        if self.members:
            self._check_member(ks, sender)
        if sender in self.closed_workers:
            raise StoreError("PeerLostError", f"{self._who(sender)} already closed its store")
        if self._applied_before(ks, sender, entry):
            return self._answer_again(ks, sender, entry)
        self._caught_up(sender)
        if not self.sync:
            return self._push_rows_async(sender, entry, data, ks)
        rnd = self._round_for(ks, sender, entry.ts)
        if rnd.sent_before(sender, entry):
            return []
        if rnd.rows is None:
            rnd.rows = []
        rnd.rows.append((sender, data))
        rnd.row_len = entry.row_len
        return self._count(ks, rnd, sender, entry, entry.total)    # rows entries count rows

    def _push_rows_async(self, sender: int, entry: Entry, data: Rows, ks: KeyState) -> list[Reply]:
        updater = self.opts.updater(ks.key)
        if updater is None:
            raise StoreError("RuntimeError", "dist_async needs an optimizer on the servers: call "
                                             "kv.set_optimizer(...) before the first push")
        if entry.length != entry.total:
            part = ks.partial.setdefault((sender, entry.ts), [[], 0])
            part[0].append(data)
            part[1] += entry.length
            if part[1] < entry.total:
                return []
            parts = ks.partial.pop((sender, entry.ts))[0]
            data = Rows(np.concatenate([p.ids for p in parts]), np.concatenate([p.values for p in parts]))
        row_len = entry.row_len
        self._writable(ks)
        values = data.values.reshape(-1, row_len).astype(ks.merge_dtype, copy=False)
        updater.update_rows(ks.key, data.ids, values, ks.value.reshape(-1, row_len))
        self._applied_async(ks, sender, entry, "arows", (data.ids.copy(), values.copy()), row_len)
        return self._answer(ks, Waiter(sender, entry))

    def _applied_async(self, ks: KeyState, sender: int, entry: Entry, kind: str, arrays: tuple,
                       info: Any = None) -> None:
        if entry.seq:
            ks.applied[sender] = entry.seq
        if self.journal is not None:
            self.journal.append(Event(kind, ks.key, 0, [sender, entry.seq, info], arrays))

    def pull_rows(self, sender: int, entry: Entry, data: Rows) -> list[Reply]:
        ks = self._rows_key(entry, data.ids)
        waiter = Waiter(sender, entry, data.ids)
        replayed = self._replayed_pull(ks, waiter)
        if replayed is not None:
            return replayed
        for rnd in reversed(ks.rounds):
            if sender in rnd.members:      # wait for this worker's own push to be applied
                rnd.pulls.append(waiter)
                return []
        return self._answer(ks, waiter)

    def _apply_rows(self, ks: KeyState, rnd: Round) -> None:
        """Close a round that holds row-sparse pushes (see the module docstring)."""
        row_len = rnd.row_len
        updater = self.opts.updater(ks.key)
        if rnd.frames:                          # some workers pushed dense: sum dense
            grad = np.zeros(ks.total, ks.merge_dtype)
            for off, pend in rnd.frames.items():
                for frame in by_worker(pend):
                    np.add(grad[off:off + frame.size], frame, out=grad[off:off + frame.size], casting="unsafe")
            rnd.frames = {}
            by_row = grad.reshape(-1, row_len)
            for data in by_worker(rnd.rows):
                by_row[data.ids] += data.values.reshape(-1, row_len)
            self._writable(ks)
            if updater is None:
                np.copyto(ks.value, grad, casting="unsafe")
            else:
                updater(ks.key, grad, ks.value)
            if self.journal is not None:
                self.journal.append(Event("dense", ks.key, 0, None, (grad,)))
            return
        pushes = by_worker(rnd.rows)
        rows = np.unique(np.concatenate([data.ids for data in pushes])).astype(np.int64)
        summed = np.zeros((rows.size, row_len), ks.merge_dtype)
        for data in pushes:                     # in rank order, as dense sums; ids distinct per push
            summed[np.searchsorted(rows, data.ids)] += data.values.reshape(-1, row_len)
        self._writable(ks)
        apply_rows(updater, ks.key, ks.value.reshape(-1, row_len), rows, summed)
        if self.journal is not None:
            self.journal.append(Event("rows", ks.key, 0, row_len, (rows, summed.reshape(-1))))

    def _decompress(self, entry: Entry, data: np.ndarray, ks: KeyState) -> np.ndarray:
        if entry.op & Op.FP16:
            return data                      # merged (or applied) after a cast to the key's dtype
        if not self.compression or self.compression["type"] != "2bit":
            raise StoreError("RuntimeError", f"key {ks.key}: a 2bit-compressed push arrived but the "
                                             "servers have no 2bit compression set")
        return comp.unpack_2bit(data, entry.length, self.compression["threshold"], ks.merge_dtype)

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
        then sum them in one pass (:meth:`_reduce`). A later round's complete chunks wait
        until it is the first open round: rounds change the value in order."""
        pend = rnd.frames.get(off)
        if pend is None:
            pend = rnd.frames[off] = []
        elif pend[0][1].size != n:
            raise StoreError("ProtocolError", f"key {ks.key}: workers cut the value into different chunks")
        pend.append((sender, data))
        plain = not (self.members or self.joins.joined)
        full = len(pend) >= self.num_workers if plain else self._chunk_full(ks, rnd, pend)
        if full and (rnd is ks.rounds[0] or whole_key(self.opts.updater(ks.key))):
            return self._reduce(ks, rnd, off, rnd.frames.pop(off))
        return []

    def _reduce(self, ks: KeyState, rnd: Round, off: int, frames: list) -> list[Reply]:
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
            total = sum_frames(frames, self._scratch_for(n, ks.merge_dtype) if self.journal is None
                         else np.empty(n, ks.merge_dtype))
            if updater is None:
                np.copyto(dst, total, casting="unsafe")
            else:
                updater.update_chunk(ks.key, off, total, ks.value)
        if self.journal is not None:
            self.journal.append(Event("chunk", ks.key, off, None, (total if total.base is None else total.copy(),)))
        # with a backup subscribed (journal), even since the round's pushpulls asked, nothing
        # streams: the backup replays closes, not chunks, so the close answers them whole
        return self._stream(ks, rnd, off, n) if rnd.pulling and self.journal is None else []

    def _stream(self, ks: KeyState, rnd: Round, off: int, n: int) -> list[Reply]:
        """Answer the round's streamed pushpulls (Op.STREAM) with one chunk that will not
        change again this round. At the close a server would otherwise answer a slice only
        once every worker's last chunk arrived, its link idle meanwhile while others wait
        for one straggler (VGG-16's 103 MB slices: seconds); this way the replies follow
        the pushes chunk by chunk. Workers ask for it only across a network: on one machine
        the interleaving cost the Gluon MLP benchmark 9 %. Not while a backup keeps this
        server's replica (``journal``): the close is what it replays. A worker that dies
        mid-round loses its chunks here (``worker_died``): its restart gets them at the close."""
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
        """Room for one chunk's sum; only used inside :meth:`_reduce`, so one buffer serves all keys."""
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

    def _close_rounds(self, ks: KeyState) -> list[Reply]:
        replies: list[Reply] = []
        plain = not (self.members or self.joins.joined)     # the usual case: every worker, nobody joined
        while ks.rounds and (len(ks.rounds[0].complete) >= self.num_workers if plain
                             else self._round_full(ks, ks.rounds[0])):
            rnd = ks.rounds.pop(0)
            ks.closed += 1
            if self.joins.joined:
                self._excuse(ks, rnd)
            self._apply_round(ks, rnd)
            if self.journal is not None:
                self.journal.append(Event("close", ks.key, 0, ks.closed))
            for waiter in rnd.waiters:         # pushes; a pushpull got its chunks as they were summed
                replies += self._answer(ks, waiter, rnd.streamed.get(waiter.worker))
            for waiter in rnd.pulls:
                replies += self._answer(ks, waiter)
            if ks.rounds:                      # chunks the next round completed while it waited
                nxt = ks.rounds[0]
                for off in [o for o, pend in nxt.frames.items()
                            if (len(pend) >= self.num_workers if plain else self._chunk_full(ks, nxt, pend))]:
                    replies += self._reduce(ks, nxt, off, nxt.frames.pop(off))
        return replies + self._fail_doomed(ks)

    def _apply_round(self, ks: KeyState, rnd: Round) -> None:
        if rnd.rows is not None:               # no copy kept: the value may be a whole embedding
            self._apply_rows(ks, rnd)          # table, and its rows are pulled apart from their push
            return
        merged = rnd.merged
        if merged is None:                     # used chunk by chunk already
            return
        self._before_write(ks, ks.closed - 1)
        self.opts.updater(ks.key)(ks.key, merged, ks.value)
        if self.journal is not None:
            self.journal.append(Event("whole", ks.key, 0, None, (merged.copy(),)))
        ks.spare = merged if merged.nbytes <= SPARE_MAX_BYTES else None

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

    def _push_async(self, sender: int, entry: Entry, data: np.ndarray, ks: KeyState) -> list[Reply]:
        ts, key, off, n, total = entry.ts, entry.key, entry.offset, entry.length, entry.total
        updater = self.opts.updater(key)
        if updater is None:
            raise StoreError("RuntimeError", "dist_async needs an optimizer on the servers: call "
                                             "kv.set_optimizer(...) before the first push")
        if n != total:
            part = ks.partial.setdefault((sender, ts), [np.empty(total, ks.merge_dtype), 0])
            part[0][off:off + n] = data
            part[1] += n
            if part[1] < total:
                return []
            data = ks.partial.pop((sender, ts))[0]
        self._writable(ks)
        grad = data.astype(ks.value.dtype, copy=False)
        updater(key, grad, ks.value)
        self._applied_async(ks, sender, entry, "async", (grad.copy(),))
        return self._answer(ks, Waiter(sender, entry))

    # -- pull ----------------------------------------------------------------------------
    def pull(self, sender: int, entry: Entry) -> list[Reply]:
        ks = self._ready_key(entry)
        waiter = Waiter(sender, entry)
        replayed = self._replayed_pull(ks, waiter)
        if replayed is not None:
            return replayed
        for rnd in reversed(ks.rounds):
            if sender in rnd.members:      # wait for this worker's own push to be applied
                rnd.pulls.append(waiter)
                return []
        return self._answer(ks, waiter)

    def _replayed_pull(self, ks: KeyState, waiter: Waiter) -> list[Reply] | None:
        """A restarted worker's pull asks for the value after round ``seq`` (its pushes so
        far), whatever its dead self left in the open rounds (waiting for its membership
        there would hang a restart that pulls before it pushes again: the round needs the
        rest of its push). A round still open: when it closes; the last closed: now; the one
        before: its kept value; older: the latest weights, and a sum is refused
        (``_check_replay``). None: not a replay, answer as for anyone."""
        sender, entry = waiter.worker, waiter.entry
        if not self.sync or sender not in self.replays.replaying:
            return None
        index = entry.seq - ks.closed - 1
        if index >= 0:
            if index < len(ks.rounds):
                ks.rounds[index].pulls.append(waiter)
                return []
            return None                     # a round not begun: as anyone's pull
        self._check_replay(ks, sender, entry.seq)
        kept = ks.kept(entry.seq)
        return self._answer(ks, waiter) if kept is None else answer(kept, waiter, self.chunk_bytes)

    def _answer(self, ks: KeyState, waiter: Waiter, skip: dict[int, int] | None = None) -> list[Reply]:
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
            group = self.members.get(ks.key)
            missing = tuple(w for w in workers if w not in rnd.complete and (group is None or w in group)
                            and not (rnd.joinable and w in self.joins.joined))
            waiting = tuple(sorted(rnd.complete | {p.worker for p in rnd.pulls}))
            found.append(Stall(ks.key, ks.closed + 1, now - rnd.opened, missing, waiting))
        return found

    # -- workers restarting (PS_MAX_RESTARTS) -----------------------------------------------
    def setting_resent(self, worker: int, cid: Any) -> bool:
        """The worker sent this setting (command id ``cid``) again: this server's dead self
        counted it, and died before its answer left (the count came with the replica).
        A worker's commands are numbered from 1 in each incarnation, one at a time."""
        return isinstance(cid, int) and cid <= self.replays.last.get(worker, 0)

    def setting_made_before(self, worker: int, cmd: str, cid: Any = None) -> bool:
        """(Counts it.) A restarted worker's n-th ``cmd`` while it replays its script was made
        by its dead self if that one made n or more. Not "the store has it": a worker killed
        between kv.init and set_optimizer, or before a step's set_params, left them unmade."""
        if worker not in self.replays.replaying:
            return False
        self._replays_event(Event("setting", 0, 0, [worker, cmd, "replayed", cid]))
        return self.replays.replayed[(worker, cmd)] <= self.replays.applied[(worker, cmd)]

    def setting_applied(self, worker: int, cmd: str, cid: Any = None) -> None:
        self._replays_event(Event("setting", 0, 0, [worker, cmd, "applied", cid]))

    def _caught_up(self, worker: int) -> None:
        """It pushed something new: what it sends from now on is no replay."""
        if worker in self.replays.replaying:
            self._replays_event(Event("caught_up", 0, 0, worker))

    def _replays_event(self, event: Event) -> None:
        self.replays.apply(event)
        self.record(event)

    def record(self, event: Event) -> None:
        """Journal a change for the backup, if one subscribed."""
        if self.journal is not None:
            self.journal.append(event)

    def worker_died(self, worker: int) -> None:
        """A worker died and its restart is awaited: the pushes it had begun stay (their
        chunks may be summed already) and its restart sends only the rest (``Round.skip``);
        until it pushes something new, it replays what its dead self did."""
        self._replays_event(Event("died", 0, 0, worker))
        for ks in self.keys.values():
            for key in [k for k in ks.partial if k[0] == worker]:   # async: half-received pushes
                del ks.partial[key]
            for rnd in ks.rounds:
                rnd.pulling.pop(worker, None)       # its restart gets at the close what its dead self was sent
                rnd.streamed.pop(worker, None)
                if worker in rnd.members and worker not in rnd.complete:
                    rnd.members[worker] = DEAD
                    rnd.skip[worker] = rnd.received.get(worker, 0)

    def pushed(self, worker: int) -> dict[int, int]:
        """Per key, the pushes of ``worker`` this store holds whole: where a restart resumes."""
        if self.sync:
            return {k: ks.closed + self._complete_open(ks, worker) for k, ks in self.keys.items()}
        return {k: ks.applied.get(worker, 0) for k, ks in self.keys.items()}

    # -- workers leaving -----------------------------------------------------------------
    def worker_closed(self, worker: int) -> list[Reply]:
        """A worker closed its store: rounds still missing its push can never complete."""
        self.closed_workers.add(worker)
        replies: list[Reply] = []
        for ks in self.keys.values():
            replies += self._fail_doomed(ks)
        return replies

    def _fail_doomed(self, ks: KeyState) -> list[Reply]:
        if not self.closed_workers and not self.joins.joined:   # the common case, on every round close
            return []
        replies: list[Reply] = []
        keep = []
        group = self.members.get(ks.key)
        for rnd in ks.rounds:
            gone = sorted(w for w in self.closed_workers if w not in rnd.members and (group is None or w in group))
            joined = [] if rnd.joinable else sorted(w for w in self.joins.joined if w not in rnd.members
                                                    and (group is None or w in group))
            if gone:
                kind, text = "PeerLostError", (
                    f"the sync round of key {ks.key} can never complete: "
                    f"{', '.join(self._who(w) for w in gone)} closed its store without pushing "
                    "(do all workers run the same number of steps?)")
            elif joined:
                kind, text = "CollectiveError", (
                    f"{', '.join(self._who(w) for w in joined)} joined (hvd.join) and will not push key "
                    f"{ks.key}: while a worker has joined, only sums (allreduce) run, its share zero")
            else:
                keep.append(rnd)
                continue
            unanswered = [Waiter(w, Entry(t, Op.PUSH, ks.key, 0, 0, ks.total, ks.dtype_code))
                          for w, t in rnd.members.items() if w not in rnd.complete]
            for waiter in rnd.waiters + rnd.pulls + unanswered:
                replies.append(self._error(waiter.worker, waiter.entry, kind, text))
        ks.rounds = keep
        return replies

    # -- workers joining (Horovod's join: uneven data) --------------------------------------
    def join(self, worker: int) -> list[Reply]:
        """``worker`` has nothing more to push until every worker joined: rounds pushed
        JOINABLE close without it (its share zero), every other round it is needed in fails.
        Returns the replies of the rounds that close or fail now."""
        self._joins_event(Event("join", 0, 0, worker))
        replies: list[Reply] = []
        for ks in self.keys.values():
            if ks.rounds and ks.rounds[0].joinable:
                rnd = ks.rounds[0]
                for off in [o for o, pend in rnd.frames.items() if self._chunk_full(ks, rnd, pend)]:
                    replies += self._reduce(ks, rnd, off, rnd.frames.pop(off))
                replies += self._close_rounds(ks)
            else:
                replies += self._fail_doomed(ks)
        return replies

    def leave(self, worker: int) -> tuple[int, list[tuple[int, int]]]:
        """Every worker joined; ``worker`` pushes again. Returns the last worker to join, and
        per key the rounds closed without ``worker`` (its next push of the key counts after
        them). The join ends for this store when every joined worker left."""
        if worker not in self.joins.joined and worker in self.joins.left:
            return self.joins.left[worker]      # resent to this server's restart: the same answer
        last = self.joins.order[-1] if self.joins.order else worker
        skipped = [(ks.key, ks.excused.pop(worker)) for ks in self.keys.values() if worker in ks.excused]
        self._joins_event(Event("leave", 0, 0, [worker, last, skipped]))
        return last, skipped

    def _joins_event(self, event: Event) -> None:
        self.joins.apply(event)
        self.record(event)

    @staticmethod
    def _who(worker: int) -> str:
        return f"worker {id_to_rank(worker)} ({node_name(worker)})"

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
        group = frozenset(workers)
        if not group or not group <= set(self._all_workers()):
            raise RuntimeError(f"cannot restrict keys to workers {sorted(id_to_rank(w) for w in workers)}: not a "
                               f"non-empty set of this job's {self.num_workers} workers")
        new = [k for k in keys if self.members.get(k) != group]
        if not new:
            return
        started = sorted(k for k in new if k in self.keys and (self.keys[k].rounds or self.keys[k].closed))
        if started:
            raise RuntimeError(f"cannot restrict keys {started} to workers {sorted(id_to_rank(w) for w in group)}: "
                               "they were pushed already")
        for key in new:
            self.members[key] = group
        self.record(Event("members", 0, 0, [new, sorted(group)]))

    def _all_workers(self) -> list[int]:
        return [worker_id(r) for r in range(self.num_workers)]

    def _merge_dtypes(self, keys: list[int]) -> None:
        for key in keys:                # fp16 keys sum in fp32 under multi_precision
            ks = self.keys[key]
            wide = self.opts.multi_precision(key) and ks.value.dtype == np.float16
            ks.merge_dtype = np.dtype(np.float32) if wide else ks.value.dtype

    # -- recovery ------------------------------------------------------------------------
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
