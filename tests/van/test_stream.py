"""ps/van/stream.py, the same-machine connection without libzmq: framing over real Unix
sockets (partial writes forced by small kernel buffers), a peer that writes garbage or
dies, and ZmqVan's use of it between two vans on this machine."""
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from ps.errors import ProtocolError
from ps.message import Command, Message, decode
from ps.van import create_van
from ps.van.stream import MAX_FRAMES, Stream, StreamClosed
from tests.helpers import wait_for

pytestmark = pytest.mark.process


_OPENED: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_pairs():
    yield
    while _OPENED:
        _OPENED.pop().close()


def _socketpair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    _OPENED.extend((a, b))
    return a, b


def _pair(buffer: int | None = None) -> tuple[Stream, Stream]:
    a, b = _socketpair()
    left, right = Stream(a, 1 << 30), Stream(b, 1 << 30)
    if buffer:      # after Stream's own tuning: the kernel takes little per call
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return left, right


def _pump(sender: Stream, receiver: Stream, want: int, timeout: float = 20.0) -> list[list]:
    """Move bytes until ``want`` messages arrived, as the van's loop does on POLLOUT/POLLIN."""
    got: list[list] = []
    end = time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < end, f"{len(got)} of {want} messages arrived"
        sender.flush()
        got += receiver.receive()
    return got


