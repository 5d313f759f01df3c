"""Replication at the job's start (ps/server/replication.py): a primary answers no worker before its
backup holds a first snapshot, so a primary that dies before that loses nothing, and its
backup lets the restart start empty instead of ending the job. The protocol object with a
recording stand-in for the postoffice (the messages are the real ones)."""
from types import SimpleNamespace

import numpy as np

from ps.frames import dtype_code
from ps.message import Command, Entry, Message, Op, server_id
from ps.server.replica import decode_events
from ps.server.replication import Replication
from ps.server.store import Store
from ps.server.tables import Tables

S0, S1 = server_id(0), server_id(1)


class Post:
    """What Replication uses of a server's postoffice: handlers, node listeners, sends."""

    def __init__(self, rank: int, restarted: int = 0):
        self.config = SimpleNamespace(max_restarts=2, connect_timeout=5)
        self.num_servers, self.rank, self.restarted = 2, rank, restarted
        self.ring = [0, 1]
        self.down: dict[int, str] = {}
        self.dead_incarnation: dict[int, int] = {}
        self.handlers, self.listeners, self.sent = {}, [], []
        self.failure = None

    def on(self, cmd, handler):
        self.handlers[cmd] = handler

    def add_node_listener(self, listener):
        self.listeners.append(listener)

    def send(self, msg):
        self.sent.append(msg)

    def connect(self, node_id):
        pass

    def forget(self, peer):
        pass

    def deliver(self, msg):
        self.handlers[msg.cmd](msg)

    def node(self, node_id, up):
        for listener in self.listeners:
            listener(node_id, up)


class Answered(list):
    """Stands for the server's reply sender: what Replication hands on, in order."""

    def send(self, replies):
        self.extend(replies)

    def send_message(self, msg):
        self.append(msg)


def primary_with_one_key():
    po = Post(rank=1)                       # S1: its backup is S0
    store = Store(2, sync=True)
    answered = Answered()
    rep = Replication(po, lambda: "S1", store, Tables(2), answered)
    store.handle(9, Entry(1, Op.INIT, 3, 0, 4, 4, dtype_code(np.float32)), np.ones(4, np.float32))
    rep.send(["init"])
    return po, rep, answered


def test_a_primary_answers_nothing_before_its_backups_first_snapshot_is_acknowledged():
    po, rep, answered = primary_with_one_key()
    assert answered == []                   # no snapshot yet: the reply waits
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, None, route=b"s0"))
    copies = [m for m in po.sent if m.cmd == Command.REPLICA]
    assert copies and answered == []        # the snapshot is out, not yet acknowledged
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": copies[-1].body["seq"]}, request=False))
    assert answered == ["init"]
    rep.send(["next"])                       # from then on, as before: nothing changed, at once
    assert answered == ["init", "next"]


def test_a_primary_whose_backup_died_before_subscribing_answers_at_once():
    po, rep, answered = primary_with_one_key()
    po.down[S0] = "killed"
    po.node(S0, False)
    assert answered == ["init"]


def test_a_backup_that_never_had_a_snapshot_lets_the_restart_start_empty():
    po = Post(rank=0)                       # S0 keeps S1's copy; S1 died before sending one
    Replication(po, lambda: "S0", Store(2), Tables(2), Answered())
    po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    reply = [m for m in po.sent if m.cmd == Command.FETCH][-1]
    assert reply.body.get("done") is True and not reply.body.get("error"), reply.body


def test_a_restarted_backup_without_a_snapshot_still_refuses():
    """Restarted itself, it cannot know what its primary answered before: refusing is right."""
    po = Post(rank=0, restarted=1)
    Replication(po, lambda: "S0", Store(2), Tables(2), Answered())
    po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    reply = [m for m in po.sent if m.cmd == Command.FETCH][-1]
    assert "has not sent a snapshot yet" in reply.body["error"], reply.body


