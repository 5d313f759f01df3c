import numpy as np
import pytest

from ps import optim
from ps.frames import dtype_code
from ps.message import Entry, Op
from ps.server.store import Store

W0, W1 = 9, 11
F32 = dtype_code(np.float32)


def entry(ts, op, key=3, off=0, n=6, total=6, code=F32):
    return Entry(ts, int(op), key, off, n, total, code)


def init(store, key=3, value=None):
    value = np.ones(6, np.float32) if value is None else value
    (reply,) = store.handle(W0, entry(1, Op.INIT, key, 0, value.size, value.size), value)
    assert reply.entry[7] is None


def push(store, w, ts, value, op=Op.PUSH):
    return store.handle(w, entry(ts, op), np.asarray(value, np.float32))


def pull(store, w, ts):
    return store.handle(w, entry(ts, Op.PULL), None)


def values(replies):
    return {(r.dest, r.entry[0]): (None if r.data is None else r.data.copy()) for r in replies}


def test_sync_round_assigns_the_sum_and_answers_everyone():
    s = Store(2, sync=True)
    init(s)
    for rnd in range(3):
        assert push(s, W0, 10 + rnd, np.ones(6)) == []          # round open: no ack yet
        replies = push(s, W1, 20 + rnd, np.full(6, 2.0))
        assert sorted((r.dest, r.entry[0]) for r in replies) == [(W0, 10 + rnd), (W1, 20 + rnd)]
        assert all(r.data is None for r in replies)             # push acks carry no value
        (p,) = pull(s, W0, 30 + rnd)
        np.testing.assert_array_equal(p.data, np.full(6, 3.0))  # assigned, not accumulated


def test_pull_waits_only_for_own_open_push():
    s = Store(2, sync=True)
    init(s)
    push(s, W1, 5, np.full(6, 2.0))
    (p,) = pull(s, W0, 6)                  # W0 has no push in the round: answered at once
    np.testing.assert_array_equal(p.data, np.ones(6))
    assert pull(s, W1, 7) == []            # W1 waits for its own push's round
    got = values(push(s, W0, 8, np.ones(6)))
    np.testing.assert_array_equal(got[(W1, 7)], np.full(6, 3.0))
    assert got[(W0, 8)] is None and got[(W1, 5)] is None


def test_second_push_of_same_worker_opens_next_round():
    s = Store(2, sync=True)
    init(s)
    assert push(s, W0, 1, np.ones(6)) == []
    assert push(s, W0, 2, np.full(6, 10.0)) == []          # MXNet would close the round here
    got = values(push(s, W1, 3, np.full(6, 2.0), op=Op.PUSH | Op.PULL))
    np.testing.assert_array_equal(got[(W1, 3)], np.full(6, 3.0))
    assert (W0, 1) in got and (W0, 2) not in got
    got = values(push(s, W1, 4, np.full(6, 2.0), op=Op.PUSH | Op.PULL))
    np.testing.assert_array_equal(got[(W1, 4)], np.full(6, 12.0))


def test_sync_with_sgd_matches_mxnet_table():
    s = Store(2, sync=True)
    s.set_updater(optim.Updater(optim.SGD(learning_rate=0.1)))
    init(s)
    seen = []
    for rnd in range(4):
        push(s, W0, 10 + rnd, np.ones(6))
        push(s, W1, 20 + rnd, np.full(6, 2.0))
        seen.append(round(float(pull(s, W0, 30 + rnd)[0].data[0]), 6))
    assert seen == [0.7, 0.4, 0.1, -0.2]


def test_async_applies_each_push_and_needs_optimizer():
    s = Store(2, sync=False)
    init(s)
    (err,) = push(s, W0, 1, np.ones(6))
    assert err.entry[7][0] == "RuntimeError" and "set_optimizer" in err.entry[7][1]
    s.set_updater(optim.Updater(optim.SGD(learning_rate=0.1)))
    (ack,) = push(s, W0, 2, np.ones(6), op=Op.PUSH | Op.PULL)
    np.testing.assert_allclose(ack.data, np.full(6, 0.9))
    (ack,) = push(s, W1, 3, np.full(6, 2.0), op=Op.PUSH | Op.PULL)
    np.testing.assert_allclose(ack.data, np.full(6, 0.7))