MESSAGES = [
    [b"meta"],
    [b"m", b""],                                            # an empty frame
    [b"m", np.arange(1000, dtype=np.float32)],
    [b"m", bytes(range(256)) * 256],                         # exactly 64 KiB: read directly
    [b"m", np.arange((1 << 20) + 3, dtype=np.uint8)],        # larger than the read buffer
    [b"m", *[np.full(7, i, np.int64) for i in range(1500)]],  # more buffers than one sendmsg takes
    [b"tail"],
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("buffer", [None, 4096], ids=["default buffers", "4 KiB buffers"])
def test_every_message_arrives_whole_and_in_order_however_the_kernel_cuts_the_bytes(buffer):
    left, right = _pair(buffer)
    sent = []
    for i, frames in enumerate(MESSAGES):
        left.send(frames, lambda _t, i=i: sent.append(i))
    got = _pump(left, right, len(MESSAGES))
    assert len(got) == len(MESSAGES)
    for want, have in zip(MESSAGES, got):
        assert [bytes(memoryview(f).cast("B")) for f in want] == [bytes(f) for f in have]
    assert sent == list(range(len(MESSAGES)))       # each frame list let go of, in order
    assert not left.pending


@pytest.mark.timeout(30)
def test_frames_stay_the_senders_until_the_kernel_took_them():
    """BufferGuard lends the server's arrays to a reply until the transport lets go: with a
    full socket the callback must wait, and come once the peer read."""
    left, right = _pair(4096)
    big = np.ones(1 << 20, np.uint8)
    released = threading.Event()
    left.send([b"m", big], lambda _t: released.set())
    assert left.pending and not released.is_set()
    _pump(left, right, 1)
    assert released.is_set()


@pytest.mark.timeout(30)
def test_a_message_written_in_part_is_not_let_go_of_for_the_bytes_written_before_it():
    """Messages the kernel took whole, then one it took in part: that one's arrays stay
    lent until its last byte is written, not once as many bytes as its rest went before."""
    left, right = _pair()
    released = []
    for i in range(10_000):
        left.send([b"m", np.full(1 << 16, i % 251, np.uint8)], lambda _t, i=i: released.append(i))
        if left.pending:
            break
    assert left.pending, "the socket never filled up"
    assert released == list(range(i))               # the earlier ones went whole
    left.flush()                                    # nothing read: the socket is still full
    assert released == list(range(i))
    _pump(left, right, i + 1)
    assert released == list(range(i + 1))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("header, says", [
    (struct.pack("<I", 0), "0 frames"),
    (struct.pack("<I", MAX_FRAMES + 1), f"{MAX_FRAMES + 1} frames"),
    (struct.pack("<IQ", 1, 1 << 31), f"{1 << 31} bytes"),
])
def test_a_header_no_ps_node_writes_is_refused_by_name_before_anything_is_allocated(header, says):
    a, b = _socketpair()
    stream = Stream(b, 1 << 30)
    a.sendall(header)
    with pytest.raises(ProtocolError, match=says):
        for _ in range(1000):
            stream.receive()
    a.close()


@pytest.mark.timeout(30)
def test_a_peer_that_closes_mid_message_is_a_closed_stream_not_a_hang():
    left, right = _pair()
    raw = left.sock
    raw.setblocking(True)
    raw.sendall(struct.pack("<IQ", 1, 100) + b"x" * 10)
    raw.close()
    with pytest.raises(StreamClosed):
        for _ in range(100):
            right.receive()


# -- ZmqVan between two vans on this machine ----------------------------------------------
SERVER, WORKER = 8, 9


def _echo(van):
    """A server's handler: answer each message with its body, by the route it came on."""
    return lambda m: van.send(Message(Command.SERVER_CMD, SERVER, m.sender, m.body, request=False,
                                      route=m.route))


@pytest.mark.timeout(60)
def test_a_worker_reaches_a_server_on_its_machine_over_a_stream_and_back_by_identity():
    server, worker = None, None
    got = []
    try:
        server = create_van("zmq")
        server.start(_echo(server), "127.0.0.1", name="server")
        assert os.path.exists(server.local_address[len("ipc://"):] + ".s")
        worker = create_van("zmq")
        worker.start(got.append, "127.0.0.1", name="worker")
        worker.connect(SERVER, server.local_address)
        for i in range(50):
            worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": i}))
        wait_for(lambda: len(got) == 50, timeout=10, what="50 answers")
        assert [m.body["i"] for m in got] == list(range(50))
        assert {m.source for m in got} == {SERVER}
        assert worker.transport_stats()["streams"] == 1
        assert server.transport_stats()["streams"] == 1
        assert server.transport_stats()["messages_received"] == 50
    finally:
        for van in (worker, server):
            if van is not None:
                van.stop()
    assert not os.path.exists(server.local_address[len("ipc://"):] + ".s")


@pytest.mark.timeout(60)
def test_with_curve_keys_same_machine_peers_stay_on_zeromq():
    from ps._security import curve_keys
    keys = curve_keys(b"0123456789abcdef0123456789abcdef")
    got = []
    server = create_van("zmq", curve=keys)
    worker = create_van("zmq", curve=keys)
    try:
        server.start(_echo(server), "127.0.0.1", name="server")
        assert not os.path.exists(server.local_address[len("ipc://"):] + ".s")
        worker.start(got.append, "127.0.0.1", name="worker")
        worker.connect(SERVER, server.local_address)
        worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": 1}))
        wait_for(lambda: got, timeout=10, what="the answer over CURVE")
        assert worker.transport_stats().get("streams", 0) == 0
    finally:
        worker.stop()
        server.stop()


@pytest.mark.timeout(60)
def test_a_stranger_writing_garbage_to_the_stream_is_cut_off_and_the_server_serves_on(caplog):
    got = []
    server = create_van("zmq")
    worker = create_van("zmq")
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.start(_echo(server), "127.0.0.1", name="server")
        path = server.local_address[len("ipc://"):] + ".s"
        stranger.connect(path)
        stranger.sendall(b"GET / HTTP/1.1\r\n\r\n" * 4)        # a header of 542393671 frames
        wait_for(lambda: "malformed" in caplog.text, timeout=10, what="the server's complaint")
        stranger.settimeout(5)
        assert stranger.recv(10) == b""                       # closed on it
        worker.start(got.append, "127.0.0.1", name="worker")
        worker.connect(SERVER, server.local_address)
        worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": 1}))
        wait_for(lambda: got, timeout=10, what="the answer after the stranger")
    finally:
        stranger.close()
        worker.stop()
        server.stop()


@pytest.mark.timeout(60)
def test_a_dead_servers_stream_drops_sends_and_a_reconnect_opens_a_new_one():
    got = []
    first, second = create_van("zmq"), create_van("zmq")
    worker = create_van("zmq")
    try:
        first.start(_echo(first), "127.0.0.1", name="first")
        worker.start(got.append, "127.0.0.1", name="worker")
        worker.connect(SERVER, first.local_address)
        worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": 1}))
        wait_for(lambda: len(got) == 1, timeout=10, what="the first server's answer")
        first.stop()
        worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": 2}))    # dropped, no error
        second.start(_echo(second), "127.0.0.1", name="second")
        worker.connect(SERVER, second.local_address)                          # a restart's address
        worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": 3}))
        wait_for(lambda: len(got) == 2, timeout=10, what="the restarted server's answer")
        assert [m.body["i"] for m in got] == [1, 3]
        assert worker.transport_stats()["streams"] == 1
    finally:
        worker.stop()
        second.stop()


@pytest.mark.timeout(60)
def test_a_stream_closed_by_an_earlier_handler_of_the_same_poll_pass_is_skipped(caplog):
    """One pass of the I/O loop's poll holds a message whose handler drops a server and that
    server's stream closing; the stream's event then finds it gone (it once went to
    ZeroMQ's receive as a bare descriptor and killed the I/O thread)."""
    got, hold = [], threading.Event()
    server, other = create_van("zmq"), create_van("zmq")
    worker = create_van("zmq")

    def on_worker(msg):
        got.append(msg.body)
        if msg.body == "drop the server":
            worker.disconnect(SERVER)           # on the I/O thread: at once

    try:
        server.start(_echo(server), "127.0.0.1", name="server")
        other.start(lambda m: None, "127.0.0.1", name="other")
        worker_addr = worker.start(on_worker, "127.0.0.1", name="worker")
        worker.connect(SERVER, server.local_address)
        worker.send(Message(Command.SERVER_CMD, WORKER, SERVER, "hello"))
        wait_for(lambda: got == ["hello"], timeout=10, what="the server's answer")
        other.connect(WORKER, worker_addr)
        worker.call_soon(lambda: hold.wait(10))             # the worker's loop is busy...
        other.send(Message(Command.SERVER_CMD, 1, WORKER, "drop the server"))
        server.stop()                                       # ...while both events come in
        time.sleep(0.5)
        hold.set()
        wait_for(lambda: "drop the server" in got, timeout=10, what="the message that drops the server")
        worker.send(Message(Command.SERVER_CMD, WORKER, 7, "a van still running"))
        time.sleep(0.3)
        assert "I/O thread crashed" not in caplog.text
        assert worker.transport_stats().get("streams", 0) == 0
    finally:
        hold.set()
        for van in (worker, other, server):
            van.stop()


@pytest.mark.timeout(30)
def test_whole_messages_before_the_peers_end_are_delivered_then_the_end():
    a, b = _socketpair()
    writer, reader = Stream(a, 1 << 30), Stream(b, 1 << 30)
    writer.send([b"first"])
    writer.send([b"second", np.ones(1 << 17, np.uint8)])
    a.close()                                   # both messages and the end wait together
    got = []
    with pytest.raises(StreamClosed):
        for _ in range(100):
            got += reader.receive()
    assert [bytes(m[0]) for m in got] == [b"first", b"second"]


@pytest.mark.timeout(30)
def test_empty_frames_after_a_large_one_need_no_more_bytes_to_arrive():
    """A table push's empty parts (two empty frames) can end a message after a large frame."""
    left, right = _pair()
    left.send([b"m", np.ones((1 << 20) + 1, np.uint8), b"", b""])
    got = _pump(left, right, 1, timeout=10)
    assert [len(f) for f in got[0]] == [1, (1 << 20) + 1, 0, 0]


@pytest.mark.timeout(60)
def test_a_message_of_more_frames_than_a_batch_of_65536_scalar_keys_goes_through():
    left, right = _pair()
    frames = [b"m", *[np.full(1, i, np.float32) for i in range(70_000)]]
    left.send(frames)
    (got,) = _pump(left, right, 1)
    assert len(got) == 70_001 and np.frombuffer(got[-1], np.float32)[0] == 69_999


@pytest.mark.timeout(30)
def test_a_small_frame_that_waits_for_the_socket_is_copied_as_pyzmq_copies_it():
    """The server lends only frames of 64 KiB or more to a reply (BufferGuard): a smaller
    value may change right after the send, so what waits must be a copy."""
    left, right = _pair(4096)
    left.send([b"m", np.zeros(1 << 20, np.uint8)])      # fills the socket
    value = np.full(1000, 7, np.int32)
    left.send([b"m", value])
    assert left.pending
    value[:] = -1                                       # the server updates it in place
    got = _pump(left, right, 2)
    assert (np.frombuffer(got[1][1], np.int32) == 7).all()


@pytest.fixture
def bare_peer(tmp_path):
    """A peer made by hand at an ipc:// path: a plain listener where its stream socket
    goes, and a ZeroMQ ROUTER at the path itself. Yields (path, listener, router)."""
    import zmq
    path = str(tmp_path / "peer")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".s")
    listener.listen(1)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{path}")
    try:
        yield path, listener, router
    finally:
        router.close(0)
        ctx.term()
        listener.close()