def test_a_snapshot_cut_short_by_its_senders_death_leaves_the_whole_copy_to_hand_over():
    """S0 keeps S1's copy and hands it to S1's restart, which then sends its own snapshot, key by
    key, and dies halfway. The next restart must get the whole copy, not the half snapshot: it
    is built aside and replaces the copy only once whole. Before, its first part replaced the
    copy, and the next restart recovered one key of two."""
    backup_po = Post(rank=0)
    backup = Replication(backup_po, lambda: "S0", Store(2), Tables(2), Answered())

    def primary(restarted: int):
        po, store = Post(rank=1, restarted=restarted), Store(2, sync=True)
        rep = Replication(po, lambda: "S1", store, Tables(2), Answered())
        for key, fill in ((3, 1.0), (5, 2.0)):
            store.handle(9, Entry(key, Op.INIT, key, 0, 4, 4, dtype_code(np.float32)), np.full(4, fill, np.float32))
        po.deliver(Message(Command.SUBSCRIBE, S0, S1, None, route=b"s0"))
        return [m for m in po.sent if m.cmd == Command.REPLICA]

    def to_backup(messages):
        for m in messages:
            backup_po.deliver(Message(Command.REPLICA, S1, S0, m.body, frames=m.frames, route=b"s1"))

    def hand_over():
        backup_po.sent.clear()
        backup_po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
        parts = [m for m in backup_po.sent if m.cmd == Command.FETCH]
        assert parts and parts[-1].body.get("done") and not any(p.body.get("error") for p in parts), parts
        return sorted(ev.key for p in parts for ev in decode_events(p.body["events"], p.frames) if ev.kind == "key")

    first = primary(restarted=0)
    assert len(first) == 3 and first[0].body["reset"]     # the settings, then a message per key
    to_backup(first)
    assert hand_over() == [3, 5]
    to_backup(primary(restarted=1)[:2])          # the restart's snapshot: reset, key 3, then it died
    assert hand_over() == [3, 5]
    assert backup.mirror is not None and sorted(backup.mirror.keys) == [3, 5]
    assert first[-1].body.get("done") and not any(m.body.get("done") for m in first[:-1])


def test_a_late_word_of_its_backups_old_death_does_not_drop_the_restart_that_subscribed():
    """S0 (S1's backup) dies; its restart's SUBSCRIBE reaches S1 before the NODE_DOWN of the dead
    one (the scheduler admits a restart after 5 s even if S1 has not acknowledged). That late
    NODE_DOWN names the incarnation that died: S1 keeps its new backup and goes on holding its
    replies for it. Before, S1 dropped it and answered workers with no copy kept anywhere."""
    po = Post(rank=1)
    store = Store(2, sync=True)
    answered = Answered()
    rep = Replication(po, lambda: "S1", store, Tables(2), answered)

    def change(key):
        store.handle(9, Entry(key, Op.INIT, key, 0, 4, 4, dtype_code(np.float32)), np.ones(4, np.float32))
        rep.send([key])
    change(3)
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 0}, route=b"s0"))
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))
    assert answered == [3]
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 3}, route=b"s0-restart"))
    assert rep.subscriber is not None and rep.subscriber[1] == b"s0-restart"
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))    # its snapshot is whole
    po.down[S0], po.dead_incarnation[S0] = "killed", 0
    po.node(S0, False)                                   # the old one's death, late
    assert rep.subscriber is not None and rep.subscriber[1] == b"s0-restart"
    change(5)
    assert answered == [3]                               # held for the new backup's acknowledgement
    assert [m.route for m in po.sent if m.cmd == Command.REPLICA][-1] == b"s0-restart"
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))
    assert answered == [3, 5]
    po.dead_incarnation[S0] = 3
    po.node(S0, False)                                   # the restart's own death: dropped
    assert rep.subscriber is None


def _init(store, key, fill=1.0):
    store.handle(9, Entry(key, Op.INIT, key, 0, 4, 4, dtype_code(np.float32)), np.full(4, fill, np.float32))


