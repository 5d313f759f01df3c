"""ReliableVan (PS_RESEND) over the in-process van: acks, resends, order, duplicates, lost peers."""
import subprocess
import threading
import time

import pytest

from ps.message import Command, Message
from ps.van import create_van
from ps.van.reliable import ReliableVan
from tests.helpers import PYTHON, ROOT

pytestmark = pytest.mark.process


A_ID, B_ID = 9, 8


class Pair:
    """Van A (a worker) sends to van B (a server); ``drop`` decides which arrivals B loses."""

    def __init__(self, drop=lambda msg: False, timeout=0.05, give_up=30.0, clock=time.monotonic):
        self.received: list[Message] = []
        self.arrived = threading.Condition()
        self.a = ReliableVan(create_van("inproc"), timeout, give_up, clock=clock)
        self.b = ReliableVan(create_van("inproc", drop=drop), timeout, give_up)
        b_addr = self.b.start(self._on_b, "reliable-test", name="B")
        a_addr = self.a.start(lambda msg: None, "reliable-test", name="A")
        self.a.connect(B_ID, b_addr)
        self.b.connect(A_ID, a_addr)

    def _on_b(self, msg):
        with self.arrived:
            self.received.append(msg)
            self.arrived.notify_all()

    def send(self, i):
        self.a.send(Message(Command.SERVER_CMD, A_ID, B_ID, {"i": i}))

    def wait_for(self, n, timeout=5.0):
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.received) >= n, timeout), \
                f"{len(self.received)}/{n} messages delivered within {timeout}s"
        return [m.body["i"] for m in self.received]

    def close(self):
        self.a.stop()
        self.b.stop()


@pytest.fixture
def pairs():
    made = []
    yield lambda **kw: made.append(Pair(**kw)) or made[-1]
    for p in made:
        p.close()


def drop_first(pred):
    """Lose the first arrival that matches ``pred``, deliver everything after it."""
    state = {"dropped": False}

    def drop(msg):
        if not state["dropped"] and msg.cmd != Command.ACK and pred(msg):
            state["dropped"] = True
            return True
        return False
    return drop


def test_a_lost_message_is_resent_and_delivered_once(pairs):
    p = pairs(drop=drop_first(lambda m: True))
    p.send(1)
    assert p.wait_for(1) == [1]
    time.sleep(0.3)                                   # resends after the ack would be duplicates
    assert [m.body["i"] for m in p.received] == [1]
    assert p.a.transport_stats()["resent"] >= 1
    assert p.a.pending() == 0                         # acknowledged


def test_messages_after_a_lost_one_wait_and_arrive_in_order(pairs):
    p = pairs(drop=drop_first(lambda m: m.seq == 2))
    for i in range(1, 6):
        p.send(i)
    assert p.wait_for(5) == [1, 2, 3, 4, 5]
    assert p.b.transport_stats()["reordered"] >= 1


def test_a_duplicate_is_dropped(pairs):
    p = pairs()
    p.send(1)
    assert p.wait_for(1) == [1]
    again = Message(Command.SERVER_CMD, A_ID, B_ID, {"i": 1}, seq=1)     # the same channel sequence number
    p.a.inner.send(again)
    deadline = time.monotonic() + 5
    while p.b.transport_stats()["duplicates"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.b.transport_stats()["duplicates"] == 1
    assert [m.body["i"] for m in p.received] == [1]


def test_a_peer_that_never_acknowledges_is_reported_lost(pairs):
    now = [0.0]
    p = pairs(drop=lambda msg: True, clock=lambda: now[0], give_up=10.0)
    lost = []
    p.a.on_peer_lost = lambda peer, msg, waited: lost.append((peer, msg.body["i"], waited))
    p.send(7)
    time.sleep(0.1)
    assert lost == []                                 # still resending
    now[0] = 10.5
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lost == [(B_ID, 7, 10.5)]
    assert p.a.pending() == 0


def test_messages_queued_for_a_dead_peer_never_reach_its_restart():
    """Real sockets. A worker's messages to a server that died, still queued when the
    server's restart is announced, carry the old channel's numbers: had they reached the
    restart, it would have dropped the new messages with those numbers as duplicates."""
    received, arrived = [], threading.Condition()

    def on_b2(msg):
        with arrived:
            received.append(msg.body["i"])
            arrived.notify_all()

    a = ReliableVan(create_van("zmq"), 0.05, 30.0)
    b1 = ReliableVan(create_van("zmq"), 0.05, 30.0)
    b2 = ReliableVan(create_van("zmq"), 0.05, 30.0)
    try:
        got_b1 = threading.Event()
        b1_addr = b1.start(lambda msg: got_b1.set(), "127.0.0.1", name="B1")
        a.start(lambda msg: None, "127.0.0.1", name="A")
        a.connect(B_ID, b1_addr)
        a.send(Message(Command.SERVER_CMD, A_ID, B_ID, {"i": 0}))
        assert got_b1.wait(5), "B1 did not get the first message"
        b1.stop()                                      # the server dies
        b2_addr = b2.start(on_b2, "127.0.0.1", name="B2")

        gate, forgotten = threading.Event(), threading.Event()

        def node_up():                                 # as Postoffice does on NODE_UP, on the I/O thread
            gate.wait(5)
            a.forget(B_ID)
            a.connect(B_ID, b2_addr)
            forgotten.set()
        a.call_soon(node_up)
        for i in (1, 2, 3):                            # queued behind node_up, numbered 2, 3, 4 of the old count
            a.send(Message(Command.SERVER_CMD, A_ID, B_ID, {"i": i}))
        gate.set()
        assert forgotten.wait(5), "the I/O thread did not run node_up"
        for i in (4, 5):                               # numbered 1, 2 of the new count
            a.send(Message(Command.SERVER_CMD, A_ID, B_ID, {"i": i}))
        with arrived:
            assert arrived.wait_for(lambda: len(received) >= 2, 5), f"B2 got {received}"
        time.sleep(0.3)
        assert received == [4, 5]
        # 3, or more when a 50 ms stall let the resend loop send them again before the forget
        assert a.transport_stats()["stale"] >= 3
        assert a.pending() == 0
    finally:
        for van in (a, b1, b2):
            van.stop()


def test_a_process_can_make_a_second_van_with_ps_resend():
    """Making the first ReliableVan imports the submodule ps.van.reliable, and Python then sets
    the package attribute of that name to the module: a package function named ``reliable``
    was replaced by it, and the next van the process made (its next node: a kvstore made
    again) failed with "'module' object is not callable". A fresh interpreter, as a user's."""
    code = ("from ps.config import Config\n"
            "from ps.van import for_config\n"
            "cfg = Config.from_env({'DMLC_ROLE': 'worker', 'DMLC_PS_ROOT_URI': '127.0.0.1',\n"
            "    'DMLC_PS_ROOT_PORT': '9000', 'DMLC_NUM_SERVER': '1', 'DMLC_NUM_WORKER': '1', 'PS_RESEND': '1'})\n"
            "print(type(for_config(cfg)).__name__, type(for_config(cfg)).__name__)\n")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["ReliableVan", "ReliableVan"], out.stderr
