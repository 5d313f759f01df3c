"""A sync round's pushpulls from workers across a network (Op.STREAM) are answered chunk by
chunk, as each chunk is summed, not when the round closes: every chunk once, each with its own
round's value (no sockets)."""
import numpy as np

from ps.frames import dtype_code
from ps.keys import chunks
from ps.message import Entry, Op
from ps.optim import Updater, from_spec
from ps.server.store import Store

W0, W1 = 9, 11
F32 = dtype_code(np.float32)
TOTAL, CHUNK = 50, 8            # 7 chunks, the last one short
PIECES = chunks(TOTAL, 1, CHUNK)


def entry(ts, op, off, n, key=3):
    return Entry(ts, int(op), key, off, n, TOTAL, F32)


def new_store(updater=None, journal=None):
    s = Store(2, sync=True, chunk_bytes=CHUNK * 4)
    if updater is not None:
        s.set_updater(updater)
    s.journal = journal
    s.handle(W0, entry(1, Op.INIT, 0, TOTAL), np.zeros(TOTAL, np.float32))
    return s


STREAMED = Op.PUSH | Op.PULL | Op.STREAM


def send(s, worker, ts, grad, pieces, op=STREAMED):
    out = []
    for off, n in pieces:
        out += s.handle(worker, entry(ts, op, off, n), grad[off:off + n])
    return out


def assembled(replies, dest):
    """The pulled value one worker gets, checking it got every element exactly once."""
    got = np.full(TOTAL, np.nan, np.float32)
    for r in replies:
        if r.dest == dest and r.data is not None:
            piece = got[r.entry.offset:r.entry.offset + r.entry.length]
            assert np.isnan(piece).all(), f"offset {r.entry.offset} answered twice"
            piece[:] = r.data
    assert not np.isnan(got).any(), "some elements never answered"
    return got


def test_each_chunk_is_answered_once_every_worker_sent_it():
    s = new_store()
    a, b = np.arange(TOTAL, dtype=np.float32), np.full(TOTAL, 100, np.float32)
    assert send(s, W0, 10, a, PIECES) == []                     # W1 has sent nothing yet
    replies = []
    for i, piece in enumerate(PIECES):
        new = send(s, W1, 20, b, [piece])
        assert sorted((r.dest, r.entry.ts, r.entry.offset) for r in new) == [(W0, 10, piece[0]), (W1, 20, piece[0])]
        if i < len(PIECES) - 1:
            assert all(r.data is not None for r in new)         # chunk data now, the round still open
            assert s.keys[3].closed == 0
        replies += new
    assert s.keys[3].closed == 1                                # the last chunk closed it: nothing more sent
    for dest in (W0, W1):
        np.testing.assert_array_equal(assembled(replies, dest), a + b)


def test_a_push_without_pull_is_acknowledged_at_the_close_only():
    s = new_store()
    a = np.ones(TOTAL, np.float32)
    assert send(s, W0, 10, a, PIECES, op=Op.PUSH) == []
    replies = send(s, W1, 20, a, PIECES[:-1])
    assert {r.dest for r in replies} == {W1} and all(r.data is not None for r in replies)
    replies += send(s, W1, 20, a, PIECES[-1:])
    acks = [r for r in replies if r.dest == W0]
    assert len(acks) == 1 and acks[0].data is None              # W0's push: one ack, at the close
    np.testing.assert_array_equal(assembled(replies, W1), 2 * a)


def test_a_pull_waiting_for_its_own_push_gets_the_round_at_the_close():
    s = new_store()
    a = np.ones(TOTAL, np.float32)
    assert send(s, W0, 10, a, PIECES, op=Op.PUSH) == []
    assert s.handle(W0, entry(11, Op.PULL, 0, TOTAL), None) == []
    replies = send(s, W1, 20, a, PIECES)
    pulled = [r for r in replies if r.dest == W0 and r.entry.ts == 11]
    assert {r.entry.offset for r in pulled} == {off for off, _ in chunks(TOTAL, 4, CHUNK * 4)}
    np.testing.assert_array_equal(assembled(pulled, W0), 2 * a)