def _between(src_po, dst_po, cmd, route):
    """Deliver what ``src_po`` sent of ``cmd`` to ``dst_po``, as from ``route``; clear them."""
    sent = [m for m in src_po.sent if m.cmd == cmd]
    src_po.sent[:] = [m for m in src_po.sent if m.cmd != cmd]
    for m in sent:
        dst_po.deliver(Message(cmd, m.sender if m.sender is not None else None, m.recver, m.body,
                               frames=m.frames, request=m.request, route=route))
    return sent


def test_a_restart_whose_backup_kept_the_copy_sends_it_only_the_changes_since():
    """S1 dies; S0 hands its copy to S1's restart and keeps it. When S0 subscribes to the
    restart it says so, and the restart sends only what changed since it recovered (here a key
    made meanwhile), not a snapshot of everything; its held answer goes out on the ack."""
    backup_po, backup_store = Post(rank=0), Store(2)
    backup = Replication(backup_po, lambda: "S0", backup_store, Tables(2), Answered())
    po, store = Post(rank=1), Store(2, sync=True)
    Replication(po, lambda: "S1", store, Tables(2), Answered())
    for key in (3, 5):
        _init(store, key)
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 0}, route=b"s0"))
    for m in [m for m in po.sent if m.cmd == Command.REPLICA]:
        backup_po.deliver(Message(Command.REPLICA, S1, S0, m.body, frames=m.frames, route=b"s1"))
    assert sorted(backup.mirror.keys) == [3, 5]
    # S1 dies; its restart fetches
    po2, store2, answered = Post(rank=1, restarted=1), Store(2, sync=True), Answered()
    restart = Replication(po2, lambda: "S1", store2, Tables(2), answered)
    backup_po.sent.clear()
    backup_po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    for m in [m for m in backup_po.sent if m.cmd == Command.FETCH]:
        po2.deliver(Message(Command.FETCH, S0, S1, m.body, frames=m.frames, request=False))
    assert sorted(store2.keys) == [3, 5]
    _init(store2, 7, 2.0)                  # a change before its backup subscribes: held
    restart.send(["answer 7"])
    assert answered == []
    backup_po.sent.clear()
    backup_po.node(S1, True)               # the restart is back: S0 subscribes, holding the copy
    [sub] = [m for m in backup_po.sent if m.cmd == Command.SUBSCRIBE]
    assert sub.body["holds"] is True
    po2.deliver(Message(Command.SUBSCRIBE, S0, S1, sub.body, route=b"s0"))
    [cont] = [m for m in po2.sent if m.cmd == Command.REPLICA]
    events = decode_events(cont.body["events"], cont.frames)
    assert not cont.body["reset"] and [(e.kind, e.key) for e in events] == [("init", 7)]
    backup_po.deliver(Message(Command.REPLICA, S1, S0, cont.body, frames=cont.frames, route=b"s1-restart"))
    assert sorted(backup.mirror.keys) == [3, 5, 7]
    po2.deliver(Message(Command.REPLICA, S0, S1, {"ack": cont.body["seq"]}, request=False))
    assert answered == ["answer 7"]
    # a second subscription (not holding) would get a whole snapshot again
    backup_po.sent.clear()
    backup_po.node(S1, True)
    assert [m.body["holds"] for m in backup_po.sent if m.cmd == Command.SUBSCRIBE] == [False]


def test_while_a_restarted_backup_takes_in_its_snapshot_answers_are_not_held():
    """It could not recover this server before its snapshot is whole, so holding answers for it
    would only stall the workers (seconds, for 10^7 embedding rows); once it is whole they are."""
    po, store, answered = Post(rank=1), Store(2, sync=True), Answered()
    rep = Replication(po, lambda: "S1", store, Tables(2), answered)
    _init(store, 3)
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 0}, route=b"s0"))
    _init(store, 4)
    rep.send(["first"])                    # a change after the job's first copy: held for its ack
    assert answered == []
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))
    assert answered == ["first"]
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 1}, route=b"s0-restart"))
    _init(store, 5)
    rep.send(["during"])
    assert answered == ["first", "during"]
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))
    _init(store, 7)
    rep.send(["after"])
    assert answered == ["first", "during"]
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))
    assert answered == ["first", "during", "after"]
