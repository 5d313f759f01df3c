"""Server replication (PS_MAX_RESTARTS > 0, two servers or more): the protocol around
ps/server/replica.py's copy.

Servers form a ring (ps/ring.py: rank order, or hosts interleaved): each keeps the copy of
the server before it (its *primary*), and the one after it keeps its own (its *backup*). A
backup asks its primary for a snapshot (SUBSCRIBE); from then on the primary streams every
change of its store (REPLICA) and holds each reply until the backup has acknowledged the
changes made before it: it is the server's outbox (ps/server/replies.py), handing replies on
to the sender once they may leave. So whatever a worker was answered is in the copy: a
primary that dies loses nothing its workers do not still hold and resend.
A restarted server fetches its state from its backup (FETCH) before the scheduler tells
the workers it is back.

Everything here runs on the van's I/O thread, like the store, except :meth:`start`.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, NamedTuple

from .. import ring
from .._timing import Deadline
from ..errors import ProtocolError, PSError
from ..message import Command, Message, node_name, server_id
from ..postoffice import Postoffice
from . import replica
from .events import Event
from .replies import Outbox
from .rounds import Reply
from .store import Store
from .tables import Tables

logger = logging.getLogger(__name__)

NO_SNAPSHOT_YET = "its primary has not sent a snapshot yet"
COPY_WORK = 0.02    # seconds of a copy's queued embedding rows applied after each replica message


class Backup(NamedTuple):
    """A server that subscribed to this one's changes: which incarnation of it (its restart
    count; 0 for the job's first) tells a late word of an older one's death from its own."""

    node: int
    route: bytes | None
    incarnation: int
    holds: bool = False     # it still holds the copy it handed to this server's restart


class Held(NamedTuple):
    """An answer held until the backup acknowledged change number ``seq``: ``send(what)``."""

    seq: int
    send: Callable[[Any], None]
    what: Any


class Replication:
    """The server's outbox when it keeps a backup (:class:`ps.server.replies.Outbox`): replies
    go on to ``sender`` once the backup holds every change made before them."""

    def __init__(self, po: Postoffice, name: Callable[[], str], store: Store, tables: Tables, sender: Outbox):
        self.po, self._name, self.store, self.tables, self.sender = po, name, store, tables, sender
        self.enabled = po.config.max_restarts > 0 and po.num_servers >= 2
        # primary side: the backup that subscribed, and replies held until it acknowledges
        self.subscriber: Backup | None = None
        self._wanted: Backup | None = None
        self.seq = 0
        self.acked = 0
        self._held: collections.deque[Held] = collections.deque()
        self._catch_up_until = 0    # a later subscriber's snapshot: answers wait only once it is whole
        self.bytes_sent = 0
        # backup side: the primary's copy
        self.mirror: replica.Mirror | None = None
        self.mirror_error: str | None = NO_SNAPSHOT_YET
        self._incoming: replica.Mirror | None = None     # a snapshot still arriving
        # primary side, from its start (the job's, or its restart's) until its backup's first
        # snapshot: replies wait here, so a primary that dies before it has a copy has
        # answered nothing, and its restart may start empty (the workers resend everything)
        self._unreplicated: list[Held] = []     # their seq is set once a snapshot went out
        self._first_copy = self.enabled
        # a restarted server: its state, fetched from its backup
        self._fetched = threading.Event()
        self._fetch_events: list[Event] = []
        self._fetch_error: str | None = None
        self._restored_from: int | None = None   # the backup whose copy this restart now holds
        self._handed_to: int | None = None       # backup side: the primary whose restart got our copy
        po.on(Command.REPLICA, self._on_replica)
        po.on(Command.SUBSCRIBE, self._on_subscribe)
        po.on(Command.FETCH, self._on_fetch)
        po.add_node_listener(self._on_node)

    @property
    def name(self) -> str:
        return self._name()

    @property
    def primary(self) -> int:
        return server_id(ring.neighbours(self.po.ring, self.po.rank)[0])

    @property
    def backup(self) -> int:
        return server_id(ring.neighbours(self.po.ring, self.po.rank)[1])

    # -- joining (main thread) ------------------------------------------------------------
    def start(self) -> str | None:
        """After the node table: a restarted server fetches its state; then every server
        subscribes to its primary. Returns why a restarted server cannot recover, if so."""
        if not self.enabled:
            return "the job keeps no replica (DMLC_NUM_SERVER < 2 or PS_MAX_RESTARTS=0)" if self.po.restarted else None
        if self.po.restarted:
            error = self._fetch()
            if error is not None:
                return error
        self.po.links.connect(self.primary)
        self._subscribe(self.primary)
        return None

    def _subscribe(self, primary: int) -> None:
        """Ask for its snapshot and changes, naming which incarnation of this server asks, and
        whether the copy this server handed to the primary's restart is still the one it holds
        (the restart then sends only its changes since, not a snapshot of everything)."""
        holds = self._handed_to == primary and self.mirror is not None and self.mirror.primary == primary
        self._handed_to = None
        self.po.send(Message(Command.SUBSCRIBE, recver=primary,
                             body={"incarnation": self.po.restarted, "holds": holds}))

    def _fetch(self) -> str | None:
        backup = self.backup
        if backup in self.po.down:
            return f"its backup {node_name(backup)} is down too: {self.po.down[backup]}"
        self.po.links.connect(backup)
        self.po.send(Message(Command.FETCH, recver=backup))
        deadline = Deadline(self.po.config.connect_timeout)
        while not self._fetched.wait(deadline.remaining(0.5)):
            if self.po.failure is not None:
                raise self.po.failure
            if deadline.expired:
                return (f"its backup {node_name(backup)} did not send the replica within "
                        f"{deadline.seconds:g}s (PS_CONNECT_TIMEOUT)")
        if self._fetch_error is None:
            store, rows = self.store, sum(len(t.rows) for t in self.tables.tables.values())
            logger.warning("%s recovered %d keys (%.1f MB)%s from the replica on %s", self.name, len(store.keys),
                           store.stats()["bytes"] / 1e6,
                           f" and {len(self.tables.tables)} embedding tables ({rows} rows)" if self.tables.tables else "",
                           node_name(backup))
        return self._fetch_error

    # -- primary side: the outbox ------------------------------------------------------------
    def send(self, replies: list[Reply]) -> None:
        self._after(self.sender.send, replies)

    def send_message(self, msg: Message) -> None:
        self._after(self.sender.send_message, msg)

    def flush(self) -> None:
        """Stream the changes made so far now, not with the next answer (a worker died)."""
        self._after(_nothing, None)

    def _after(self, send: Callable[[Any], None], what: Any) -> None:
        """``send(what)`` (answers to workers) once the backup holds every change made so
        far: stream this handler's changes first, then hold the answer until acknowledged.
        While a backup that came back (a restart) still takes in its snapshot, answers are not
        held: until that snapshot is whole it could not recover this server anyway (this
        server's death then ends the job, as while the backup was down), and its restart's
        snapshot of 10^7 embedding rows takes seconds to replay."""
        store = self.store
        if self.subscriber is not None and store.journal:
            events, store.journal = store.journal, []
            self._send_events(events)
            if self._held or self.acked >= self._catch_up_until:
                self._held.append(Held(self.seq, send, what))
            else:
                send(what)
        elif self._held:
            self._held.append(Held(self.seq, send, what))
        elif self._first_copy and self.backup not in self.po.down:
            self._unreplicated.append(Held(0, send, what))
        else:
            send(what)
        if self._wanted is not None:
            self._try_snapshot()

    def _end_first_copy(self) -> None:
        """No more waiting for a first snapshot: it was sent (the replies held so far go out
        once it is acknowledged), or there will be none (they go out now)."""
        self._first_copy = False
        held, self._unreplicated = self._unreplicated, []
        if self.subscriber is not None:
            self._held.extend(h._replace(seq=self.seq) for h in held)
            self._release()
        else:
            self.store.journal = None       # nobody to send the changes kept since a recovery to
            self._restored_from = None
            for h in held:
                h.send(h.what)

    def _on_subscribe(self, msg: Message) -> None:
        self._restarted(msg)
        body = msg.body if isinstance(msg.body, dict) else {}
        self._wanted = Backup(msg.sender, msg.route, int(body.get("incarnation", 0)), bool(body.get("holds")))
        self._try_snapshot()

    def _try_snapshot(self) -> None:
        """Answer a subscription with a snapshot, but only between rounds: a copy taken while
        a round is half applied (chunk by chunk) would apply that round's first half twice."""
        store = self.store
        if self._wanted is not None and self._wanted.holds and self._wanted.node == self._restored_from:
            self._continue()
            return
        if self._wanted is None or store.half_applied():
            return
        sub, self._wanted = self._wanted, None
        self._restored_from = None
        try:
            events = replica.snapshot(store, self.tables)
        except ValueError as exc:
            logger.warning("%s keeps no replica: %s", self.name, exc)
            self._send(sub, {"seq": 0, "error": str(exc)}, [])
            self._end_first_copy()
            return
        self.subscriber = sub
        store.journal = []
        settings = [e for e in events if e.kind not in replica.BULK]
        keys = [e for e in events if e.kind in replica.BULK]
        self._send_events(settings, reset=True, done=not keys)
        for i, ev in enumerate(keys):
            self._send_events([ev], done=i == len(keys) - 1)
        # the job's first copy must be whole before anything is answered (a primary that dies
        # before it has answered nothing, and its restart may start empty); a later one need not
        self._catch_up_until = 0 if self._first_copy else self.seq
        logger.info("%s: %s now keeps a replica of this server (%d keys, %d embedding tables)", self.name,
                    node_name(sub.node), len(store.keys), len(self.tables.tables))
        self._end_first_copy()

    def _continue(self) -> None:
        """This restart's backup still holds the copy it recovered from: send it the changes
        made since (journaled from the recovery on), not a snapshot of everything (at 10^7
        embedding rows, the difference between seconds and a quarter of a minute)."""
        assert self._wanted is not None
        self.subscriber, self._wanted, self._restored_from = self._wanted, None, None
        events, self.store.journal = self.store.journal or [], []
        self._send_events(events)
        logger.info("%s: %s keeps the copy it handed over; %d changes since sent", self.name,
                    node_name(self.subscriber.node), len(events))
        self._end_first_copy()

    def _send_events(self, events: list[Event], reset: bool = False, done: bool = False) -> None:
        """``reset``: the first part of a snapshot; ``done``: its last."""
        assert self.subscriber is not None
        body, frames = replica.encode_events(events)
        self.seq += 1
        self.bytes_sent += sum(f.nbytes for f in frames)
        self._send(self.subscriber, {"seq": self.seq, "reset": reset, "done": done, "events": body}, frames)

    def _send(self, to: Backup, body: dict, frames: list) -> None:
        self.po.send(Message(Command.REPLICA, recver=to.node, body=body, frames=frames, route=to.route))

    def _release(self) -> None:
        while self._held and self._held[0].seq <= self.acked:
            held = self._held.popleft()
            held.send(held.what)

    # -- backup side ---------------------------------------------------------------------
    def _on_replica(self, msg: Message) -> None:
        body = msg.body if isinstance(msg.body, dict) else {}
        if not msg.request:                               # an acknowledgement, on the primary
            if self.subscriber is not None and msg.sender == self.subscriber.node:
                self.acked = max(self.acked, int(body.get("ack", 0)))
                self._release()
            return
        seq = int(body.get("seq", 0))
        if body.get("error"):
            self.mirror, self._incoming = None, None
            self.mirror_error = f"its primary keeps no replica: {body['error']}"
        elif body.get("reset"):
            # built aside: the copy kept so far (a restart's, maybe) stays the one handed over
            # until this snapshot is whole, in case its sender dies halfway through it
            self._incoming = replica.Mirror(msg.sender)
        # acknowledged before it is applied: from here on the change is in this process, which
        # applies its messages in order, so the primary's replies need not wait for the optimizer
        self.po.send(Message(Command.REPLICA, recver=msg.sender, body={"ack": seq}, request=False))
        target = self._incoming if self._incoming is not None else self.mirror
        if target is None or target.primary != msg.sender:
            return
        try:
            target.apply(replica.decode_events(body.get("events"), msg.frames))
            if target is self.mirror:       # a snapshot still arriving is only queued: see Tables.work
                target.tables.work(COPY_WORK)
        except (ProtocolError, ValueError, TypeError, KeyError) as exc:
            logger.error("%s: the replica of %s is broken: %s", self.name, node_name(msg.sender), exc)
            self.mirror, self._incoming = None, None
            self.mirror_error = f"a change could not be applied to it: {exc}"
            return
        if target is self._incoming and body.get("done"):
            self.mirror, self.mirror_error, self._incoming = target, None, None

    def _restarted(self, msg: Message) -> None:
        """A message from a new incarnation of our subscriber: it died (maybe before the
        scheduler's word of it reached us, which PS_RESEND can delay)."""
        if self.subscriber is not None and self.subscriber.node == msg.sender and self.subscriber.route != msg.route:
            self._drop_subscriber()

    def _drop_subscriber(self) -> None:
        """The backup died: nobody to wait for; answer what was held."""
        assert self.subscriber is not None
        self.po.forget(self.subscriber.route)
        self.subscriber = None
        self.store.journal = None
        self.acked = self.seq
        self._catch_up_until = 0
        self._release()
        self._end_first_copy()

    def _on_fetch(self, msg: Message) -> None:
        if msg.request:
            self._restarted(msg)
            self._hand_over(msg)
            return
        body = msg.body if isinstance(msg.body, dict) else {}
        if body.get("error"):
            self._fetch_error = body["error"]
            self._fetched.set()
            return
        try:
            self._fetch_events += replica.decode_events(body.get("events"), msg.frames)
            if body.get("done"):
                replica.restore(self.store, self._fetch_events, self.tables)
                self._fetch_events = []
                # its changes from now on are kept: if the backup still holds the copy it
                # handed over, they are all it needs (_continue)
                self._restored_from, self.store.journal = msg.sender, []
                self._fetched.set()
        except (ProtocolError, ValueError, TypeError, KeyError) as exc:
            self._fetch_error = f"the replica from {node_name(msg.sender)} could not be restored: {exc}"
            self._fetched.set()

    def _hand_over(self, msg: Message) -> None:
        """A restarted primary asks for its state."""
        def reply(body: dict, frames: list) -> None:
            self.po.send(Message(Command.FETCH, recver=msg.sender, body=body, frames=frames,
                                 request=False, route=msg.route))
        mirror = self.mirror
        if mirror is None and self.mirror_error == NO_SNAPSHOT_YET and not self.po.restarted:
            # it died before its first snapshot, so it answered no worker (it held every
            # reply for that snapshot): its restart starts empty and gets every request again
            reply({"events": [], "done": True}, [])
            logger.warning("%s: %s died before it sent its first snapshot, so it had answered nothing: "
                           "its restart starts empty", self.name, node_name(msg.sender))
            return
        if mirror is None or mirror.primary != msg.sender or mirror.broken:
            why = self.mirror_error or (mirror.broken if mirror is not None and mirror.broken else
                                        f"it keeps the replica of {node_name(mirror.primary)} instead")
            reply({"error": f"{self.name} holds no replica of {node_name(msg.sender)}: {why}"}, [])
            return
        try:
            events = mirror.hand_over()
        except (ProtocolError, ValueError, TypeError, KeyError) as exc:
            reply({"error": f"{self.name} holds no replica of {node_name(msg.sender)}: a change could not be "
                            f"applied to it: {exc}"}, [])
            return
        settings = [e for e in events if e.kind not in replica.BULK]
        keys = [e for e in events if e.kind in replica.BULK]
        parts = [settings, *[[k] for k in keys]]
        for i, part in enumerate(parts):
            body, frames = replica.encode_events(part)
            reply({"events": body, "done": i == len(parts) - 1}, frames)
        # kept until the restart's own snapshot replaces it: a restart holds its replies until
        # then, so if it dies first it answered nothing and this copy is still its state
        self._handed_to = msg.sender
        logger.warning("%s handed the replica of %s (%d keys, %d embedding tables, %.1f MB) to its restart",
                       self.name, node_name(msg.sender), len(mirror.keys), len(mirror.tables.tables),
                       mirror.nbytes() / 1e6)

    # -- membership ----------------------------------------------------------------------
    def _died(self, backup: Backup, node_id: int) -> bool:
        """Whether the death just announced is this backup's, not an older incarnation's whose
        NODE_DOWN came late (its restart's SUBSCRIBE first: dropping that restart would leave
        this server answering workers with no copy kept anywhere)."""
        dead = self.po.dead_incarnation.get(node_id)
        return backup.node == node_id and (dead is None or dead >= backup.incarnation)

    def _on_node(self, node_id: int, up: bool) -> None:
        if not self.enabled:
            return
        if not up:
            if self.subscriber is not None and self._died(self.subscriber, node_id):
                self._drop_subscriber()
            elif node_id == self.backup and self._first_copy:
                self._end_first_copy()      # no copy to wait for until it is back
            if self._wanted is not None and self._died(self._wanted, node_id):
                self._wanted = None
            return
        if node_id == self.primary:        # the primary is back: keep its copy again
            try:
                self._subscribe(node_id)
            except PSError:
                pass


def _nothing(_: Any) -> None:
    """What a flush sends: nothing (it only streams the changes)."""
