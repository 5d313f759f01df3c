"""Row-sparse pushes and pulls in the Store: rounds, sums, lazy updates, MXNet's assign rule."""
import numpy as np
import pytest

from ps import optim
from ps.frames import Rows, dtype_code
from ps.message import Entry, Op
from ps.server.store import Store

W0, W1 = 9, 11
F32 = dtype_code(np.float32)
ROWS, COLS = 6, 2


def init(store, key=3):
    value = np.arange(ROWS * COLS, dtype=np.float32)
    (reply,) = store.handle(W0, Entry(1, Op.INIT, key, 0, value.size, value.size, F32), value)
    assert reply.entry.error is None
    return value.reshape(ROWS, COLS).copy()


def push_rows(store, w, ts, ids, vals, off=0, total=None):
    ids = np.asarray(ids, np.uint32)
    total = len(ids) if total is None else total
    data = Rows(ids, np.asarray(vals, np.float32).reshape(-1))
    return store.handle(w, Entry(ts, Op.PUSH | Op.ROWS, 3, off, len(ids), total, F32, None, COLS), data)


def pull_rows(store, w, ts, ids):
    ids = np.asarray(ids, np.uint32)
    return store.handle(w, Entry(ts, Op.PULL | Op.ROWS, 3, 0, len(ids), len(ids), F32, None, COLS), Rows(ids))


def value(store):
    return store.keys[3].value.reshape(ROWS, COLS)


def test_sync_round_sums_rows_and_lazy_sgd_leaves_other_rows_alone():
    s = Store(2, sync=True)
    before = init(s)
    s.set_updater(optim.Updater(optim.SGD(learning_rate=1.0)))
    assert push_rows(s, W0, 10, [1, 4], [[1, 1], [2, 2]]) == []      # round open
    assert pull_rows(s, W0, 11, [4]) == []                           # waits for W0's own push
    replies = push_rows(s, W1, 20, [4, 5], [[10, 10], [20, 20]])
    acks = {(r.dest, r.entry.ts) for r in replies if not r.entry.op & Op.PULL}
    assert acks == {(W0, 10), (W1, 20)}
    expected = before.copy()
    expected[1] -= 1
    expected[4] -= 12                     # both workers' rows summed, then one update
    expected[5] -= 20
    np.testing.assert_array_equal(value(s), expected)
    (deferred,) = [r for r in replies if r.entry.op & Op.PULL]
    assert deferred.dest == W0 and deferred.entry.total == COLS
    np.testing.assert_array_equal(deferred.data, expected[4])


def test_pull_returns_the_asked_rows_in_the_asked_order():
    s = Store(1, sync=True)
    before = init(s)
    (reply,) = pull_rows(s, W0, 2, [5, 0, 3])
    np.testing.assert_array_equal(reply.data, before[[5, 0, 3]].reshape(-1))
    assert not s.guard.busy(s.keys[3].value)          # a copy: the value is not lent out


def test_without_optimizer_the_row_sum_replaces_the_value_as_mxnet_assigns():
    s = Store(2, sync=True)
    init(s)
    push_rows(s, W0, 10, [2], [[1, 2]])
    push_rows(s, W1, 20, [], [])                        # a worker with no rows still closes the round
    expected = np.zeros((ROWS, COLS), np.float32)
    expected[2] = [1, 2]
    np.testing.assert_array_equal(value(s), expected)


def test_push_in_chunks_completes_only_with_its_last_rows():
    s = Store(1, sync=True)
    init(s)
    s.set_updater(optim.Updater(optim.Test(rescale_grad=2.0)))
    assert push_rows(s, W0, 10, [0, 1], [[1, 1], [1, 1]], off=0, total=3) == []
    (ack,) = push_rows(s, W0, 10, [5], [[1, 1]], off=2, total=3)
    assert ack.entry.ts == 10
    np.testing.assert_array_equal(value(s)[[0, 1, 5], 0], [2, 4, 12])


