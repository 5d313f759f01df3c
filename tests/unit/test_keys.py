
import numpy as np
import pytest

from ps.keys import MAX_KEY, Slice, balance, chunks, plan, str_key, to_int_key


def test_spec_worked_examples():
    # S=3, N=7, bound=7: sharded into 2, 3, 2 elements (ps-lite round-half-away)
    assert plan(0, 7, 3, 7) == (Slice(0, 0, 2), Slice(1, 2, 3), Slice(2, 5, 2))
    # key 3 with N=6 below the bound: server (3*9973) % 3 = 0
    assert plan(3, 6, 3, 7) == (Slice(0, 0, 6),)


def test_single_server_hash_below_bound():
    for key in range(50):
        for servers in (1, 2, 3, 5):
            (s,) = plan(key, 10, servers, 1000)
            assert s.server == (key * 9973) % servers and (s.start, s.size) == (0, 10)


def test_bound_is_inclusive():
    assert len(plan(1, 1000, 2, 1000)) == 2    # N == bound shards
    assert len(plan(1, 999, 2, 1000)) == 1


def test_slices_cover_exactly_and_round_half_away():
    for n in (1, 2, 5, 10, 1001, 2_000_003):
        for servers in (2, 3, 4, 7):
            sl = plan(0, n, servers, 1)
            assert sum(s.size for s in sl) == n
            assert all(a.start + a.size == b.start for a, b in zip(sl, sl[1:]))
    # N=5, S=2: edges round(2.5)=3 -> 3, 2 (half away from zero, not banker's rounding)
    assert [s.size for s in plan(0, 5, 2, 1)] == [3, 2]
    # N=1, S=2: round(0.5)=1 -> server 1's slice is empty and left out
    assert plan(0, 1, 2, 1) == (Slice(0, 0, 1),)


def test_chunks():
    assert chunks(10, 4, 16) == [(0, 4), (4, 4), (8, 2)]
    assert chunks(3, 4, 1 << 20) == [(0, 3)]
    assert chunks(0, 4) == [(0, 0)]


def test_str_keys_are_stable_and_distinct():
    names = [f"layer{i}_weight" for i in range(2000)]
    ints = [str_key(n) for n in names]
    assert len(set(ints)) == len(ints)
    assert all(0 <= k <= MAX_KEY for k in ints)
    assert str_key("fc1_weight") == str_key("fc1_weight") == to_int_key("fc1_weight")


@pytest.mark.parametrize("bad", [-1, 1 << 62, 1.5, None, b"x", True])
def test_bad_keys(bad):
    with pytest.raises((TypeError, ValueError)):
        to_int_key(bad)


def test_big_keys_are_cut_between_rows():
    """Every slice holds whole rows, so a row-sparse push finds each row on one server."""
    for rows, row_len, servers in [(7, 3, 2), (1000, 64, 3), (5, 4, 2), (2, 10, 3)]:
        sl = plan(0, rows * row_len, servers, 1, row_len)
        assert sum(s.size for s in sl) == rows * row_len
        assert all(s.start % row_len == 0 and s.size % row_len == 0 for s in sl)
    assert [s.size for s in plan(0, 7 * 3, 2, 1, 3)] == [12, 9]     # 4 rows, 3 rows
    assert len(plan(0, 2 * 10, 3, 1, 10)) == 2                      # fewer rows than servers


def test_balance_places_the_largest_first_on_the_least_held_server():
    arrays = [("a", 50), ("b", 40), ("c", 30), ("d", 20), ("e", 10)]
    # a -> 0, b -> 1, c -> 1 (40 < 50), d -> 0 (50 < 70), e -> 0 or 1: 70 == 70, the lowest
    assert balance(arrays, 2, 1000) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 0}
    assert balance(list(reversed(arrays)), 2, 1000) == balance(arrays, 2, 1000)    # the set, not its order


def test_balance_counts_a_cut_array_on_every_server_and_leaves_it_out():
    # "big" is cut 600/600 over two servers, then 401/400/401 over three
    assert balance([("big", 1200), ("x", 100), ("y", 90)], 2, 1000) == {"x": 0, "y": 1}
    assert balance([("big", 1202), ("x", 100)], 3, 1000) == {"x": 1}    # slices 401, 400, 401
    assert balance([("x", 5), ("y", 5)], 1, 1000) == {}                  # one server: nothing to choose
    assert balance([("x", 5), ("y", 5)], 3, 1000) == {"x": 0, "y": 1}   # equal sizes go by name


def test_balance_starts_from_what_the_servers_hold_and_adds_to_it():
    """A second set (a GAN's second optimizer) goes first to the servers the first set left
    emptiest; without ``held`` it would fill server 0 again."""
    held = [0, 0]
    assert balance([("a", 160), ("b", 48), ("c", 30)], 2, 1000, held=held) == {"a": 0, "b": 1, "c": 1}
    assert held == [160, 78]
    assert balance([("A", 160), ("B", 48), ("C", 30)], 2, 1000, held=held) == {"A": 1, "B": 0, "C": 0}
    assert held == [238, 238]
    assert balance([("big", 1200)], 2, 1000, held=held) == {} and held == [838, 838]    # a cut array on both
    with pytest.raises(ValueError, match="held has 3 servers' counts for 2 servers"):
        balance([("x", 1)], 2, 1000, held=[0, 0, 0])


def test_balance_holds_the_spread_to_one_array_where_the_hash_does_not():
    """ResNet-50's shapes below the bound spread by size stay within the largest of them of
    each other (the hash leaves one server a third above the mean: keys.balance's docstring)."""
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(100, 60_000, size=60)]
    arrays = [(f"k{i}", s) for i, s in enumerate(sizes)]
    held = [0] * 4
    for name, server in balance(arrays, 4, 100_000).items():
        held[server] += dict(arrays)[name]
    assert max(held) - min(held) <= max(sizes)
    assert sum(held) == sum(sizes)