@pytest.fixture
def worker_van():
    van = create_van("zmq")
    van.start(lambda m: None, "127.0.0.1", name="worker")
    yield van
    van.stop()


@pytest.mark.timeout(60)
def test_a_stream_its_peer_closes_while_alive_falls_back_to_zeromq_without_losing_later_messages(
        bare_peer, worker_van):
    """A process that closes a worker's stream but lives on (it refused what came) still
    gets what the worker sends after, over the ipc:// twin, as a DEALER would reconnect."""
    path, listener, router = bare_peer
    worker_van.connect(SERVER, f"ipc://{path}")
    listener.settimeout(10)
    conn, _ = listener.accept()                     # the worker opened a stream...
    conn.close()                                    # ...which its peer closes
    time.sleep(0.3)
    worker_van.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"after": 1}))
    assert router.poll(10_000), "nothing came over ZeroMQ after the stream closed"
    identity, meta = router.recv_multipart()
    assert identity == worker_van.identity and b"after" in meta
    assert worker_van.transport_stats().get("streams", 0) == 0


@pytest.mark.timeout(30)
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a socket to another user needs root")
def test_a_stream_socket_another_user_owns_is_not_used(bare_peer, worker_van):
    """The stream beside a peer's ipc:// path must be its process's: a socket there that
    someone else made is passed over for ZeroMQ."""
    path, listener, router = bare_peer
    os.chown(path + ".s", 65534, 65534)                 # nobody's
    worker_van.connect(SERVER, f"ipc://{path}")
    worker_van.send(Message(Command.SERVER_CMD, WORKER, SERVER, {"i": 1}))
    assert router.poll(10_000), "nothing came over ZeroMQ"
    listener.settimeout(0.5)
    with pytest.raises(socket.timeout):
        listener.accept()