def test_fp16_pulls_are_streamed_halved():
    s = new_store()
    a = np.full(TOTAL, 1 / 3, np.float32)
    op = STREAMED | Op.HALF_PULL
    send(s, W0, 10, a, PIECES, op=op)
    replies = send(s, W1, 20, a, PIECES, op=op)
    assert all(r.data.dtype == np.float16 and r.entry.op & Op.HALF_PULL for r in replies)
    np.testing.assert_array_equal(assembled(replies, W0), (2 * a).astype(np.float16).astype(np.float32))


def test_an_elementwise_optimizer_streams_the_updated_value():
    spec = {"name": "sgd", "params": {"learning_rate": 0.5, "momentum": 0.9}}
    s, ref = new_store(Updater(from_spec(spec))), Updater(from_spec(spec))
    w = np.zeros(TOTAL, np.float32)
    rng = np.random.default_rng(0)
    for rnd in range(2):
        g0, g1 = (rng.standard_normal(TOTAL).astype(np.float32) for _ in range(2))
        send(s, W0, 10 + rnd, g0, PIECES)
        early = send(s, W1, 20 + rnd, g1, PIECES[:3])
        assert early and s.keys[3].closed == rnd                # answered before the close
        replies = early + send(s, W1, 20 + rnd, g1, PIECES[3:])
        ref(3, g0 + g1, w)
        np.testing.assert_array_equal(assembled(replies, W1), w)


def test_no_streaming_where_the_value_changes_only_at_the_close_or_nobody_asked():
    """A whole-key optimizer (LAMB: norms of the whole gradient), a server that keeps a
    replica (journal: a restarted worker must get the whole slice at the close), and
    pushpulls without Op.STREAM (workers on the server's machine) are answered once, at the
    close."""
    lamb = Updater(from_spec({"name": "lamb", "params": {}}))
    for s, op in ((new_store(lamb), STREAMED), (new_store(journal=[]), STREAMED), (new_store(), Op.PUSH | Op.PULL)):
        a = np.ones(TOTAL, np.float32)
        send(s, W0, 10, a, PIECES, op)
        assert send(s, W1, 20, a, PIECES[:-1], op) == []
        replies = send(s, W1, 20, a, PIECES[-1:], op)
        assert s.keys[3].closed == 1
        assembled(replies, W0), assembled(replies, W1)


def test_only_the_workers_that_asked_get_chunks_early():
    s = new_store()
    a = np.ones(TOTAL, np.float32)
    send(s, W0, 10, a, PIECES, Op.PUSH | Op.PULL)               # W0: on the server's machine
    early = send(s, W1, 20, a, PIECES[:-1])
    assert early and {r.dest for r in early} == {W1}
    replies = early + send(s, W1, 20, a, PIECES[-1:])
    for dest in (W0, W1):
        np.testing.assert_array_equal(assembled(replies, dest), 2 * a)


def test_a_worker_restarted_mid_round_gets_at_the_close_what_its_dead_self_was_sent():
    """Streaming before any replica subscribed (the journal is off then): the dead worker got
    the first chunks; its restart sends only the rest, and the close answers it the chunks it
    never saw, so each element reaches it exactly once."""
    s = new_store()
    a, b = np.ones(TOTAL, np.float32), np.full(TOTAL, 2, np.float32)
    send(s, W0, 10, a, PIECES)
    first = send(s, W1, 20, b, PIECES[:3])
    assert {r.dest for r in first} == {W0, W1}
    s.worker_died(W1)
    rest = send(s, W1, 30, b, PIECES[3:])                       # the restart: new timestamp, the rest only
    assert s.keys[3].closed == 1
    np.testing.assert_array_equal(assembled(first + rest, W0), a + b)
    np.testing.assert_array_equal(assembled([r for r in rest if r.entry.ts == 30], W1), a + b)


def test_a_backup_subscribing_mid_round_stops_the_streaming():
    """The round's pushpulls asked before a replica subscribed (journal off); their chunks are
    summed after it did: the backup replays closes, so they are answered at the close."""
    s = new_store()
    a = np.ones(TOTAL, np.float32)
    assert send(s, W0, 10, a, PIECES) == []
    s.journal = []
    early = send(s, W1, 20, a, PIECES[:-1])
    assert early == []
    replies = send(s, W1, 20, a, PIECES[-1:])
    for dest in (W0, W1):
        np.testing.assert_array_equal(assembled(replies, dest), 2 * a)
