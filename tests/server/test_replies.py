"""How a server's replies leave (ps/server/replies.py): per worker, in messages of about
CHUNK_BYTES, on the connection the worker's requests came in on; and where the server hands
them: straight to that sender, unless a backup keeps its replica (then Replication holds them
first, tests/server/test_replication_start.py)."""
from types import SimpleNamespace

import numpy as np
import pytest

from ps.config import Config
from ps.drain import DrainClock
from ps.frames import dtype_code
from ps.keys import CHUNK_BYTES
from ps.message import Command, Entry, Flag, Message, Op
from ps.server import KVServer
from ps.server.bufguard import BufferGuard
from ps.server.replies import ReplySender
from ps.server.rounds import Reply
from ps.van import create_van
from tests.helpers import Clock

W0, W1 = 9, 11
F32 = dtype_code(np.float32)


class Post:
    """What ReplySender uses of a postoffice: its config, a handler, sends."""

    def __init__(self):
        self.config = SimpleNamespace(send_window=0, send_lowat=0, chunk_bytes=CHUNK_BYTES)
        self.handlers, self.sent = {}, []

    def on(self, cmd, handler):
        self.handlers[cmd] = handler

    def send(self, msg):
        self.sent.append(msg)


def test_replies_go_per_worker_in_chunk_sized_messages_on_the_connection_their_request_came_in_on():
    po = Post()
    sender = ReplySender(po, BufferGuard())
    sender.came(Message(Command.DATA, W0, 8, [], route=b"w0"))
    big = np.zeros(CHUNK_BYTES // 4, np.float32)
    pull = Entry(1, Op.PULL, 3, 0, big.size, big.size, F32)
    ack = Entry(2, Op.PUSH, 4, 0, 0, 8, F32)
    sender.send([Reply(W0, pull, big), Reply(W1, ack, None), Reply(W1, ack, None), Reply(W0, pull, big)])
    assert [(m.recver, m.route, len(m.body)) for m in po.sent] == [(W0, b"w0", 1), (W0, b"w0", 1), (W1, None, 2)]
    assert all(m.cmd == Command.DATA and not m.request for m in po.sent)
    sender.send([])
    assert len(po.sent) == 3


def test_a_dead_workers_connection_is_forgotten():
    po = Post()
    forgotten = []
    po.forget = forgotten.append
    sender = ReplySender(po, BufferGuard())
    sender.came(Message(Command.DATA, W0, 8, [], route=b"w0"))
    sender.forget(W0)
    sender.forget(W1)                        # never sent anything: nothing to forget
    assert forgotten == [b"w0"] and W0 not in sender.routes


def server(max_restarts, num_servers):
    return KVServer(Config(role="server", num_servers=num_servers, num_workers=1, max_restarts=max_restarts),
                    van=create_van("inproc"))


def test_the_server_hands_its_replies_straight_to_the_sender_unless_a_backup_keeps_its_replica():
    alone = server(0, 2)
    assert alone.outbox is alone.sender
    one = server(2, 1)                                   # restarts on, but no other server to keep a copy
    assert one.outbox is one.sender
    kept = server(2, 2)
    assert kept.outbox is kept.replication and kept.replication.sender is kept.sender
    assert kept.replication.store is kept.store          # the store it streams, not a getter on the server


def test_a_held_back_reply_is_offered_when_its_connection_should_have_drained_and_not_before():
    """PS_SEND_LOWAT on a server (ps/drain.py): a worker's connection holds more than the
    low-water mark, so its replies wait in the queue. The tick reads the socket when the
    connection is held back, again 1 ms later to measure its rate, and then not until the
    plan says (the passes between skip the read); once the connection has room, the next look
    offers the replies."""
    po = Post()
    po.config = SimpleNamespace(send_window=64 * CHUNK_BYTES, send_lowat=1 << 17, chunk_bytes=CHUNK_BYTES)
    ticks, reads = [], []
    unsent = {W0: 1 << 20}
    po.add_tick = ticks.append

    def read(dest, route):
        reads.append(now.now)
        return unsent[dest]
    po.unsent = read
    sender = ReplySender(po, BufferGuard())
    (tick,) = ticks
    now = Clock(0.0)
    sender.drain = DrainClock(now)
    request = Message(Command.DATA, W0, 8, [Entry(1, Op.PULL, 3, 0, 4, 4, F32)], route=b"w0")
    request.flags = Flag.WINDOWED
    sender.came(request)
    value = np.zeros(1 << 16, np.float32)        # 256 KB a reply
    sender.send([Reply(W0, Entry(1, Op.PULL, 3, 0, value.size, value.size, F32), value)])
    assert po.sent == [] and len(reads) == 1     # held back: the connection holds 1 MB
    assert tick() == pytest.approx(0.001)        # a first look at once, the next in 1 ms
    now.now, unsent[W0] = 0.001, (1 << 20) - 12_500        # draining at 12.5 MB/s
    wait = tick()
    assert len(reads) == 3 and wait == pytest.approx(0.020)       # room ~73 ms away: capped
    for t in (0.005, 0.010, 0.015):               # passes for other messages: no read, no send
        now.now = t
        assert tick() == pytest.approx(0.021 - t)
    assert len(reads) == 3 and po.sent == []
    now.now, unsent[W0] = 0.021, 100_000            # room: the look offers the reply
    assert tick() is None
    assert len(reads) == 4 and [m.recver for m in po.sent] == [W0]