def _messages(conn: socket.socket, want: int, timeout: float = 20.0) -> list[list]:
    """Read ``want`` whole messages the van wrote to ``conn`` (a stream it opened)."""
    _OPENED.append(conn)
    reader, got = Stream(conn, 1 << 30), []
    end = time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < end, f"{len(got)} of {want} messages arrived"
        got += reader.receive()
        time.sleep(0.005)
    return got


@pytest.mark.timeout(60)
def test_send_now_writes_on_the_callers_thread_only_while_nothing_waits_before_it(bare_peer, worker_van):
    """A lone request is written by its caller's thread, but never past what the van still
    has to write: behind a message the kernel has not taken in full it is refused (False,
    nothing written), and ``send`` then keeps the order."""
    path, listener, _router = bare_peer

    def msg(i, frames=()):
        return Message(Command.SERVER_CMD, WORKER, SERVER, {"i": i}, frames=frames)
    assert not worker_van.send_now(msg(0))                  # no stream to it yet
    worker_van.connect(SERVER, f"ipc://{path}")
    listener.settimeout(10)
    conn, _ = listener.accept()
    wait_for(lambda: worker_van.transport_stats().get("streams") == 1, what="the worker's stream")
    assert worker_van.send_now(msg(1))
    worker_van.send(msg(2, [np.arange(16 << 20, dtype=np.uint8)]))   # more than the kernel holds
    assert not worker_van.send_now(msg(3))
    worker_van.send(msg(3))
    got = _messages(conn, 4)
    assert got[0] == [worker_van.identity]
    assert [decode(frames[:1], None).body["i"] for frames in got[1:]] == [1, 2, 3]
    np.testing.assert_array_equal(np.frombuffer(got[2][1], np.uint8), np.arange(16 << 20, dtype=np.uint8))
    stats = worker_van.transport_stats()
    assert stats["sent_now"] == 1 and stats["messages_sent"] == 3


@pytest.mark.timeout(60)
def test_send_now_is_refused_on_the_io_thread_and_for_replies(bare_peer, worker_van):
    path, listener, _router = bare_peer
    worker_van.connect(SERVER, f"ipc://{path}")
    listener.settimeout(10)
    conn, _ = listener.accept()
    _OPENED.append(conn)
    wait_for(lambda: worker_van.transport_stats().get("streams") == 1, what="the worker's stream")
    on_io = []
    worker_van.call_soon(lambda: on_io.append(worker_van.send_now(Message(Command.SERVER_CMD, WORKER, SERVER, {}))))
    wait_for(lambda: on_io, what="send_now on the I/O thread")
    assert on_io == [False]
    assert not worker_van.send_now(Message(Command.SERVER_CMD, WORKER, SERVER, {}, request=False, route=b"x"))
    assert worker_van.transport_stats().get("sent_now", 0) == 0