def test_chunked_push_merges_by_offset():
    s = Store(2, sync=True, chunk_bytes=8)
    init(s)
    a, b = np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32) * 10
    for off in (0, 2, 4):
        assert s.handle(W0, entry(1, Op.PUSH, off=off, n=2), a[off:off + 2]) == []
    replies = []
    for off in (4, 0, 2):                       # any chunk order
        replies += s.handle(W1, entry(2, Op.PUSH | Op.PULL, off=off, n=2), b[off:off + 2])
    data = {r.entry[3]: r.data for r in replies if r.dest == W1}
    np.testing.assert_array_equal(np.concatenate([data[0], data[2], data[4]]), a + b)


@pytest.mark.parametrize("bad,kind", [
    (entry(1, Op.PUSH, key=99), "KeyError"),
    (entry(1, Op.PUSH, n=5, total=5), "ValueError"),
    (entry(1, Op.PUSH, code=dtype_code(np.float64)), "TypeError"),
    (entry(1, Op.INIT), "ValueError"),
])
def test_bad_requests_get_errors_and_change_nothing(bad, kind):
    s = Store(2, sync=True)
    init(s)
    n = bad[4]
    data = np.zeros(n, np.float64 if bad[6] == dtype_code(np.float64) else np.float32)
    (reply,) = s.handle(W1, bad, data)
    assert reply.entry[7][0] == kind and reply.data is None
    (p,) = pull(s, W0, 50)
    np.testing.assert_array_equal(p.data, np.ones(6))
    assert s.keys[3].rounds == []


def test_closed_worker_fails_rounds_missing_it():
    s = Store(2, sync=True)
    init(s)
    assert push(s, W0, 1, np.ones(6)) == []
    (err,) = s.worker_closed(W1)
    assert err.dest == W0 and err.entry[7][0] == "PeerLostError" and "worker 1" in err.entry[7][1]
    (err,) = push(s, W0, 2, np.ones(6))            # every later round is doomed too
    assert err.entry[7][0] == "PeerLostError"


def test_float16_multi_precision_merges_in_float32():
    s = Store(2, sync=True)
    s.set_updater(None, multi_precision=True)
    v = np.ones(6, np.float16)
    s.handle(W0, entry(1, Op.INIT, code=dtype_code(np.float16)), v)
    big = np.full(6, 40000.0, np.float16)       # 40000 + 40000 overflows float16
    e = entry(2, Op.PUSH, code=dtype_code(np.float16))
    s.handle(W0, e, big)
    s.handle(W1, Entry(3, *e[1:]), -big)
    (p,) = s.handle(W0, entry(4, Op.PULL, code=dtype_code(np.float16)), None)
    np.testing.assert_array_equal(p.data, np.zeros(6, np.float16))


def test_a_round_sums_in_rank_order_whatever_the_arrival_order():
    """float32 addition does not associate: 1e8 + 1 - 1e8 + 1 depends on the order. Summing in
    rank order makes a round's result a function of its pushes, so a restarted server that
    redoes a round gets the bits the dead one would have (docs/reliability.md)."""
    workers = [9, 11, 13, 15]
    pushes = {9: 1e8, 11: 1.0, 13: -1e8, 15: 1.0}
    results = set()
    for order in ([9, 11, 13, 15], [13, 11, 15, 9], [15, 13, 11, 9], [11, 9, 15, 13]):
        s = Store(4, sync=True)
        init(s)
        for ts, w in enumerate(order):
            push(s, w, 100 + ts, np.full(6, pushes[w]))
        results.add(float(s.keys[3].value[0]))
    assert len(results) == 1, results
    assert workers == sorted(pushes)


