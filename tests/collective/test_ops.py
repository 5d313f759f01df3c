"""ps/collective/ops.py without a cluster: the steps of each collective, composed the way the
adapters compose them, with a fake sum that adds the members' contributions."""
import numpy as np
import pytest

from ps.collective import ops


def summed(shares):
    """What the servers send back: the members' contributions added up."""
    return np.sum(shares, axis=0, dtype=shares[0].dtype)


def gather(arrays, forms=None):
    """Each member's view of a gather of ``arrays`` (one per member): (differing, result)."""
    n = len(arrays)
    rows = [ops.table_row([a.shape[0]], forms[r] if forms else f"{a.shape[1:]}{a.dtype}") for r, a in enumerate(arrays)]
    table = summed([ops.table_share(row, r, n) for r, row in enumerate(rows)])
    bad = [ops.differing(table, row) for row in rows]
    if any(bad):
        return bad, None
    counts = ops.sizes(table)
    layouts = [ops.rows(counts, r) for r in range(n)]
    every = summed([ops.placed(a, layout) for a, layout in zip(arrays, layouts)])
    return bad, every[:layouts[0].total]


def test_a_gather_of_different_first_dimensions_is_their_concatenation_in_every_dtype():
    for dtype in (np.float32, np.int64, np.float16, np.bool_, np.uint8):
        arrays = [(np.arange(k * 3).reshape(k, 3) + 10 * k).astype(dtype) for k in (2, 0, 3)]
        bad, every = gather(arrays)
        assert bad == [[], [], []]
        assert every.dtype == dtype and np.array_equal(every, np.concatenate(arrays))


def test_the_table_names_the_members_whose_form_differs_on_every_member():
    arrays = [np.zeros((1, 2)), np.zeros((1, 3)), np.zeros((2, 2))]
    bad, every = gather(arrays)
    assert every is None and bad == [[1], [0, 2], [1]]
    bad, _ = gather([np.zeros(2, np.float32), np.zeros(2, np.float64)])       # dtype too
    assert bad == [[1], [0]]
    bad, _ = gather([np.zeros(2), np.zeros(2)], forms=["a", "b"])           # the adapter's own words
    assert bad == [[1], [0]]


def test_the_table_holds_each_members_row_and_the_sizes_add_a_row_up():
    row = ops.table_row([2, 0, 5], "(3,)float32")
    assert row[:3] == [2.0, 0.0, 5.0] and row[3] == ops.fingerprint("(3,)float32")
    share = ops.table_share(row, 1, 3)
    assert share.dtype == np.float64 and share.shape == (3, 4)
    assert share[1].tolist() == row and not share[[0, 2]].any()
    assert ops.sizes(np.array([[2, 1, 9.0], [0, 0, 9.0], [4, 4, 9.0]])) == [3, 0, 8]
    assert ops.differing(np.array([[1, 9.0], [1, 8.0]]), [1, 9.0]) == [1]


def test_the_fingerprint_is_exact_in_a_float64_sum():
    prints = [ops.fingerprint(str(i)) for i in range(100)]
    assert all(p == int(p) and 0 <= p < 2 ** 40 for p in prints) and len(set(prints)) == 100
    assert ops.fingerprint("x") * 1000 == sum([ops.fingerprint("x")] * 1000)


def test_the_rows_of_a_gather_lie_in_a_power_of_two_buffer():
    assert ops.rows([1, 0, 3], 2) == ops.Rows(start=1, count=3, total=4, buffer=4)
    assert ops.rows([1, 0, 3], 1) == ops.Rows(start=1, count=0, total=4, buffer=4)
    assert ops.rows([2, 3], 0) == ops.Rows(start=0, count=2, total=5, buffer=8)
    assert ops.rows([0, 0], 0).buffer == 1 and ops.rows([1], 0).buffer == 1
    buf = ops.placed(np.ones((2, 3), np.int16), ops.rows([1, 2, 2], 1))
    assert buf.dtype == np.int16 and buf.shape == (8, 3)
    assert buf[1:3].all() and not buf[0].any() and not buf[3:].any()


def test_an_alltoall_gives_each_member_the_rows_sent_to_it():
    n = 3
    splits = [[(i + j) % 3 for j in range(n)] for i in range(n)]           # member i sends splits[i][j] to j
    tensors = [np.arange(sum(splits[i]) * 2).reshape(-1, 2) + 100 * i for i in range(n)]
    rows = [ops.table_row(splits[i], f"{t.shape[1:]}{t.dtype}") for i, t in enumerate(tensors)]
    table = summed([ops.table_share(row, i, n) for i, row in enumerate(rows)])
    assert ops.sizes(table) == [sum(s) for s in splits]
    every = summed([ops.placed(t, ops.rows(ops.sizes(table), i)) for i, t in enumerate(tensors)])
    for me in range(n):
        parts = ops.received(table, me)
        assert [count for _, count in parts] == [splits[i][me] for i in range(n)]
        got = np.concatenate([every[start:start + count] for start, count in parts])
        want = np.concatenate([tensors[i][sum(splits[i][:me]):][:splits[i][me]] for i in range(n)])
        assert np.array_equal(got, want)


