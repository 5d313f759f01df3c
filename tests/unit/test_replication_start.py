"""Replication at the job's start (ps/replication.py): a primary answers no worker before its
backup holds a first snapshot, so a primary that dies before that loses nothing, and its
backup lets the restart start empty instead of ending the job. The protocol object with a
recording stand-in for the postoffice (the messages are the real ones)."""
from types import SimpleNamespace

import numpy as np

from ps.message import Command, Entry, Message, Op, dtype_code, server_id
from ps.replication import Replication
from ps.store import Store

S0, S1 = server_id(0), server_id(1)


class Post:
    """What Replication uses of a server's postoffice: handlers, node listeners, sends."""

    def __init__(self, rank: int, restarted: int = 0):
        self.config = SimpleNamespace(max_restarts=2, connect_timeout=5)
        self.num_servers, self.rank, self.restarted = 2, rank, restarted
        self.ring = [0, 1]
        self.down: dict[int, str] = {}
        self.handlers, self.listeners, self.sent = {}, [], []
        self.van = SimpleNamespace(forget=lambda peer: None)
        self.failure = None

    def on(self, cmd, handler):
        self.handlers[cmd] = handler

    def add_node_listener(self, listener):
        self.listeners.append(listener)

    def send(self, msg):
        self.sent.append(msg)

    def connect(self, node_id):
        pass

    def deliver(self, msg):
        self.handlers[msg.cmd](msg)

    def node(self, node_id, up):
        for listener in self.listeners:
            listener(node_id, up)


def primary_with_one_key():
    po = Post(rank=1)                       # S1: its backup is S0
    store = Store(2, sync=True)
    rep = Replication(po, lambda: "S1", lambda: store)
    store.handle(9, Entry(1, Op.INIT, 3, 0, 4, 4, dtype_code(np.float32)), np.ones(4, np.float32))
    answered = []
    rep.after(lambda: answered.append("init"))
    return po, rep, answered


def test_a_primary_answers_nothing_before_its_backups_first_snapshot_is_acknowledged():
    po, rep, answered = primary_with_one_key()
    assert answered == []                   # no snapshot yet: the reply waits
    po.deliver(Message(Command.SUBSCRIBE, S0, S1, None, route=b"s0"))
    copies = [m for m in po.sent if m.cmd == Command.REPLICA]
    assert copies and answered == []        # the snapshot is out, not yet acknowledged
    po.deliver(Message(Command.REPLICA, S0, S1, {"ack": copies[-1].body["seq"]}, request=False))
    assert answered == ["init"]
    rep.after(lambda: answered.append("next"))   # from then on, as before: nothing changed, at once
    assert answered == ["init", "next"]


def test_a_primary_whose_backup_died_before_subscribing_answers_at_once():
    po, rep, answered = primary_with_one_key()
    po.down[S0] = "killed"
    po.node(S0, False)
    assert answered == ["init"]


def test_a_backup_that_never_had_a_snapshot_lets_the_restart_start_empty():
    po = Post(rank=0)                       # S0 keeps S1's copy; S1 died before sending one
    Replication(po, lambda: "S0", lambda: Store(2))
    po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    reply = [m for m in po.sent if m.cmd == Command.FETCH][-1]
    assert reply.body.get("done") is True and not reply.body.get("error"), reply.body


def test_a_restarted_backup_without_a_snapshot_still_refuses():
    """Restarted itself, it cannot know what its primary answered before: refusing is right."""
    po = Post(rank=0, restarted=1)
    Replication(po, lambda: "S0", lambda: Store(2))
    po.deliver(Message(Command.FETCH, S1, S0, None, route=b"s1-restart"))
    reply = [m for m in po.sent if m.cmd == Command.FETCH][-1]
    assert "has not sent a snapshot yet" in reply.body["error"], reply.body