def test_a_half_pull_halves_only_float32_values_and_the_reply_says_which():
    """fp16 compression both ways (Op.HALF_PULL): a float32 key answers in float16 and keeps
    its float32 value; another dtype answers in its own, with the bit cleared so the worker
    reads the frame right."""
    s = Store(1, sync=True)
    init(s, value=np.full(6, 1 / 3, np.float32))
    (half,) = s.handle(W0, entry(5, Op.PULL | Op.HALF_PULL), None)
    assert half.entry.op & Op.HALF_PULL and half.data.dtype == np.float16
    np.testing.assert_array_equal(half.data, np.full(6, 1 / 3, np.float32).astype(np.float16))
    (full,) = pull(s, W0, 6)
    np.testing.assert_array_equal(full.data, np.full(6, 1 / 3, np.float32))   # the store keeps float32
    f64 = dtype_code(np.float64)
    s.handle(W0, entry(7, Op.INIT, 4, code=f64), np.full(6, 1 / 3))
    (other,) = s.handle(W0, entry(8, Op.PULL | Op.HALF_PULL, 4, code=f64), None)
    assert not other.entry.op & Op.HALF_PULL and other.data.dtype == np.float64


def test_a_replayed_push_answered_while_a_round_is_half_applied_keeps_its_reply():
    """A restarted worker replays a push of a closed round while the next round has begun
    (chunk by chunk, in place): the reply made now must not change as that round goes on."""
    s = Store(2, sync=True, chunk_bytes=8 * 4)
    s.handle(W0, entry(1, Op.INIT, 3, 0, 16, 16), np.zeros(16, np.float32))

    def push_chunk(w, ts, seq, off, g):
        e = Entry(ts, int(Op.PUSH | Op.PULL), 3, off, 8, 16, F32, None, 0, seq)
        return s.handle(w, e, np.full(8, g, np.float32))
    for w, ts in ((W0, 10), (W1, 20)):                     # round 1: 1 + 1 = 2 everywhere
        push_chunk(w, ts, 1, 0, 1)
        push_chunk(w, ts, 1, 8, 1)
    push_chunk(W0, 11, 2, 0, 5)
    push_chunk(W1, 21, 2, 0, 5)                             # round 2 has summed its first chunk
    s.worker_died(W1)
    replayed = push_chunk(W1, 30, 1, 0, 1) + push_chunk(W1, 30, 1, 8, 1)   # answered now
    made = np.concatenate([r.data for r in replayed]).copy()
    push_chunk(W0, 11, 2, 8, 5)
    push_chunk(W1, 31, 2, 8, 5)                             # round 2's second chunk, in place
    np.testing.assert_array_equal(np.concatenate([r.data for r in replayed]), made)


@pytest.mark.parametrize("chunked, rule", [(True, None), (False, "sgd"), (False, "lamb")])
def test_a_restarted_worker_replaying_gets_the_weights_its_dead_self_had(chunked, rule):
    """Worker 1 pushed key 3 of step 2 and died before its other keys; worker 0's push then
    closed round 2. The restart, re-running the script, replays step 1: it must get the value
    after round 1 (what its dead self computed step 2 from), not after round 2, or its first new
    gradient (of the keys its dead self had not pushed) differs from an unfaulted run's. SGD with
    momentum (elementwise, chunk by chunk), LAMB (the whole key at the close), or none."""
    s = Store(2, sync=True, chunk_bytes=8 * 4 if chunked else 1 << 20, keep_before=True)
    s.handle(W0, entry(1, Op.INIT, 3, 0, 16, 16), np.linspace(0.5, 2.0, 16).astype(np.float32))
    if rule == "sgd":
        s.set_updater(optim.Updater(optim.SGD(learning_rate=0.5, momentum=0.9)))
    elif rule == "lamb":
        s.set_updater(optim.Updater(optim.from_spec({"name": "lamb", "params": {"learning_rate": 0.1}})))

    def pushpull(w, ts, seq, g):
        out = []
        for off in ((0, 8) if chunked else (0,)):
            n = 8 if chunked else 16
            e = Entry(ts, int(Op.PUSH | Op.PULL), 3, off, n, 16, F32, None, 0, seq)
            out += s.handle(w, e, np.full(n, g, np.float32))
        return out
    pushpull(W0, 10, 1, 1.0)
    after_1 = np.concatenate([r.data for r in pushpull(W1, 20, 1, 2.0) if r.dest == W1]).copy()
    pushpull(W1, 21, 2, 4.0)                  # step 2 of key 3, then worker 1 dies
    s.worker_died(W1)
    pushpull(W0, 11, 2, 8.0)                  # closes round 2: the value moves on
    replayed = pushpull(W1, 30, 1, 2.0)       # the restart replays step 1
    np.testing.assert_array_equal(np.concatenate([r.data for r in replayed]), after_1)