@pytest.fixture
def heard_van():
    """A worker's van that records each message it hands on, with the thread it was on."""
    heard: list[tuple[dict, str]] = []
    van = create_van("zmq")
    van.start(lambda m: heard.append((m.body, threading.current_thread().name)), "127.0.0.1", name="worker")
    yield van, heard
    van.stop()


def _opened_to(bare_peer, van) -> Stream:
    """The server's end of the stream ``van`` opens to the bare peer, its hello read."""
    path, listener, _router = bare_peer
    van.connect(SERVER, f"ipc://{path}")
    listener.settimeout(10)
    conn, _ = listener.accept()
    _OPENED.append(conn)
    server = Stream(conn, 1 << 30)
    assert _pump(server, server, 1) == [[van.identity]]
    wait_for(lambda: van.transport_stats().get("streams") == 1, what="the worker's stream")
    return server


def _reply(i: int, mine: bool = True) -> list:
    from ps.message import encode
    return encode(Message(Command.SERVER_CMD, SERVER, WORKER, {"i": i, "mine": mine}, request=False))


def _later(seconds: float, fn) -> threading.Timer:
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


@pytest.mark.timeout(60)
def test_a_waiting_caller_reads_its_reply_itself_and_then_gives_the_stream_back(bare_peer, heard_van):
    """read_here: the reply is handled on the thread that waits for it; once it returns, the
    next message is the I/O thread's again (the stream is back in its poll)."""
    van, heard = heard_van
    server = _opened_to(bare_peer, van)
    _later(0.2, lambda: server.send(_reply(1)))
    start = time.monotonic()
    assert van.read_here(SERVER, lambda: len(heard) == 1, 10.0, lambda m: m.body["mine"])
    assert time.monotonic() - start < 5, "read_here waited out its time with the reply there"
    assert heard == [({"i": 1, "mine": True}, threading.current_thread().name)]
    server.send(_reply(2))
    wait_for(lambda: len(heard) == 2, what="the next reply, on the I/O thread")
    assert heard[1][0]["i"] == 2 and heard[1][1].startswith("ps-van")
    stats = van.transport_stats()
    assert stats["read_here"] == 1 and stats["messages_received"] == 2


@pytest.mark.timeout(60)
def test_a_message_the_caller_may_not_handle_goes_with_all_after_it_to_the_io_thread_in_order(
        bare_peer, heard_van):
    van, heard = heard_van
    server = _opened_to(bare_peer, van)
    _later(0.2, lambda: server.send(_reply(1)) or server.send(_reply(2, mine=False)) or server.send(_reply(3)))
    assert not van.read_here(SERVER, lambda: len(heard) == 3, 10.0, lambda m: m.body["mine"])
    wait_for(lambda: len(heard) == 3, what="the two messages handed to the I/O thread")
    assert [body["i"] for body, _ in heard] == [1, 2, 3]
    me = threading.current_thread().name
    assert heard[0][1] == me or heard[0][1].startswith("ps-van")   # 1 may come alone, or with 2 and 3
    assert all(thread.startswith("ps-van") for _, thread in heard[1:])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("closer", ["peer", "van"])
def test_a_stream_that_closes_under_a_reading_caller_wakes_it_at_once(bare_peer, heard_van, closer):
    """The peer dies, or the van itself closes the stream (a disconnect): the caller's read
    ends within moments, not at its time limit, and the van goes on over ZeroMQ."""
    van, heard = heard_van
    server = _opened_to(bare_peer, van)
    close = (lambda: server.sock.shutdown(socket.SHUT_RDWR)) if closer == "peer" else \
        (lambda: van.disconnect(SERVER))
    _later(0.3, close)
    start = time.monotonic()
    assert not van.read_here(SERVER, lambda: False, 20.0, lambda m: True)
    assert time.monotonic() - start < 10, "the caller slept on a closed stream"
    wait_for(lambda: van.transport_stats().get("streams", 0) == 0, what="the stream's end")
    assert heard == []


@pytest.mark.timeout(30)
def test_read_here_is_refused_on_the_io_thread_and_without_a_stream(heard_van):
    van, _heard = heard_van
    assert not van.read_here(SERVER, lambda: False, 5.0, lambda m: True)     # no stream to it
    on_io = []
    van.call_soon(lambda: on_io.append(van.read_here(SERVER, lambda: False, 5.0, lambda m: True)))
    wait_for(lambda: on_io, what="read_here on the I/O thread")
    assert on_io == [False]
