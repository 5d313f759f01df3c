"""KVWorker: turns one key operation into per-server messages; its Customer tracks the replies.

Each operation gets a timestamp; its value is cut by the key's slices (``keys.plan``)
and each slice into chunks of ``PS_CHUNK_BYTES``; entries for one server are packed into messages of
about ``PS_CHUNK_BYTES`` so that large tensors stream while many small keys share messages.
A full box leaves at once; the rest is flushed by the van's I/O thread once it has run what
was queued before, so a burst of small calls travels together without waiting on a timer.
"""
from __future__ import annotations

import functools
import itertools
import logging
import threading
from typing import Any, Callable, NamedTuple

import numpy as np

from ._timing import POLL, Deadline
from .customer import Customer, Handle, Request, StallWatch
from .drain import DrainClock
from .errors import PSError, RemoteError
from .keys import Slice, chunks
from .frames import DTYPES, ROW_ID, Batch, Rows
from .message import Command, Entry, Flag, Message, Op, node_name, server_id
from .nodestats import latency
from .postoffice import Postoffice
from .sendqueue import SendQueue

logger = logging.getLogger(__name__)

PUSHPULL = Op.PUSH | Op.PULL


class TablePart(NamedTuple):
    """An embedding-table request's share for one server: its ids (int64), and for a push
    their gradient rows; ``first``: where its rows start among the request's (a pull's ``out``)."""

    server: int
    ids: np.ndarray
    values: np.ndarray | None = None
    first: int = 0


class Joined(NamedTuple):
    """What :meth:`KVStore.join` returns."""

    last: int                   # the rank of the last worker to join
    skipped: dict[int, int]     # server key -> rounds that closed without this worker