def test_a_replaying_worker_is_refused_the_sum_of_another_round_when_no_optimizer_runs_here():
    """Without an optimizer the value is a round's sum (the weights live on the workers): a
    restarted worker replaying round 1 after round 3 closed would train on round 3's sum. It
    is refused by name; the latest round's own sum, and every key of a store with an
    optimizer, are answered as before."""
    s = Store(2, sync=True, keep_before=True)
    init(s)

    def pushpull(w, ts, seq, g):
        return s.handle(w, Entry(ts, int(Op.PUSH | Op.PULL), 3, 0, 6, 6, F32, None, 0, seq), np.full(6, g, np.float32))
    for seq in (1, 2, 3):
        pushpull(W0, 10 + seq, seq, 1.0)
        pushpull(W1, 20 + seq, seq, float(seq))
    s.worker_died(W1)
    (refused,) = pull(s, W1, 30)
    kind, text = refused.entry.error
    assert kind == "CollectiveError" and "was restarted and re-runs its script, but key 3 has no optimizer" in text
    assert "its value is the sum of round 3, not weights" in text
    (refused,) = pushpull(W1, 31, 1, 1.0)
    assert refused.entry.error[0] == "CollectiveError"
    (latest,) = pushpull(W1, 33, 3, 3.0)        # round 3's own sum is still the value
    assert latest.entry.error is None
    np.testing.assert_array_equal(latest.data, np.full(6, 4.0))
    # a round its dead self pushed into and that is still open: answered when it closes
    pushpull(W1, 24, 4, 4.0)
    s.worker_died(W1)
    assert pushpull(W1, 34, 4, 4.0) == []       # waits for the round's close
    closing = values(pushpull(W0, 14, 4, 1.0))
    np.testing.assert_array_equal(closing[(W1, 34)], np.full(6, 5.0))
    with_optimizer = Store(2, sync=True, keep_before=True)
    init(with_optimizer)
    with_optimizer.set_updater(optim.Updater(optim.SGD(learning_rate=0.5)))
    s = with_optimizer
    for seq in (1, 2, 3):
        pushpull(W0, 10 + seq, seq, 1.0)
        pushpull(W1, 20 + seq, seq, 1.0)
    s.worker_died(W1)
    (weights,) = pull(s, W1, 30)
    assert weights.entry.error is None          # weights: the latest are the right answer


