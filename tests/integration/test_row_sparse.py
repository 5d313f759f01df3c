"""Row-sparse push and pull through real servers: only the rows travel, MXNet's semantics."""
import numpy as np
import pytest

import ps
from ps.testing import local_cluster

pytestmark = pytest.mark.process


ROWS, COLS = 20000, 16


def test_rows_travel_alone_and_lazy_sgd_updates_only_them():
    """2 servers hold the table in row-aligned halves; each worker pushes its own rows."""
    with local_cluster(num_servers=2, num_workers=2, van="zmq", bigarray_bound=1000) as c:
        def body(kv):
            kv.init("emb", np.ones((ROWS, COLS), np.float32))
            kv.set_optimizer(ps.optim.SGD(learning_rate=0.5, momentum=0.9))
            rows = np.array([3, ROWS - 1, 10001]) if kv.rank == 0 else np.array([10001, 7])
            grad = np.full((rows.size, COLS), kv.rank + 1, np.float32)
            kv.wait_all()
            before = kv.transport_stats()["bytes_sent"]
            kv.push("emb", ps.RowSparse(rows, grad)).wait()
            sent = kv.transport_stats()["bytes_sent"] - before
            got = kv.row_sparse_pull("emb", np.array([[10001, 3], [3, 0]], np.float32))
            empty = kv.row_sparse_pull("emb", [])
            return sent, got, empty, kv.pull("emb")

        (sent0, got, empty, full), (sent1, *_) = c.run(body)
    row_bytes = COLS * 4
    assert 3 * row_bytes < sent0 < 2 * 3 * row_bytes + 400       # 3 rows (+ ids, meta), not 1.28 MB
    assert 2 * row_bytes < sent1 < 2 * 2 * row_bytes + 400
    np.testing.assert_array_equal(got.rows, [0, 3, 10001])       # each once, sorted
    np.testing.assert_array_equal(got.values[:, 0], [1.0, 0.5, -0.5])   # 1 - 0.5 * (1 + 2)
    assert empty.rows.size == 0 and empty.values.shape == (0, COLS)
    touched = {3: 0.5, ROWS - 1: 0.5, 10001: -0.5, 7: 0.0}
    expected = np.ones(ROWS, np.float32)
    for row, v in touched.items():
        expected[row] = v
    np.testing.assert_array_equal(full[:, 0], expected)          # the other rows untouched


def test_without_optimizer_the_sum_replaces_the_value_and_duplicates_add_up():
    with local_cluster(num_servers=2, num_workers=2, van="inproc", bigarray_bound=10) as c:
        def body(kv):
            kv.init(5, np.ones((8, 2), np.float16))
            # one worker gives row 6 twice (per device, say): the two add up
            parts = [ps.RowSparse([6], np.ones((1, 2), np.float16))] * (2 if kv.rank == 0 else 1)
            kv.push(5, parts)
            return kv.pull(5)
        full = c.run(body)[0]
    expected = np.zeros((8, 2), np.float16)
    expected[6] = 3
    np.testing.assert_array_equal(full, expected)


@pytest.mark.parametrize("call,match", [
    (lambda kv: kv.row_sparse_pull(1, [4]), "row id 4 is out of range for key 1 of shape \\(4, 3\\)"),
    (lambda kv: kv.row_sparse_pull(1, [1.5]), "whole numbers"),
    (lambda kv: kv.push(1, ps.RowSparse([0, 1], np.ones((2, 2), np.float32))), "values of shape \\(2, 3\\)"),
    (lambda kv: kv.push(1, ps.RowSparse([0], np.ones((1, 3), np.float64))), "dtype float64"),
    (lambda kv: kv.row_sparse_pull(2, [0]), "key 2 is not initialized"),
])
def test_bad_rows_are_named(call, match):
    with local_cluster(num_servers=1, num_workers=1, van="inproc") as c:
        def body(kv):
            kv.init(1, np.zeros((4, 3), np.float32))
            with pytest.raises((ValueError, TypeError, KeyError), match=match):
                call(kv)
            return kv.row_sparse_pull(1, [3]).values       # the store still works
        np.testing.assert_array_equal(c.run(body)[0], np.zeros((1, 3), np.float32))
