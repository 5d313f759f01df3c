"""ps/keyinfo.py: what a worker's calls may pass for a key, checked without a cluster. Each
wrong value fails with the exception type KVStore raises and a message naming it."""
import numpy as np
import pytest

from ps import keys
from ps.keyinfo import (KeyTable, RowSparse, check_rows, dense, int_keyed, is_rows, key_labels, member_ranks, pairs,
                        receiver, row_sparse, triples, unique_rows)


def table(num_servers: int = 2, bound: int = 1_000_000) -> KeyTable:
    return KeyTable(num_servers, bound)


def made(key=3, value=None, label=None):
    t = table()
    info = t.new(key, np.zeros((4, 3), np.float32) if value is None else value, label)
    t.add(info)
    return t, info


# -- the key table ---------------------------------------------------------------------------
def test_a_new_key_records_shape_dtype_rows_and_placement():
    t, info = made(3, np.zeros((4, 3), np.float32))
    assert (info.name, info.key, info.shape, info.dtype, info.row_len, info.size) == (3, 3, (4, 3), np.float32, 3, 12)
    assert info.label == "3" and not info.declared and not info.joinable
    assert info.slices == keys.plan(3, 12, 2, 1_000_000, 3)
    assert t.get(3) is info and t.info(3) is info and t.kind is int


def test_a_big_key_is_split_over_the_servers_in_whole_rows():
    info = table(2, bound=8).new(5, np.zeros((4, 3), np.float32))
    assert [(s.server, s.start, s.size) for s in info.slices] == [(0, 0, 6), (1, 6, 6)]


def test_a_str_key_travels_hashed_and_is_labelled_as_written():
    _, info = made("w")
    assert info.key == keys.to_int_key("w") and info.label == "'w'"


def test_one_store_cannot_mix_int_and_str_keys():
    t, _ = made(3)
    with pytest.raises(TypeError, match="key 'w': one store cannot mix int and str keys"):
        t.new("w", np.zeros(2, np.float32))
    assert t.kind is int


def test_a_key_is_initialized_only_once_and_named_by_its_label():
    t, _ = made(3)
    with pytest.raises(ValueError, match="key layer0 is already initialized"):
        t.new(3, np.zeros(2, np.float32), "layer0")


def test_a_key_of_a_wrong_type_is_named_as_that():
    with pytest.raises(TypeError, match="keys must be int or str, got float 1.5"):
        table().new(1.5, np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="got float 1.5"):
        table().info(1.5)


def test_an_unknown_key_says_to_init_it():
    with pytest.raises(KeyError, match=r"key 7 is not initialized; call kv.init\(7, value\) first"):
        made(3)[0].info(7)
    assert table().get(7) is None


def test_an_unsupported_dtype_is_refused_at_init():
    with pytest.raises(TypeError, match="dtype complex64 is not supported"):
        table().new(3, np.zeros(2, np.complex64))


# -- dense values ----------------------------------------------------------------------------
def test_a_value_of_another_shape_names_both_shapes():
    _, info = made(3)
    with pytest.raises(ValueError, match=r"push to key 3: shape \(3, 4\) does not match the initialized shape \(4, 3\)"):
        dense(info, np.zeros((3, 4), np.float32), "push to")


def test_a_value_of_another_dtype_is_a_type_error_naming_both():
    _, info = made(3)
    with pytest.raises(TypeError, match="pushpull to key 3: dtype float64 does not match the initialized dtype float32"):
        dense(info, np.zeros((4, 3)), "pushpull to")


def test_a_list_of_values_is_summed_and_an_empty_one_refused():
    _, info = made(3)
    out = dense(info, [np.ones((4, 3), np.float32), np.full((4, 3), 2, np.float32)], "push to")
    np.testing.assert_array_equal(out, np.full((4, 3), 3, np.float32))
    with pytest.raises(ValueError, match="push to key 3: empty list of values"):
        dense(info, [], "push to")


def test_a_strided_value_comes_back_contiguous():
    _, info = made(3)
    out = dense(info, np.zeros((3, 4), np.float32).T, "push to")
    assert out.flags.c_contiguous and out.shape == (4, 3)


# -- where a pull's replies land -------------------------------------------------------------
def test_a_pull_into_nothing_gets_a_new_array():
    _, info = made(3)
    recv, final = receiver(info, None)
    assert recv.shape == (4, 3) and recv.dtype == np.float32 and final() is recv


def test_an_out_of_the_keys_dtype_is_written_directly():
    _, info = made(3)
    out = np.zeros((4, 3), np.float32)
    recv, final = receiver(info, out)
    assert recv is out and final() is out


def test_outs_of_another_dtype_get_the_value_cast_at_the_end():
    _, info = made(3)
    outs = [np.zeros((4, 3)), np.zeros((4, 3), np.float16)]
    recv, final = receiver(info, outs)
    assert recv is not outs[0] and recv.dtype == np.float32
    recv[:] = 1.5
    assert final() is outs and all((o == 1.5).all() for o in outs)


def test_an_out_of_another_shape_is_refused_naming_it():
    _, info = made(3)
    with pytest.raises(ValueError, match=r"out for key 3 must be a numpy array of shape \(4, 3\), got \(2, 6\)"):
        receiver(info, np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="got list"):
        receiver(info, [[0.0] * 3] * 4)


# -- rows ------------------------------------------------------------------------------------
def test_row_ids_are_sorted_once_each_and_may_be_whole_floats():
    _, info = made(3)
    rows = unique_rows(info, np.array([[3.0, 1.0], [3.0, 0.0]]))
    assert rows.dtype == np.int64 and rows.tolist() == [0, 1, 3]