@pytest.mark.parametrize("rule", [None, "sgd"])
def test_a_restarted_workers_pull_gets_the_value_after_the_round_it_asks_for(rule):
    """A pull carries the worker's pushes so far (Entry.seq): the round whose value it wants.
    A restart that jumped ahead with kv.resume() asks for the last closed round and gets the
    current value, even of a key whose value is a sum (before, it was refused); one replaying
    a round behind gets the kept value of that round (before, the latest weights); further
    behind, a sum is still refused and weights are the latest."""
    s = Store(2, sync=True, keep_before=True)
    init(s)
    if rule:
        s.set_updater(optim.Updater(optim.SGD(learning_rate=0.5)))

    def pushpull(w, ts, seq, g):
        return s.handle(w, Entry(ts, int(Op.PUSH | Op.PULL), 3, 0, 6, 6, F32, None, 0, seq), np.full(6, g, np.float32))

    def pull_at(w, ts, seq):
        return s.handle(w, Entry(ts, int(Op.PULL), 3, 0, 6, 6, F32, None, 0, seq), None)
    after = {}
    for seq in (1, 2, 3):
        pushpull(W0, 10 + seq, seq, 1.0)
        (mine,) = [r for r in pushpull(W1, 20 + seq, seq, float(seq)) if r.dest == W1]
        after[seq] = mine.data.copy()
    pushpull(W1, 24, 4, 4.0)                    # its dead self's push into round 4, still open
    s.worker_died(W1)
    pushpull(W0, 14, 4, 1.0)                    # closes round 4: round 3's value is kept
    (latest,) = pull(s, W0, 40)
    (resumed,) = pull_at(W1, 30, 4)             # kv.resume() at round 4
    assert resumed.entry.error is None
    np.testing.assert_array_equal(resumed.data, latest.data)
    (behind,) = pull_at(W1, 31, 3)              # replaying step 3: round 3's value, not round 4's
    assert behind.entry.error is None
    np.testing.assert_array_equal(behind.data, after[3])
    assert not np.array_equal(behind.data, latest.data)
    (older,) = pull_at(W1, 32, 2)
    if rule is None:
        assert older.entry.error[0] == "CollectiveError"     # round 2's sum is gone
    else:
        np.testing.assert_array_equal(older.data, latest.data)


@pytest.mark.parametrize("rule", [None, "sgd"])
def test_a_resumed_workers_pull_does_not_wait_for_the_round_its_dead_self_began(rule):
    """Its dead self pushed the first chunk of round 4 (a key of two chunks) and died. The
    restart, resumed at round 3 (kv.round), pulls before it pushes again: answered now, with the
    value after round 3. It used to wait for round 4 as one of its members, and round 4 needs the
    rest of that very worker's push: a hang. A pull that asks for round 4 waits for its close."""
    s = Store(2, sync=True, chunk_bytes=8 * 4, keep_before=True)
    s.handle(W0, entry(1, Op.INIT, 3, 0, 16, 16), np.linspace(0.5, 2.0, 16).astype(np.float32))
    if rule:
        s.set_updater(optim.Updater(optim.SGD(learning_rate=0.5, momentum=0.9)))

    def push(w, ts, seq, g, offs=(0, 8)):
        out = []
        for off in offs:
            e = Entry(ts, int(Op.PUSH | Op.PULL), 3, off, 8, 16, F32, None, 0, seq)
            out += s.handle(w, e, np.full(8, g, np.float32))
        return out

    def pull_at(w, ts, seq):
        replies = s.handle(w, Entry(ts, int(Op.PULL), 3, 0, 16, 16, F32, None, 0, seq), None)
        assert all(r.entry.error is None for r in replies), replies
        return np.concatenate([r.data for r in replies]) if replies else None
    for seq in (1, 2, 3):
        push(W0, 10 + seq, seq, 1.0)
        push(W1, 20 + seq, seq, float(seq))
    after_3 = pull_at(W0, 40, 3).copy()
    push(W1, 24, 4, 4.0, offs=(0,))             # round 4's first chunk, then it dies
    s.worker_died(W1)
    now = pull_at(W1, 30, 3)
    assert now is not None, "the resumed pull waited"
    np.testing.assert_array_equal(now, after_3)
    push(W0, 14, 4, 1.0)                        # round 4 waits for the rest of W1's push
    np.testing.assert_array_equal(pull_at(W1, 31, 3), after_3)
    assert pull_at(W1, 32, 4) is None           # the value after round 4: when it closes
    closing = [r for r in push(W1, 34, 4, 4.0) if r.dest == W1 and r.entry.ts == 32]
    assert closing and all(r.entry.error is None for r in closing)
    after_4 = pull_at(W0, 41, 4)
    np.testing.assert_array_equal(np.concatenate([r.data for r in closing]), after_4)
    assert not np.array_equal(after_4, after_3)
