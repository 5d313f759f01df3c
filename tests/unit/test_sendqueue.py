"""SendQueue (PS_SEND_WINDOW): most urgent first, a bounded window, credits, key order;
small messages uncounted."""
import numpy as np

from ps.frames import dtype_code
from ps.keys import CHUNK_BYTES
from ps.message import Entry, Op
from ps.sendqueue import CREDIT_MIN, SendQueue

F32 = dtype_code(np.float32)
S0, S1 = 8, 10
MB = np.zeros(CHUNK_BYTES // 4, np.float32)          # one chunk


def push(key, ts=1):
    return Entry(ts, Op.PUSH | Op.PULL, key, 0, MB.size, MB.size, F32)


def keys_of(messages):
    return [[e.key for e in out.batch.entries] for out in messages]


def test_the_window_bounds_bytes_in_flight_and_credits_reopen_it():
    q = SendQueue(2 * CHUNK_BYTES)
    for key in range(5):
        q.add(0, S0, push(key), MB)
    first = q.take()
    assert keys_of(first) == [[0], [1]] and q.in_flight == 2 * CHUNK_BYTES
    assert q.take() == [] and len(q) == 3                # full: nothing more leaves
    q.credit(S0, CHUNK_BYTES)
    assert keys_of(q.take()) == [[2]]
    q.credit(S0, 2 * CHUNK_BYTES)
    assert keys_of(q.take()) == [[3], [4]] and len(q) == 0


def test_a_later_more_urgent_request_overtakes_the_backlog():
    """MXNet's backward order: the last layer (priority -9) is ready first, the first
    layer (priority 0) last; with the window full, layer 0 leaves before the backlog."""
    q = SendQueue(CHUNK_BYTES)
    for layer in reversed(range(10)):
        q.add(-layer, S0, push(layer), MB)
        if layer == 9:
            assert keys_of(q.take()) == [[9]]
    q.credit(S0, CHUNK_BYTES)
    assert keys_of(q.take()) == [[0]]
    q.credit(S0, CHUNK_BYTES)
    assert keys_of(q.take()) == [[1]]


def test_small_entries_share_a_message_per_server_which_is_neither_counted_nor_credited():
    q = SendQueue(8 * CHUNK_BYTES)
    small = np.zeros(10, np.float32)
    for key in range(6):
        q.add(-key, S0 if key % 2 else S1, Entry(1, Op.PUSH, key, 0, 10, 10, F32), small)
    sent = q.take()
    assert {out.dest: [e.key for e in out.batch.entries] for out in sent} == {S1: [0, 2, 4], S0: [1, 3, 5]}
    assert not any(out.credit for out in sent) and q.in_flight == 0


def test_a_message_above_credit_min_counts_and_is_credited_and_one_at_it_is_not():
    q = SendQueue(8 * CHUNK_BYTES)
    at = np.zeros(CREDIT_MIN // 4, np.float32)
    above = np.zeros(CREDIT_MIN // 4 + 1, np.float32)
    q.add(0, S0, Entry(1, Op.PUSH, 1, 0, at.size, at.size, F32), at)
    q.add(0, S1, Entry(1, Op.PUSH, 2, 0, above.size, above.size, F32), above)
    sent = {out.dest: out.credit for out in q.take()}
    assert sent == {S0: False, S1: True} and q.in_flight == above.nbytes
    q.credit(S1, above.nbytes)
    assert q.in_flight == 0


def test_a_request_never_overtakes_an_earlier_one_to_the_same_key():
    q = SendQueue(CHUNK_BYTES)
    q.add(0, S0, push(99), MB)                           # fills the window
    assert keys_of(q.take()) == [[99]]
    q.add(-5, S0, push(7, ts=1), MB)                     # a push of key 7, low priority
    q.add(-1, S0, push(8), MB)
    q.add(0, S0, Entry(2, Op.PULL, 7, 0, MB.size, MB.size, F32), None)   # then an urgent pull of it
    q.credit(S0, CHUNK_BYTES)
    order = []
    while len(q):
        for out in q.take():
            order += [(e.key, e.ts) for e in out.batch.entries]
        q.credit(S0, CHUNK_BYTES)
    assert order.index((7, 1)) < order.index((7, 2)), order
    assert order[0] == (8, 1)                            # the others still go by priority


def test_a_dead_servers_bytes_stop_counting_and_late_credits_cannot_go_below_zero():
    q = SendQueue(2 * CHUNK_BYTES)
    q.add(0, S0, push(1), MB)
    q.add(0, S1, push(2), MB)
    q.add(0, S1, push(3), MB)
    q.take()
    assert q.in_flight == 2 * CHUNK_BYTES
    q.forget(S0)
    assert q.in_flight == CHUNK_BYTES
    q.credit(S0, CHUNK_BYTES)                            # from its dead incarnation
    assert q.in_flight == CHUNK_BYTES
    assert keys_of(q.take()) == [[3]]


def test_forgetting_a_peer_drops_what_waits_for_it():
    q = SendQueue(CHUNK_BYTES)
    q.add(0, S0, push(1), MB)
    q.take()
    q.add(-1, S1, push(2), MB)
    q.add(-2, S0, push(3), MB)
    q.add(-3, S0, push(2, ts=2), MB)
    q.forget(S1)                                         # its key-2 entry goes; key 2's order rule with it
    assert len(q) == 2 and len(q.frames()) == 2
    q.credit(S0, CHUNK_BYTES)
    assert keys_of(q.take()) == [[3]]


def test_one_requests_slices_leave_chunk_by_chunk_to_all_servers_at_once():
    """Added slice by slice (all of S0's chunks, then S1's), they leave interleaved: every
    server's link carries a share at once, not one server's after the other's."""
    q = SendQueue(CHUNK_BYTES)
    n = MB.size
    for sid in (S0, S1):
        for i in range(3):
            q.add(0, sid, Entry(7, Op.PUSH, 5, i * n, n, 3 * n, F32), MB, group=7)
    q.add(0, S0, Entry(8, Op.PULL, 5, 0, 3 * n, 3 * n, F32), None, group=8)   # the next request waits
    order = []
    while len(q):
        for out in q.take():
            order += [(out.dest, e.offset // n, e.ts) for e in out.batch.entries]
        q.credit(S0, CHUNK_BYTES)
        q.credit(S1, CHUNK_BYTES)
    assert order == [(S0, 0, 7), (S1, 0, 7), (S0, 1, 7), (S1, 1, 7), (S0, 2, 7), (S1, 2, 7), (S0, 0, 8)], order


def test_a_connection_without_room_holds_back_only_its_own_entries():
    """PS_SEND_LOWAT: S0's socket still holds unsent bytes, so S0's (more urgent) entries
    wait, in order, and S1's leave past them; once S0 drained, its entries leave first."""
    q = SendQueue(16 * CHUNK_BYTES, lowat=1 << 17)       # 128 KiB low-water mark
    for key in range(3):
        q.add(0, S0, push(key), MB)
    for key in range(10, 12):
        q.add(-1, S1, push(key), MB)
    unsent = {S0: 1 << 20, S1: 0}
    sent = q.take(unsent.get)
    assert [out.dest for out in sent] == [S1] and keys_of(sent) == [[10]]   # one message overshoots
    assert q.blocked and len(q) == 4
    # what stands between each held-back connection and room: S0 from the start, S1 after
    # its one message (a MB of payload over a connection that had room for 128 KiB): with the
    # entries taken for each so far, 0 and 1
    assert q.held_back == {S0: ((1 << 20) - (1 << 17) + 1, 0), S1: (sent[0].batch.nbytes - (1 << 17) + 1, 1)}
    unsent[S1] = 1 << 20                                  # now S1 is backed up and S0 drained
    unsent[S0] = 0
    sent = q.take(unsent.get)
    assert keys_of(sent) == [[0]] and q.blocked and set(q.held_back) == {S0, S1}
    sent = q.take(lambda server: None)                    # a van that cannot tell: no limit
    assert keys_of(sent) == [[1], [2], [11]] and not q.blocked and len(q) == 0 and q.held_back == {}


def test_a_window_smaller_than_the_servers_small_messages_together_leaves_nothing_stranded():
    """PS_SEND_WINDOW=100K with 7 servers: a pass counts each server's box while it fills
    (7 x 20 KB passes the window), then lets them leave uncounted (each under CREDIT_MIN).
    The queue must not end a take with room, entries left and nothing on the way to credit
    them: that hung a K = 8 job (servers' replies queued, every worker waiting for them)."""
    small = np.zeros(5000, np.float32)                   # 20 KB
    servers = [8 + 2 * i for i in range(7)]
    q = SendQueue(100 << 10)
    for key in range(28):
        q.add(-key, servers[key % 7], Entry(1, Op.PUSH | Op.PULL, key, 0, small.size, small.size, F32), small)
    sent = q.take()
    assert sorted(k for keys in keys_of(sent) for k in keys) == list(range(28)), keys_of(sent)
    assert len(q) == 0 and q.in_flight == 0 and not any(out.credit for out in sent)
