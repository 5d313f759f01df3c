"""ps/ring.py: which server keeps whose replica. A dead machine takes all of its servers; the
job recovers only if no two of them are neighbours in the ring."""
import itertools

import pytest

from ps import ring


def shared(order, hosts):
    n = len(order)
    return sum(hosts[order[i]] == hosts[order[(i + 1) % n]] for i in range(n)) if n > 2 else 0


@pytest.mark.parametrize("hosts", ["a", "ab", "aaaa", "abab", "abcabc", "abcd"])
def test_rank_order_is_kept_when_it_is_as_good(hosts):
    """dmlc placement (rank r on host r mod H) and one-host jobs keep the ring in rank order."""
    assert ring.order(list(hosts)) == list(range(len(hosts)))


@pytest.mark.parametrize("hosts", ["aabb", "aaabbb", "aabbcc", "abca", "abcabca", "aaaabbbbcc", "aaabbc", "aabbc"])
def test_no_host_has_two_neighbours_when_none_runs_more_than_half(hosts):
    order = ring.order(list(hosts))
    assert sorted(order) == list(range(len(hosts)))
    assert shared(order, hosts) == 0, (hosts, order)
    assert shared(list(range(len(hosts))), hosts) > 0         # rank order would have


def test_every_small_placement_gets_a_ring_no_worse_than_rank_order_and_clean_when_it_can_be():
    for n in range(1, 9):
        for hosts in itertools.product("abc", repeat=n):
            order = ring.order(hosts)
            assert sorted(order) == list(range(n))
            assert shared(order, hosts) <= shared(list(range(n)), hosts)
            if max(hosts.count(h) for h in set(hosts)) <= n // 2:
                assert shared(order, hosts) == 0, (hosts, order)


def test_neighbours_and_table_validation():
    assert ring.neighbours([0, 2, 1, 3], 2) == (0, 1)
    assert ring.neighbours([0, 2, 1, 3], 0) == (3, 2)
    assert ring.neighbours([0, 1], 0) == (1, 1)
    assert ring.valid([0, 2, 1, 3], 4) and not ring.valid([0, 1, 1, 3], 4)
    assert not ring.valid(None, 2) and not ring.valid([0, 1], 3) and not ring.valid(["0", "1"], 2)
