"""Store.stalls: which open sync rounds have waited too long, and for whom."""
import numpy as np

from ps.frames import dtype_code
from ps.message import Entry, Op
from ps.server.store import Store
from tests.helpers import Clock

W0, W1, W2 = 9, 11, 13
F32 = dtype_code(np.float32)


def push(store, worker, ts, key=3, n=4, op=Op.PUSH):
    return store.handle(worker, Entry(ts, op, key, 0, n, n, F32), np.ones(n, np.float32))


def test_a_round_is_named_after_the_threshold_with_its_missing_and_waiting_workers():
    clock = Clock()
    s = Store(3, sync=True, clock=clock)
    for key in (3, 5):
        s.handle(W0, Entry(1, Op.INIT, key, 0, 4, 4, F32), np.zeros(4, np.float32))
    assert push(s, W0, 2) == [] and push(s, W1, 2) == [] and push(s, W2, 2)    # round 1 closes
    push(s, W0, 3)
    clock.now += 5
    push(s, W2, 3, op=Op.PUSH | Op.PULL)
    push(s, W0, 4, key=5)
    clock.now += 4
    assert s.stalls(10.0, [W0, W1, W2]) == []
    (stall,) = s.stalls(9.0, [W0, W1, W2])
    assert (stall.key, stall.round, stall.missing, stall.waiting) == (3, 2, (W1,), (W0, W2))
    assert stall.waited == 9.0
    assert {st.key for st in s.stalls(4.0, [W0, W1, W2])} == {3, 5}
    assert push(s, W1, 5)                  # the round closes: nothing is stalled on key 3 any more
    assert [st.key for st in s.stalls(0.0, [W0, W1, W2])] == [5]


def test_a_pull_waiting_on_the_round_counts_as_waiting():
    clock = Clock()
    s = Store(2, sync=True, clock=clock)
    s.handle(W0, Entry(1, Op.INIT, 3, 0, 4, 4, F32), np.zeros(4, np.float32))
    push(s, W0, 2)
    assert s.handle(W0, Entry(3, Op.PULL, 3, 0, 0, 4, F32), None) == []
    clock.now += 1
    (stall,) = s.stalls(1.0, [W0, W1])
    assert stall.missing == (W1,) and stall.waiting == (W0,)


def test_a_deadlock_verdict_drops_the_open_rounds_and_says_how_many_closed():
    s = Store(2, sync=True)
    for key in (3, 5):
        s.handle(W0, Entry(1, Op.INIT, key, 0, 4, 4, F32), np.zeros(4, np.float32))
    assert push(s, W0, 2) == [] and push(s, W1, 2)           # key 3: round 1 closes
    assert push(s, W0, 3) == []                              # round 2: only W0 (W1 went to key 5)
    assert push(s, W1, 3, key=5) == []
    assert s.drop_open() == {3: 1, 5: 0}
    assert s.stalls(0.0, [W0, W1]) == [] and s.drop_open() == {}
    # the next pushes make a fresh round 2 of key 3, with nothing of the dropped one in it
    assert push(s, W0, 4) == []
    replies = push(s, W1, 4, op=Op.PUSH | Op.PULL)
    assert sorted(r.dest for r in replies) == [W0, W1]       # the round closed with these two pushes
    (summed,) = [r.data for r in replies if r.data is not None]
    np.testing.assert_array_equal(summed, np.full(4, 2.0, np.float32))


def test_a_process_sets_realignment_drops_only_the_rounds_of_its_keys():
    s = Store(3, sync=True)
    for key in (3, 5):
        s.handle(W0, Entry(1, Op.INIT, key, 0, 4, 4, F32), np.zeros(4, np.float32))
    s.set_members([5], [W0, W1])
    push(s, W0, 2)                  # key 3 (every worker): open, W2 is computing
    push(s, W0, 3, key=5)           # key 5 (the set): open, W1 went elsewhere
    assert s.drop_open(frozenset([W0, W1])) == {5: 0}
    assert [st.key for st in s.stalls(0.0, [W0, W1, W2])] == [3]