def test_mixed_dense_and_rows_round_is_summed_dense():
    s = Store(2, sync=True)
    before = init(s)
    s.set_updater(optim.Updater(optim.SGD(learning_rate=1.0, wd=0.5, lazy_update=True)))
    s.handle(W0, Entry(10, Op.PUSH, 3, 0, ROWS * COLS, ROWS * COLS, F32), np.ones(ROWS * COLS, np.float32))
    push_rows(s, W1, 20, [3], [[1, 1]])
    expected = before - 0.5 * before - 1          # dense: weight decay on every row
    expected[3] -= 1
    np.testing.assert_allclose(value(s), expected)


def test_async_rows_go_through_the_optimizer_at_once():
    s = Store(2, sync=False)
    before = init(s)
    s.set_updater(optim.Updater(optim.SGD(learning_rate=0.5)))
    (ack,) = push_rows(s, W1, 20, [0], [[2, 2]])
    assert ack.entry.ts == 20
    expected = before.copy()
    expected[0] -= 1
    np.testing.assert_array_equal(value(s), expected)


@pytest.mark.parametrize("ids,kind", [([6], "IndexError"), ([0, 99], "IndexError")])
def test_bad_rows_get_an_error_reply_naming_them(ids, kind):
    s = Store(1, sync=True)
    init(s)
    (reply,) = pull_rows(s, W0, 2, ids)
    assert reply.entry.error[0] == kind and "out of range" in reply.entry.error[1]


def test_rows_of_an_uninitialized_key_are_a_key_error():
    s = Store(1, sync=True)
    (reply,) = pull_rows(s, W0, 2, [0])
    assert reply.entry.error[0] == "KeyError"


@pytest.mark.parametrize("rule", [None, "sgd"])
def test_a_restarted_workers_row_pull_is_answered_by_the_round_it_asks_for(rule):
    """A row pull carries the worker's pushes so far, as a dense pull (test_store.py). At the
    last closed round (a restart that called kv.resume()) it gets the current rows. Behind it,
    a key without an optimizer (rows of a round's sum) is refused: row rounds keep no copy of
    the value (it can be a whole embedding table), so that round's sum is gone; weights are
    the latest. Before, such a pull got another round's sum without a word."""
    s = Store(2, sync=True, keep_before=True)
    init(s)
    if rule:
        s.set_updater(optim.Updater(optim.SGD(learning_rate=1.0)))

    def push(w, ts, seq, ids, g):
        ids = np.asarray(ids, np.uint32)
        data = Rows(ids, np.full((len(ids), COLS), g, np.float32).reshape(-1))
        return s.handle(w, Entry(ts, Op.PUSH | Op.ROWS, 3, 0, len(ids), len(ids), F32, None, COLS, seq), data)

    def pull_at(w, ts, seq, ids):
        ids = np.asarray(ids, np.uint32)
        return s.handle(w, Entry(ts, Op.PULL | Op.ROWS, 3, 0, len(ids), len(ids), F32, None, COLS, seq), Rows(ids))
    for seq in (1, 2, 3):
        push(W0, 10 + seq, seq, [1, 4], 1.0)
        push(W1, 20 + seq, seq, [4, 5], float(seq))
    push(W1, 24, 4, [4, 5], 4.0)              # its dead self's push into round 4, still open
    s.worker_died(W1)
    push(W0, 14, 4, [1, 4], 1.0)              # closes round 4
    (resumed,) = pull_at(W1, 30, 4, [5, 4])
    assert resumed.entry.error is None
    np.testing.assert_array_equal(resumed.data, value(s)[[5, 4]].reshape(-1))
    (behind,) = pull_at(W1, 31, 3, [4])
    if rule is None:
        kind, text = behind.entry.error
        assert kind == "CollectiveError" and "its value is the sum of round 4, not weights" in text
    else:
        assert behind.entry.error is None
        np.testing.assert_array_equal(behind.data, value(s)[4])