def test_a_share_of_rows_is_horovods_split():
    assert [ops.share(7, 3, r) for r in range(3)] == [(0, 3), (3, 2), (5, 2)]
    assert ops.share(7, 3, 1) == ops.Span(start=3, count=2)
    assert [ops.share(2, 3, r) for r in range(3)] == [(0, 1), (1, 1), (2, 0)]
    for rows in range(12):
        for size in range(1, 5):
            shares = [ops.share(rows, size, r) for r in range(size)]
            assert [s for s, _ in shares] == list(np.cumsum([0] + [c for _, c in shares])[:-1])
            assert sum(c for _, c in shares) == rows and max(c for _, c in shares) - min(c for _, c in shares) <= 1


def test_min_max_product_fold_a_gather_in_its_dtype():
    every = np.array([[3, -2, 65536], [1, 5, 65536]], np.int32)
    assert ops.folded(every, ops.Min).tolist() == [1, -2, 65536]
    assert ops.folded(every, ops.Max).tolist() == [3, 5, 65536]
    product = ops.folded(every, ops.Product)
    assert product.dtype == np.int32 and product.tolist() == [3, -10, 0]         # 2**32 wraps, as in int32
    flags = np.array([[True, False], [True, True]])
    assert ops.folded(flags, ops.Min).tolist() == [True, False] and ops.folded(flags, ops.Max).tolist() == [True, True]
    assert ops.folded(flags, ops.Product).dtype == np.bool_
    halves = np.array([[0.5, 3.0]], np.float16)
    assert ops.folded(halves, ops.Product).dtype == np.float16
    scalars = ops.folded(np.array([3.0, 1.5], np.float32), ops.Product)      # members' tensors were 0-d
    assert isinstance(scalars, np.ndarray) and scalars.shape == () and scalars.dtype == np.float32
    assert float(scalars) == 4.5
    with pytest.raises(KeyError):
        ops.folded(every, ops.Sum)          # a sum is the servers' work


def test_scaling_is_horovods_in_the_arrays_own_dtype():
    ints = np.array([7, -7, 2 ** 24 + 1], np.int32)
    got = ops.scaled(ints, 0.5)
    assert got.dtype == np.int32 and got.tolist() == [3, -3, 2 ** 23]         # float64, truncated toward zero
    assert ops.scaled(np.array([2 ** 24 + 1], np.int32), 3.0).tolist() == [3 * (2 ** 24 + 1)]   # not float32's
    floats = np.array([1.0, 3.0], np.float32)
    assert ops.scaled(floats, 0.1).tolist() == (floats * np.float32(0.1)).tolist()
    assert ops.scaled(floats, 0.1).dtype == np.float32
    halves = np.array([0.1, 1000.0], np.float16)
    want = (halves.astype(np.float32) * np.float32(0.3)).astype(np.float16)
    assert ops.scaled(halves, 0.3).dtype == np.float16 and ops.scaled(halves, 0.3).tolist() == want.tolist()
    assert ops.scaled(np.array([255], np.uint8), 0.5).tolist() == [127]
    flags = np.array([True, False])
    assert ops.scaled(flags, 0.0) is flags and ops.scaled(floats, 1.0) is floats
    assert ops.work_dtype(np.int8) == np.float64 and ops.work_dtype(np.float16) == np.float32
    assert ops.work_dtype("float64") == np.float64 and ops.work_dtype(np.float32) == np.float32


def test_an_op_is_named_by_its_object_or_its_name_and_average_is_the_default():
    class Refused(ValueError):
        pass

    assert ops.reduce_op(None, None, Refused, "api") is ops.Average
    assert ops.reduce_op(None, True, Refused, "api") is ops.Average
    assert ops.reduce_op(None, 0, Refused, "api") is ops.Sum
    assert ops.reduce_op("MAX", None, Refused, "api") is ops.Max and ops.reduce_op(ops.Product, None, Refused, "api")
    with pytest.raises(ValueError, match="the op parameter supersedes average"):
        ops.reduce_op(ops.Sum, False, Refused, "api")
    for bad in (ops.Adasum, "adasum", 3):
        with pytest.raises(Refused, match="is not supported: api reduces with Average, Sum, Min, Max or Product"):
            ops.reduce_op(bad, None, Refused, "api")
    assert ops.GATHERED == (ops.Min, ops.Max, ops.Product)
