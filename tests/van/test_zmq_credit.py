"""ZmqVan's credit connection (PS_SEND_WINDOW): a credit does not wait behind the bulk data
this node already handed to the same peer. Real sockets on 127.0.0.1."""
import threading

import numpy as np
import pytest

from ps.frames import Batch, dtype_code
from ps.message import Command, Entry, Message, Op, encode
from ps.van import create_van
from tests.helpers import wait_for

pytestmark = pytest.mark.process


A_ID, B_ID = 9, 8
BIG = np.zeros(1 << 20, np.float32)          # 4 MB per message


def _arrival_of_the_credit(control: bool, messages: int = 40) -> int:
    """A sends ``messages`` data messages to B, then a credit; B reads nothing until A's I/O
    thread has handed all of them to ZeroMQ (a backlog in the buffers, however slowly a loaded
    machine runs A). How many data messages B got before the credit."""
    seen, done = [], threading.Event()
    started, ready, handed = threading.Event(), threading.Event(), threading.Event()

    def on_b(msg):
        if msg.cmd == Command.SERVER_CMD:    # the connections are up
            ready.set()
            return
        if msg.cmd == Command.CREDIT and not msg.body:
            return                           # the one that opened the connection
        if not started.is_set():
            started.set()
            # B busy: A's bytes pile up in the buffers. Waiting a fixed time instead let a
            # loaded machine's A still be sending data when B read on (credit 35th of 40)
            assert handed.wait(20), "A's I/O thread did not hand its messages over"
        seen.append(msg.cmd)
        if msg.cmd == Command.CREDIT:
            done.set()

    a, b = create_van("zmq"), create_van("zmq")
    try:
        b_addr = b.start(on_b, "127.0.0.1", name="B")
        a.start(lambda msg: None, "127.0.0.1", name="A")
        a.connect(B_ID, b_addr)
        if control:
            assert a.connect_control(B_ID, b_addr)
            a.send(Message(Command.CREDIT, A_ID, B_ID, 0, request=False))
        a.send(Message(Command.SERVER_CMD, A_ID, B_ID, {}))
        assert ready.wait(10), "B did not hear from A"
        for i in range(messages):
            box = Batch()
            box.add(Entry(i + 1, Op.PUSH, 0, 0, BIG.size, BIG.size, dtype_code(np.float32)), BIG)
            a.send(Message(Command.DATA, A_ID, B_ID, box.entries, frames=box.frames))
        a.send(Message(Command.CREDIT, A_ID, B_ID, 4 << 20, request=False))
        a.call_soon(handed.set)              # on A's I/O thread, after it sent what was queued
        assert done.wait(20), f"B never got the credit ({len(seen)} messages arrived)"
        return seen.index(Command.CREDIT)
    finally:
        a.stop()
        b.stop()


@pytest.mark.timeout(60)
def test_a_credit_overtakes_the_data_already_queued_to_the_same_peer():
    assert _arrival_of_the_credit(control=False) == 40          # one connection: strictly behind
    assert _arrival_of_the_credit(control=True) < 10            # its own: B reads it among the first



@pytest.mark.timeout(60)
def test_unsent_reads_what_the_kernel_holds_for_a_peer_that_does_not_read():
    """PS_SEND_LOWAT's measure (Van.unsent): a peer that stops reading leaves bytes unsent in
    the kernel's send buffer of our connection to it; once it reads, they leave."""
    import zmq
    ctx = zmq.Context()
    peer = ctx.socket(zmq.ROUTER)
    peer.setsockopt(zmq.RCVHWM, 1)          # libzmq stops reading the socket: TCP fills up
    peer.setsockopt(zmq.RCVBUF, 1 << 16)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    a = create_van("zmq")
    try:
        a.start(lambda msg: None, "127.0.0.1", name="A")
        a.connect(B_ID, f"tcp://127.0.0.1:{port}")
        assert a.unsent(B_ID) is None                        # no message from it yet: unknown
        a.send(Message(Command.SERVER_CMD, A_ID, B_ID, {}))
        assert peer.poll(10_000), "the peer got nothing from A"
        identity = peer.recv_multipart()[0]
        reply = encode(Message(Command.SERVER_CMD, B_ID, A_ID, {}, request=False))
        peer.send_multipart([identity, *reply])              # A learns its socket from it
        wait_for(lambda: a.unsent(B_ID) is not None, what="A to know the connection's socket")
        assert a.unsent(B_ID) == 0
        for i in range(30):
            box = Batch()
            box.add(Entry(i + 1, Op.PUSH, 0, 0, BIG.size, BIG.size, dtype_code(np.float32)), BIG)
            a.send(Message(Command.DATA, A_ID, B_ID, box.entries, frames=box.frames))
        wait_for(lambda: a.unsent(B_ID) > 64 << 10, what="unsent bytes to pile up")
        assert a.unsent(A_ID + 100) is None                  # a peer it never heard from

        def drain():
            while peer.poll(0):
                peer.recv_multipart(copy=False)
            return a.unsent(B_ID) == 0
        wait_for(drain, 20, 0.01, what="the unsent bytes to leave once the peer reads")
    finally:
        a.stop()
        peer.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
def test_a_tick_says_when_the_loop_comes_back_and_none_leaves_it_idle():
    """PS_SEND_LOWAT's tick (ps/drain.py) returns the seconds until it wants to look again: an
    idle loop comes back then, not every millisecond, and at its 100 ms period once the tick
    waits for nothing. A wait's timer is never early, so every gap is at least what was
    asked; it can be late on a loaded machine, so the upper bounds are on the median."""
    import statistics
    import time
    calls, done = [], threading.Event()

    def tick():
        calls.append(time.monotonic())
        if len(calls) <= 7:
            return 0.04
        if len(calls) >= 11:
            done.set()
        return None

    a = create_van("zmq")
    a.add_tick(tick)                           # before the loop's first pass
    try:
        a.start(lambda msg: None, "127.0.0.1", name="A")
        assert done.wait(20), f"the loop ran its tick {len(calls)} times in 20 s"
    finally:
        a.stop()
    gaps = [later - earlier for earlier, later in zip(calls, calls[1:])]
    asked, idle = gaps[:6], gaps[7:10]
    assert min(asked) >= 0.035 and statistics.median(asked) < 0.08, asked
    assert min(idle) >= 0.09 and statistics.median(idle) < 0.25, idle