class KVWorker:
    """Owns its Customer (as in ps-lite): requests go out here, replies come back to it."""

    def __init__(self, po: Postoffice):
        self.po = po
        self.customer = Customer(keep=po.config.max_restarts > 0)
        self._watch = StallWatch(po.config.stall_warning, lambda: po.stall_noticed)
        self._push_seq: dict[int, int] = {}    # key -> pushes so far (Entry.seq)
        self._seq_start = 0                    # a restarted worker that resumed: its round
        self._pushes = 0                       # pushes made (PS_DEADLOCK_CHECK: has this worker moved?)
        self._outbox: dict[int, Batch] = {}   # server id -> what waits to leave for it
        window = po.config.send_window
        self._chunk = po.config.chunk_bytes    # PS_CHUNK_BYTES: a message's payload, about
        self._queue = SendQueue(window, po.config.send_lowat, chunk_bytes=self._chunk) if window else None
        self.credits = 0                       # CREDIT messages received (transport_stats)
        self._lock = threading.RLock()
        self._flush_scheduled = False
        self._alone_out = False                # an entry left alone (_leaves_alone), no reply since
        self.on_flush: Callable[[], None] | None = None    # queued requests left together (a timeline's cycles)
        self._cmd_ids = itertools.count(1)
        self._cmd_waiters: dict[int, tuple[threading.Event, dict[int, Any]]] = {}
        self._cmd_sent: dict[int, tuple[list[int], dict[str, Any]]] = {}
        self.drain = DrainClock()              # when the tick looks again at full sockets
        if self._queue is not None and po.config.send_lowat:
            po.add_tick(self._tick)
        po.on(Command.DATA, self._on_reply)
        po.on(Command.SERVER_CMD, self._on_command_reply)
        po.on(Command.CREDIT, self._on_credit)
        po.add_failure_listener(self.customer.fail_all)
        po.add_node_listener(self._on_node)
        po.stats.add(self._report)

    def request(self, op: int, key: int, slices: tuple[Slice, ...], code: int, value: np.ndarray | None,
                out: np.ndarray | None, what: str,
                encode: Callable[[np.ndarray], np.ndarray] | None = None, priority: int = 0) -> Request:
        """Queue one operation on a key (flat ``value``/``out``); returns its Request.

        ``encode`` turns each chunk of ``value`` into its wire form (compression); a higher
        ``priority`` leaves earlier under PS_SEND_WINDOW.
        """
        pulls = bool(op & Op.PULL)
        remaining = sum(s.size for s in slices) if pulls else len(slices)
        req = self.customer.new_request(remaining, out, {server_id(s.server): s.start for s in slices}, what)
        ts = req.ts
        itemsize = DTYPES[code].itemsize
        pushpull = op & PUSHPULL == PUSHPULL
        with self._lock:
            seq = req.seq = self._next_seq(op, key)
            req.key = key
            for s in slices:
                sid = server_id(s.server)
                if value is None:
                    self._emit(sid, Entry(ts, op, key, 0, s.size, s.size, code, None, 0, seq, priority), None, req,
                               priority)
                    continue
                # across a network the reply to a pushpull follows its pushes chunk by chunk;
                # on this machine, where there is no link to fill, interleaving them only costs
                sop = op | Op.STREAM if pushpull and self.po.links.over_network(sid) else op
                piece = value[s.start:s.start + s.size]
                for off, n in chunks(s.size, itemsize, self._chunk):   # the key's dtype: same cut for every encoding
                    chunk = piece[off:off + n]
                    self._emit(sid, Entry(ts, sop, key, off, n, s.size, code, None, 0, seq, priority),
                               chunk if encode is None else encode(chunk), req, priority)
        return req

    def _next_seq(self, op: int, key: int) -> int:
        """A push's number among this worker's pushes to ``key`` (under the lock: in send order).
        A pull's is the pushes so far, the round whose value it asks for: a server answers a
        restarted worker's pull by it (``Store.pull``), so one that jumped ahead with
        ``resume()`` gets the current value even of a key whose value is a round's sum."""
        done = self._push_seq.get(key, self._seq_start)
        if not op & Op.PUSH:
            return done
        seq = self._push_seq[key] = done + 1
        self._pushes += 1
        return seq

    def _report(self) -> dict[str, Any]:
        """Its part of the heartbeat's report: requests out, round trips, and its step (the
        pushes of its most-pushed key: a training step pushes every key once)."""
        step = max(self._push_seq.values(), default=0)
        return {"in_flight": self.customer.in_flight, "step": step, **latency(self.customer.latency)}

    def push_counts(self) -> tuple[dict[int, int], int]:
        """Per key, the pushes made so far (sync rounds this worker is in), and a number that
        changes with every push (PS_DEADLOCK_CHECK's reports)."""
        with self._lock:
            return dict(self._push_seq), self._pushes

    def restart_rounds(self, closed: dict[int, int]) -> None:
        """The servers dropped every open round (a deadlock verdict): number the next push of
        each of these keys after the ``closed[key]`` rounds that did close."""
        with self._lock:
            self._push_seq.update(closed)

    def fail_pending(self, exc: PSError) -> None:
        """End every outstanding request with ``exc``; the worker goes on (a deadlock verdict)."""
        self.customer.fail_pending(exc)

    def join(self, rank: int, settle: Deadline, deadline: Deadline) -> Joined:
        """KVStore.join's protocol: this worker's last requests end (within ``settle``; a refused
        one is its own handle's to report), every server is told, every worker meets at a
        barrier (within ``deadline``), the servers say which rounds closed without it, and a
        second barrier keeps anyone from pushing before every worker left the join."""
        self.wait_all(settle, errors=False)
        self.command("join", {"rank": rank})
        self.po.barrier("workers", deadline=deadline, what="every worker to join (kv.join)", watched=False)
        answers = self.command("leave", {"rank": rank})
        skipped: dict[int, int] = {}
        for answer in answers.values():
            for key, rounds in answer["skipped"]:
                skipped[int(key)] = max(skipped.get(int(key), 0), int(rounds))
            for key, rounds in answer.get("tables", ()):      # embedding tables: where they got to
                with self._lock:
                    behind = int(rounds) - self._push_seq.get(int(key), self._seq_start)
                if behind > 0:
                    skipped[int(key)] = max(skipped.get(int(key), 0), behind)
        self.skip_rounds(skipped)
        self.po.barrier("workers", what="every worker to leave the join (kv.join)", watched=False)
        return Joined(int(answers[min(answers)]["last"]), skipped)

    def watch_waits(self, waits: Any) -> None:
        """Report this worker's long waits to ``waits`` (ps/waitreport.py) from now on."""
        self._watch = self._watch._replace(waits=waits)

    def skip_rounds(self, rounds: dict[int, int]) -> None:
        """The servers closed ``rounds[key]`` rounds of each key without this worker (it had
        joined): its next push of the key counts after them."""
        with self._lock:
            for key, n in rounds.items():
                self._push_seq[key] = self._push_seq.get(key, self._seq_start) + n

    def resume(self, round_: int) -> None:
        """Number the next push to every key ``round_ + 1`` (a restarted worker skipping ahead)."""
        with self._lock:
            self._seq_start = round_
            self._push_seq = {k: max(v, round_) for k, v in self._push_seq.items()}

    def request_rows(self, op: int, key: int, slices: tuple[Slice, ...], code: int, row_len: int,
                     rows: np.ndarray, values: np.ndarray | None, out: np.ndarray | None, what: str,
                     priority: int = 0) -> Request:
        """Queue a row-sparse push (``values``: one row per id) or pull (into flat ``out``)
        of the sorted, distinct global ``rows``; each server gets the ids of its own rows.

        A push goes to every server of the key, with no rows where it has none: a sync
        round counts one push per worker. A pull asks only the servers that hold rows, so
        the caller makes no request for no rows.
        """
        op |= Op.ROWS
        parts = []
        for s in slices:
            first, end = s.start // row_len, (s.start + s.size) // row_len
            lo, hi = np.searchsorted(rows, (first, end))
            if op & Op.PUSH or hi > lo:
                parts.append((server_id(s.server), first, int(lo), int(hi)))
        if op & Op.PUSH:
            req = self.customer.new_request(len(parts), None, {sid: 0 for sid, *_ in parts}, what)
        else:
            req = self.customer.new_request(len(rows) * row_len, out,
                                            {sid: lo * row_len for sid, _, lo, _ in parts}, what)
        per_chunk = max(1, self._chunk // (row_len * DTYPES[code].itemsize))
        with self._lock:
            seq = req.seq = self._next_seq(op, key)
            req.key = key
            for sid, first, lo, hi in parts:
                ids = (rows[lo:hi] - first).astype(ROW_ID)
                n = hi - lo
                if not op & Op.PUSH:
                    self._emit(sid, Entry(req.ts, op, key, 0, n, n, code, None, row_len, seq, priority), Rows(ids),
                               req, priority)
                    continue
                for off in range(0, max(n, 1), per_chunk):
                    m = min(per_chunk, n - off)
                    self._emit(sid, Entry(req.ts, op, key, off, m, n, code, None, row_len, seq, priority),
                               Rows(ids[off:off + m], values[lo + off:lo + off + m].reshape(-1)), req, priority)
        return req

    def request_table(self, op: int, key: int, code: int, row_len: int, parts: list[TablePart],
                      out: np.ndarray | None, what: str, priority: int = 0, ahead: int = 0) -> Request:
        """Queue an embedding table's push (each part's ``values``: a row per id) or pull (into
        flat ``out``, the parts' rows one after another) of int64 ids (ps/embed/client.py
        says which server holds which). A push goes to every part it is given, empty ones too:
        a sync round counts one push per worker. A pull carries this worker's pushes so far plus
        ``ahead`` (an ssp table's server answers by it)."""
        op |= Op.TABLE
        if op & Op.PUSH:
            req = self.customer.new_request(len(parts), None, {server_id(p.server): 0 for p in parts}, what)
        else:
            req = self.customer.new_request(sum(len(p.ids) for p in parts) * row_len, out,
                                            {server_id(p.server): p.first * row_len for p in parts}, what)
        per_chunk = max(1, self._chunk // (row_len * DTYPES[code].itemsize))
        with self._lock:
            seq = req.seq = self._next_seq(op, key) + ahead
            req.key = key
            for part in parts:
                sid, n = server_id(part.server), len(part.ids)
                # in chunks of about PS_CHUNK_BYTES of rows both ways (offset/length/total count rows);
                # a push to every server it is given, empty or not
                for off in range(0, max(n, 1), per_chunk):
                    m = min(per_chunk, n - off)
                    values = None if not op & Op.PUSH else part.values[off:off + m].reshape(-1)
                    self._emit(sid, Entry(req.ts, op, key, off, m, n, code, None, row_len, seq, priority),
                               Rows(part.ids[off:off + m], values), req, priority)
        return req

    def _emit(self, sid: int, entry: Entry, data: np.ndarray | Rows | None, req: Request | None = None,
              priority: int | None = None) -> None:
        """``priority`` None: not through the send queue (a resend to a restarted server)."""
        if req is not None and req.sent is not None:
            # no copy: a pushed array must not change until its push is answered (KVStore.push)
            req.sent.append((sid, entry, data))
        if self._queue is not None and priority is not None and self.po.links.over_network(sid):
            self._queue.add(priority, sid, entry, data, entry.ts)
            self._schedule_flush()
            return
        box = self._outbox.get(sid)
        if box is None:
            if self._leaves_alone(sid, entry, data):
                if req is not None and len(req.starts) == 1 and req.sent is None:
                    # its reply is read by the thread that waits for it (Request.reader)
                    req.reader = functools.partial(self.po.read_here, sid, req.event.is_set,
                                                   mine=self.customer.answers_alone)
                return
            self._schedule_flush()
            box = self._outbox[sid] = Batch()
        if box.add(entry, data) >= self._chunk:
            self._send(sid, self._outbox.pop(sid))

    def _leaves_alone(self, sid: int, entry: Entry, data: np.ndarray | Rows | None) -> bool:
        """Send the entry at once from the caller's thread if its request is the only one
        outstanding, nothing is boxed or went alone since the last reply, and the van can
        write it here (a stream to a server on this machine, :meth:`ZmqVan.send_now`). A
        call alone (one key, then a wait) then leaves without waking the I/O thread; the
        rest of a burst, and of a request of several entries, is batched as before."""
        if self._alone_out or self._outbox or self._flush_scheduled or self.customer.in_flight > 1 \
                or self.po.links.over_network(sid):
            return False
        box = Batch()
        box.add(entry, data)
        if not self.po.send_now(_message(sid, box)):
            return False
        self._alone_out = True
        return True

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            # after what the I/O thread already has queued (on it too): requests that
            # MXNet's engine hands over in one burst leave together, one message per
            # server. (The flush takes self._lock, held here: it cannot run before the flag.)
            self.po.call_later(self.flush)
            self._flush_scheduled = True

    def flush(self) -> None:
        """Send what the boxes hold, under the lock: messages leave (or enter the I/O
        thread's queue) in the order their entries were made, whichever thread flushes."""
        with self._lock:
            self._flush_scheduled = False
            boxes, self._outbox = self._outbox, {}
            for sid, box in boxes.items():
                self._send(sid, box)
            if self._queue is not None:
                self._send_queued()
        on_flush = self.on_flush          # read once: a timeline may stop meanwhile
        if on_flush is not None:
            on_flush()

    def _send(self, sid: int, box: Batch, flags: int = 0) -> None:
        self.po.send(_message(sid, box, flags))

    def _send_queued(self) -> None:
        """What the send window has room for, most urgent first (under the lock)."""
        for out in self._queue.take(self.po.unsent):
            self._send(out.dest, out.batch, Flag.WINDOWED | (Flag.CREDIT if out.credit else 0))

    def _tick(self) -> float | None:
        """On the I/O thread after each pass: requests held back for a full socket leave
        once it drained; when to look again (ps/drain.py), None while nothing is held back."""
        if not self._queue.blocked:     # the usual pass: nothing held back, no lock taken
            return None
        with self._lock:                # the caller's thread may take meanwhile
            return self.drain.tick(self._queue, self._send_queued)

    def _on_reply(self, msg: Message) -> None:
        self._alone_out = False
        self.po.credit(msg)
        self.customer.on_reply(msg)

    def _on_credit(self, msg: Message) -> None:
        if self._queue is None or not isinstance(msg.body, int):
            return
        self.credits += 1
        with self._lock:
            self._queue.credit(msg.sender, msg.body)
            if len(self._queue):
                self._send_queued()

    # -- a server restarted (PS_MAX_RESTARTS) --------------------------------------------
    def _on_node(self, node_id: int, up: bool) -> None:
        """A restarted server is back with its state as of its last replicated change:
        resend everything it has not answered; it answers what it already applied."""
        if node_id not in self.po.server_ids:
            return
        if self._queue is not None:
            with self._lock:
                self._queue.forget(node_id)     # nothing on the way to it will be credited
        if not up:
            return
        requests = [r for r in self.customer.pending() if node_id in r.pending and r.sent is not None]
        with self._lock:
            for req in requests:
                for entry, data in req.restart(node_id):
                    self._emit(node_id, entry, data)
            self.flush()
        for cid, (servers, body) in list(self._cmd_sent.items()):
            waiter = self._cmd_waiters.get(cid)
            if waiter is not None and node_id in servers and node_id not in waiter[1]:
                self.po.send(Message(Command.SERVER_CMD, recver=node_id, body=body))
        if requests:
            logger.warning("%s: resent %d unanswered request(s) to %s", self.po, len(requests), node_name(node_id))

    # -- waiting -------------------------------------------------------------------------
    def handle(self, requests: list[Request], finalize: Callable[[], Any]) -> Handle:
        """The future of one call made of ``requests``."""
        return Handle(requests, finalize, self.po.config.request_timeout, lambda: self.po.failure,
                      self.customer, self._watch)

    def wait_all(self, deadline: Deadline, errors: bool = True) -> None:
        """Wait for every request this worker still has outstanding. ``errors=False``: a
        request a server refused does not raise here (its own handle reports it)."""
        for req in self.customer.pending():
            try:
                req.wait(deadline, lambda: self.po.failure, self._watch)
            except PSError:
                if errors or req.error is None:
                    raise

    def fail_all(self, exc: PSError) -> None:
        """End every outstanding request with ``exc`` (nobody waits on it forever)."""
        self.customer.fail_all(exc)

    # -- server commands (optimizer, learning rate, states) --------------------------------
    def command(self, cmd: str, payload: dict[str, Any] | None = None, servers: list[int] | None = None,
                timeout: float | None = None) -> dict[int, Any]:
        """Send ``cmd`` to servers and wait for every answer; {server id: result}."""
        servers = self.po.server_ids if servers is None else servers
        cid = next(self._cmd_ids)
        event, results = threading.Event(), {}
        self._cmd_waiters[cid] = (event, results)
        body = {"id": cid, "cmd": cmd, **(payload or {})}
        self._cmd_sent[cid] = (servers, body)
        try:
            for sid in servers:
                self.po.send(Message(Command.SERVER_CMD, recver=sid, body=body))
            deadline = Deadline(timeout or self.po.config.request_timeout or None)
            deadline.paused()
            while len(results) < len(servers):
                event.wait(deadline.remaining(POLL))
                event.clear()
                deadline.paused()
                if self.po.failure is not None:
                    raise self.po.failure
                deadline.check(f"servers to answer {cmd!r} ({len(results)}/{len(servers)} answered)")
        finally:
            self._cmd_waiters.pop(cid, None)
            self._cmd_sent.pop(cid, None)
        for sid, reply in results.items():
            if reply.get("error"):
                kind, text = reply["error"]
                raise RemoteError(f"server command {cmd!r}: {text}", kind, node_name(sid))
        return {sid: reply.get("result") for sid, reply in results.items()}

    def _on_command_reply(self, msg: Message) -> None:
        body = msg.body if isinstance(msg.body, dict) else {}
        waiter = self._cmd_waiters.get(body.get("id"))
        if waiter is not None:
            waiter[1][msg.sender] = body
            waiter[0].set()


def _message(sid: int, box: Batch, flags: int = 0) -> Message:
    msg = Message(Command.DATA, recver=sid, body=box.entries, frames=box.frames)
    msg.flags = flags
    return msg
