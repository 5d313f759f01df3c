"""Replication at the job's start (ps/server/replication.py): a primary answers no worker before its
backup holds a first snapshot, so a primary that dies before that loses nothing, and its
backup lets the restart start empty instead of ending the job. The protocol object with a
recording stand-in for the postoffice (the messages are the real ones)."""
from types import SimpleNamespace

import numpy as np

from ps.message import Command, Entry, Message, Op, dtype_code, server_id
from ps.server.replica import decode_events
from ps.server.replication import Replication
from ps.server.store import Store

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
    rep = Replication(po, lambda: "S1", store, answered)
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
    Replication(po, lambda: "S0", Store(2), Answered())
    po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    reply = [m for m in po.sent if m.cmd == Command.FETCH][-1]
    assert reply.body.get("done") is True and not reply.body.get("error"), reply.body


def test_a_restarted_backup_without_a_snapshot_still_refuses():
    """Restarted itself, it cannot know what its primary answered before: refusing is right."""
    po = Post(rank=0, restarted=1)
    Replication(po, lambda: "S0", Store(2), Answered())
    po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    reply = [m for m in po.sent if m.cmd == Command.FETCH][-1]
    assert "has not sent a snapshot yet" in reply.body["error"], reply.body


def test_a_snapshot_cut_short_by_its_senders_death_leaves_the_whole_copy_to_hand_over():
    """S0 keeps S1's copy and hands it to S1's restart, which then sends its own snapshot, key by
    key, and dies halfway. The next restart must get the whole copy, not the half snapshot: it
    is built aside and replaces the copy only once whole. Before, its first part replaced the
    copy, and the next restart recovered one key of two."""
    backup_po = Post(rank=0)
    backup = Replication(backup_po, lambda: "S0", Store(2), Answered())

    def primary(restarted: int):
        po, store = Post(rank=1, restarted=restarted), Store(2, sync=True)
        rep = Replication(po, lambda: "S1", store, Answered())
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
    rep = Replication(po, lambda: "S1", store, answered)

    def change(key):
        store.handle(9, Entry(key, Op.INIT, key, 0, 4, 4, dtype_code(np.float32)), np.ones(4, np.float32))
        rep.send([key])
    change(3)
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 0}, route=b"s0"))
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": rep.seq}, request=False))
    assert answered == [3]
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, {"incarnation": 3}, route=b"s0-restart"))
    assert rep.subscriber is not None and rep.subscriber[1] == b"s0-restart"
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