def test_row_ids_that_are_not_whole_numbers_are_named():
    _, info = made(3)
    with pytest.raises(ValueError, match=r"row ids of key 3 must be whole numbers, got \[1.5\]"):
        check_rows(info, np.array([1.0, 1.5]))


@pytest.mark.parametrize("bad", [-1, 4])
def test_a_row_id_out_of_range_is_named_with_the_shape(bad):
    _, info = made(3)
    with pytest.raises(ValueError, match=rf"row id {bad} is out of range for key 3 of shape \(4, 3\)"):
        check_rows(info, np.array([0, bad]))


def test_a_scalar_key_has_no_rows():
    _, info = made(3, np.zeros((), np.float32))
    with pytest.raises(ValueError, match="key 3 is a scalar: it has no rows"):
        check_rows(info, np.array([0]))


def test_a_row_sparse_push_comes_sorted_and_repeated_rows_add_up():
    _, info = made(3)
    rows, values = row_sparse(info, [RowSparse(np.array([2, 0]), np.array([[1, 1, 1], [2, 2, 2]], np.float32)),
                                     RowSparse(np.array([2]), np.array([[3, 3, 3]], np.float32))])
    assert rows.tolist() == [0, 2]
    np.testing.assert_array_equal(values, [[2, 2, 2], [4, 4, 4]])


def test_distinct_rows_keep_their_values_in_row_order():
    _, info = made(3)
    rows, values = row_sparse(info, RowSparse(np.array([3, 1]), np.array([[1, 1, 1], [2, 2, 2]], np.float32)))
    assert rows.tolist() == [1, 3] and values.flags.c_contiguous
    np.testing.assert_array_equal(values, [[2, 2, 2], [1, 1, 1]])


def test_row_values_of_the_wrong_shape_or_dtype_are_named():
    _, info = made(3)
    with pytest.raises(ValueError, match=r"push to key 3: 2 rows need values of shape \(2, 3\), got \(2, 2\)"):
        row_sparse(info, RowSparse(np.array([0, 1]), np.zeros((2, 2), np.float32)))
    with pytest.raises(TypeError, match="push to key 3: dtype float64 does not match the initialized dtype float32"):
        row_sparse(info, RowSparse(np.array([0, 1]), np.zeros((2, 3))))


def test_is_rows_takes_a_row_sparse_or_a_list_of_them_only():
    rs = RowSparse(np.array([0]), np.zeros((1, 3), np.float32))
    assert is_rows(rs) and is_rows([rs, rs])
    assert not is_rows([]) and not is_rows([rs, np.zeros(3)]) and not is_rows(np.zeros(3))


# -- the shape of a call ---------------------------------------------------------------------
def test_a_list_of_keys_needs_as_many_values():
    assert pairs([1, 2], ["a", "b"]) == [(1, "a"), (2, "b")] and pairs(1, "a") == [(1, "a")]
    with pytest.raises(ValueError, match="2 keys need a list of 2 values"):
        pairs([1, 2], ["a"])


def test_labels_are_one_per_key():
    assert key_labels(None, 2) == [None, None] and key_labels("w", 1) == ["w"]
    with pytest.raises(ValueError, match="2 keys but 1 labels"):
        key_labels(["w"], 2)


def test_members_are_sorted_ranks_of_the_job_including_this_one():
    assert member_ranks([2, 0, 2], 0, 3) == [0, 2]
    with pytest.raises(ValueError, match=r"members \[0, 3\]: not a non-empty list of ranks of this job's 3 workers"):
        member_ranks([0, 3], 0, 3)
    with pytest.raises(ValueError, match="not a non-empty list"):
        member_ranks([], 0, 3)
    with pytest.raises(ValueError, match=r"rank 1 is not one of the members \[0, 2\]"):
        member_ranks([0, 2], 1, 3)


def test_per_key_multipliers_travel_under_int_keys():
    spec = int_keyed({"name": "sgd", "params": {"lr_mult": {"w": 0.5, 3: 2.0}, "wd_mult": {}, "lr": 0.1}})
    assert spec["params"]["lr_mult"] == {keys.to_int_key("w"): 0.5, 3: 2.0}
    assert spec["params"]["lr"] == 0.1 and spec["name"] == "sgd"


def test_a_server_given_for_a_key_places_it_whole_there_unless_it_is_cut():
    t = table(num_servers=3, bound=100)
    value = np.zeros(10, np.float32)
    hashed = t.new(5, value).slices[0].server
    other = (hashed + 1) % 3
    assert t.new(5, value, server=other).slices == (keys.Slice(other, 0, 10),)
    assert t.new(6, np.zeros(300, np.float32), server=other).slices == keys.plan(6, 300, 3, 100)   # cut: as ever
    for bad in (3, -1, "1", True):
        with pytest.raises(ValueError, match=rf"key 5: server {bad!r} is not one of the 3 servers"):
            t.new(5, value, server=bad)
    assert t.new(5, value, server=np.int64(other)).slices == (keys.Slice(other, 0, 10),)     # a numpy int too


def test_a_pull_or_pushpull_pairs_each_key_with_its_value_and_output():
    assert triples(3, None, None) == [(3, None, None)]
    assert triples([1, 2], ["a", "b"], None) == [(1, "a", None), (2, "b", None)]
    assert triples([1, 2], None, ["x", "y"]) == [(1, None, "x"), (2, None, "y")]
    with pytest.raises(ValueError, match=r"2 keys but 1 values / 2 outputs"):
        triples([1, 2], ["a"], None)
