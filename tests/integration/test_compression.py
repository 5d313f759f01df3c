"""Gradient compression end to end (in-process clusters)."""
import numpy as np
import pytest

from ps.testing import local_cluster

pytestmark = pytest.mark.process


GRAD = np.array([0.3, 0.6, -0.7, 1.2, 0.1, -0.2, -0.6, 2.0], np.float32)


@pytest.mark.parametrize("van", ["inproc", "zmq"])
def test_2bit_matches_mxnet_worked_example(van):
    """Spec §6: 1 worker, threshold 0.5, no optimizer, the same gradient every round."""
    def job(kv):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        kv.init(0, np.zeros(8, np.float32))
        return [kv.pushpull(0, GRAD).tolist() for _ in range(3)]
    with local_cluster(1, 1, van=van) as c:
        (pulled,) = c.run(job)
    assert pulled == [[0, .5, -.5, .5, 0, 0, -.5, .5],
                      [.5, .5, -.5, .5, 0, 0, -.5, .5],
                      [0, .5, -.5, .5, 0, -.5, -.5, .5]]


def test_2bit_two_workers_sum_dequantized_pushes_on_sharded_key():
    def job(kv):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        kv.init(0, np.zeros(8, np.float32))
        kv.init(1, np.zeros(600_000, np.float32))
        big = np.tile(GRAD, 75_000) * (kv.rank + 1)
        return kv.pushpull(0, GRAD * (kv.rank + 1)), kv.pushpull(1, big)
    with local_cluster(2, 2, bigarray_bound=1000) as c:
        (a, big_a), (b, big_b) = c.run(job)
    # worker 0 sends [0,.5,-.5,.5,0,0,-.5,.5]; worker 1 (grad*2) sends [.5,.5,-.5,.5,0,0,-.5,.5]
    expected = np.array([.5, 1, -1, 1, 0, 0, -1, 1], np.float32)
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, expected)
    np.testing.assert_array_equal(big_a, np.tile(expected, 75_000))


def test_fp16_compression_sums_in_float32():
    def job(kv):
        kv.set_gradient_compression({"type": "fp16"})
        kv.init(0, np.zeros(4, np.float32))
        return kv.pushpull(0, np.array([1 / 3, 1e-4, 600.0, -2.5], np.float32))
    with local_cluster(1, 2) as c:
        out, _ = c.run(job)
    assert out.dtype == np.float32
    expected = 2 * np.array([1 / 3, 1e-4, 600.0, -2.5], np.float32).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out, expected)


def test_fp16_compression_halves_pulls_too_while_the_servers_keep_float32():
    """fp16 both ways: a pull returns the float32 sum rounded once to float16, while the
    servers' value stays the exact float32 sum (a second worker without the pull option,
    'pull': False, reads it exactly); a multi-chunk key over ZeroMQ comes back whole."""
    grad = np.array([1 / 3, 1e-4, 600.0, -2.5], np.float32)
    big = np.linspace(-3, 3, 600_000, dtype=np.float32)       # 2.4 MB: several chunks per server

    def job(kv):
        kv.set_gradient_compression({"type": "fp16", "pull": kv.rank == 0})
        kv.init([0, 1], [np.zeros(4, np.float32), np.zeros(big.size, np.float32)])
        small = kv.pushpull(0, grad + kv.rank)
        large = kv.pushpull(1, big)
        return small, large, kv.transport_stats()
    with local_cluster(2, 2, van="zmq") as c:
        (half, half_big, half_stats), (exact, exact_big, exact_stats) = c.run(job)
    # what came back: the float16 worker received about half the float32 one's bytes
    assert 0.45 < half_stats["bytes_received"] / exact_stats["bytes_received"] < 0.55, (half_stats, exact_stats)
    pushed = (grad.astype(np.float16).astype(np.float32) + (grad + 1).astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(exact, pushed)                     # summed in float32
    assert not np.array_equal(exact, pushed.astype(np.float16).astype(np.float32))   # which float16 cannot hold
    assert half.dtype == np.float32
    np.testing.assert_array_equal(half, pushed.astype(np.float16).astype(np.float32))
    big_sum = 2 * big.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(exact_big, big_sum)
    np.testing.assert_array_equal(half_big, big_sum.astype(np.float16).astype(np.float32))


def test_only_fp16_compression_can_halve_pulls():
    from ps.compression import parse
    with pytest.raises(ValueError, match="only fp16 compression can halve pulls; 2bit"):
        parse({"type": "2bit", "threshold": 0.5, "pull": True})
    with pytest.raises(ValueError, match="'pull' must be True or False, got 'no'"):
        parse({"type": "fp16", "pull": "no"})
    assert parse({"type": "fp16"})["pull"] and not parse({"type": "2bit"})["pull"]
