"""Embedding tables' pure parts (ps/embed, ps/optim/rowwise, ps/server/tables): the id index,
the first rows, the sharding, the row-wise optimizers against torch's sparse paths, and a
server's rounds driven entry by entry. No processes, no sockets."""
import numpy as np
import pytest

from ps.embed import Init, LocalTable, TableSpec, initial_rows
from ps.embed.hashing import name_seed, server_of
from ps.embed.index import IdIndex
from ps.embed.table import RowTable, chunk_from_wire, chunk_to_wire, sum_rows
from ps.frames import Rows
from ps.message import Command, Entry, Message, Op, decode, encode, worker_id
from ps.optim import rowwise
from ps.server.tables import Tables
from tests.helpers import table_pull, table_push

EXTREMES = np.array([0, -1, 1, 2**62, -(2**63), 2**63 - 1, -(2**40) + 3], np.int64)


def test_the_index_finds_every_id_it_holds_and_none_it_does_not_across_growth():
    rng = np.random.default_rng(0)
    ids = np.unique(np.r_[EXTREMES, rng.integers(-(2**63), 2**63 - 1, 20000, dtype=np.int64),
                          np.arange(0, 4096 * 1024, 1024)])         # ids that share their low bits
    rng.shuffle(ids)
    index = IdIndex(16)
    rows = np.concatenate([index.add(part) for part in np.array_split(ids, 37)])
    assert np.array_equal(rows, np.arange(len(ids)))
    assert index.size == len(ids) and index.capacity >= 2 * len(ids)
    assert np.array_equal(index.find(ids), rows)
    absent = np.setdiff1d(rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64), ids)
    assert (index.find(absent) == -1).all()
    assert len(index.find(np.empty(0, np.int64))) == 0


def test_a_row_first_value_depends_on_table_and_id_only():
    seed = name_seed("t")
    ids = np.r_[EXTREMES, np.arange(100, 200)]
    whole = initial_rows(seed, ids, 16, Init(), np.float32)
    parts = np.concatenate([initial_rows(seed, ids[i::3], 16, Init(), np.float32) for i in range(3)])
    order = np.concatenate([np.arange(len(ids))[i::3] for i in range(3)])
    assert np.array_equal(parts, whole[order])               # any batch, any order: the same rows
    assert not np.array_equal(whole, initial_rows(name_seed("u"), ids, 16, Init(), np.float32))
    assert len({row.tobytes() for row in whole}) == len(ids)


@pytest.mark.parametrize("init,mean,std", [(Init("normal", 1.0), 0.0, 1.0), (Init("uniform", 0.5), 0.0, 0.5 / 3 ** 0.5),
                                           (Init("normal", 0.01), 0.0, 0.01)])
def test_first_values_have_the_distribution_asked_for(init, mean, std):
    rows = initial_rows(name_seed("dist"), np.arange(20000), 8, init, np.float64)
    assert abs(rows.mean() - mean) < 0.02 * std and abs(rows.std() - std) < 0.02 * std
    if init.kind == "uniform":
        assert np.abs(rows).max() <= init.scale
    assert not initial_rows(name_seed("z"), np.arange(5), 4, Init("zeros"), np.float32).any()


@pytest.mark.parametrize("ids", [np.arange(40000), np.arange(0, 4 * 40000, 4), np.arange(-20000, 20000) * 2**32],
                         ids=["sequential", "multiples-of-S", "high-bits-only"])
def test_ids_spread_evenly_over_servers(ids):
    counts = np.bincount(server_of(ids, 4), minlength=4)
    assert (np.abs(counts - len(ids) / 4) < 0.03 * len(ids) / 4).all(), counts


def test_a_lookup_that_grows_the_table_returns_the_new_rows():
    table = RowTable(TableSpec("grow", 2), capacity=4)
    ids = np.arange(-50, 50) * 3
    assert np.array_equal(table.lookup(ids), initial_rows(table.seed, ids, 2, Init(), np.float32))
    assert len(table) == 100


def test_an_id_twice_in_a_lookup_gets_one_row():
    table = RowTable(TableSpec("twice", 2))
    rows = table.lookup(np.array([8, 8, -8, 8]))
    assert len(table) == 2 and np.array_equal(rows[0], rows[1]) and np.array_equal(rows[0], rows[3])
    assert sorted(table.index.find(np.array([8, -8]))) == [0, 1]


def test_sum_rows_adds_each_ids_rows_once():
    ids = np.array([5, -1, 5, 3, -1, 5])
    grads = np.arange(12, dtype=np.float32).reshape(6, 2)
    uids, sums = sum_rows(ids, grads)
    assert uids.tolist() == [-1, 3, 5]
    assert sums.tolist() == [[2 + 8, 3 + 9], [6, 7], [0 + 4 + 10, 1 + 5 + 11]]


torch = pytest.importorskip("torch")


def _sparse_steps(make_torch, row_opt, steps=8, rows=30, dim=5):
    """The same sparse gradients (duplicate ids, rows never touched) through a torch optimizer
    and a RowTable; the rows after each step."""
    rng = np.random.default_rng(1)
    spec = TableSpec("opt", dim, row_opt)
    table = RowTable(spec, capacity=4)            # grows on the way
    ids = np.arange(rows, dtype=np.int64) * 7919 - 50000
    start = initial_rows(table.seed, ids, dim, Init(), np.float32)
    weight = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = make_torch([weight])
    for step in range(steps):
        picked = rng.integers(0, rows // 2 + step, 9)       # later steps reach rows never seen
        grads = rng.standard_normal((9, dim)).astype(np.float32)
        weight.grad = torch.sparse_coo_tensor(torch.from_numpy(picked)[None], torch.from_numpy(grads), (rows, dim))
        opt.step()
        table.apply(*sum_rows(ids[picked], grads))
        seen = np.unique(picked)
        np.testing.assert_allclose(table.lookup(ids[seen]), weight.detach().numpy()[seen], rtol=0, atol=2e-6,
                                   err_msg=f"step {step + 1}")
    return table


@pytest.mark.parametrize("make_torch,row_opt", [
    (lambda p: torch.optim.SGD(p, lr=0.3), rowwise.SGD(lr=0.3)),
    (lambda p: torch.optim.Adagrad(p, lr=0.2, lr_decay=0.1, initial_accumulator_value=0.5),
     rowwise.Adagrad(lr=0.2, lr_decay=0.1, initial_accumulator_value=0.5)),
    (lambda p: torch.optim.SparseAdam(p, lr=0.05, betas=(0.8, 0.99)), rowwise.Adam(lr=0.05, betas=(0.8, 0.99))),
], ids=["sgd", "adagrad", "sparse-adam"])
def test_row_optimizers_make_torchs_sparse_updates(make_torch, row_opt):
    with torch.sparse.check_sparse_tensor_invariants():     # (without it torch warns it checks nothing)
        table = _sparse_steps(make_torch, row_opt)
    assert table.steps == 8


def test_rowwise_adagrad_keeps_one_accumulator_per_row():
    spec = TableSpec("rw", 4, rowwise.RowWiseAdagrad(lr=0.5, initial_accumulator_value=0.25))
    table = RowTable(spec)
    ids = np.array([3, 9])
    before = table.lookup(ids)
    g = np.array([[1, 1, 1, 1], [2, 0, 0, 0]], np.float32)
    table.apply(ids, g)
    acc = 0.25 + np.array([[1.0], [1.0]])                    # mean of the squares: 1 and 4/4
    np.testing.assert_allclose(table.lookup(ids), before - 0.5 * g / (np.sqrt(acc) + 1e-10), rtol=1e-6)
    assert table.state["sum"].shape[1] == 1


def test_bad_specs_are_named():
    with pytest.raises(ValueError, match="embedding_dim must be an int > 0, got 0"):
        TableSpec("t", 0)
    with pytest.raises(ValueError, match="consistency must be one of sync, async, ssp:S .*got 'ssp'"):
        TableSpec("t", 4, consistency="ssp")
    with pytest.raises(TypeError, match="optimizer must be one of ps.optim.rowwise's"):
        TableSpec("t", 4, optimizer=torch.optim.SGD)
    with pytest.raises(ValueError, match="lr must be a number > 0, got -1"):
        rowwise.SGD(lr=-1)
    with pytest.raises(ValueError, match="unknown row optimizer 'lamb'"):
        rowwise.from_spec({"name": "lamb", "params": {}})
    with pytest.raises(ValueError, match="has no parameter momentum"):
        rowwise.from_spec({"name": "sgd", "params": {"momentum": 0.9}})
    spec = TableSpec("t", 4, rowwise.Adam(lr=0.1))
    assert TableSpec.from_wire(spec.to_wire()) == spec
    assert "dimension 4; this declaration asks for 8" in spec.mismatch(TableSpec("t", 8, rowwise.Adam(lr=0.1)))


def test_a_table_alone_checks_ids_and_gradients():
    table = LocalTable(TableSpec("alone", 3))
    with pytest.raises(TypeError, match="ids must be integers, got dtype float64"):
        table.pull(np.array([1.0]))
    with pytest.raises(ValueError, match="ids must be distinct"):
        table.pull(np.array([4, 4]))
    with pytest.raises(ValueError, match=r"gradients of shape \(2, 4\) for 2 ids; table 'alone' wants \(2, 3\)"):
        table.push(np.array([1, 2]), np.zeros((2, 4), np.float32))
    with pytest.raises(TypeError, match="gradients of dtype float64; table 'alone' holds float32"):
        table.push(np.array([1, 2]), np.zeros((2, 3)))


def _trained(spec, steps, seed=0):
    table = LocalTable(spec)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = np.unique(rng.integers(-1000, 1000, 50))
        table.push(ids, rng.standard_normal((len(ids), spec.dim)).astype(np.float32))
    return table


def test_a_saved_table_loads_with_its_rows_state_and_steps(tmp_path):
    from ps.embed import checkpoint
    spec = TableSpec("ckpt", 4, rowwise.Adam(lr=0.1))
    table = _trained(spec, 5)
    assert checkpoint.save(table, tmp_path / "full") == len(table.rows)
    _trained_more = np.random.default_rng(9)
    ids = np.unique(_trained_more.integers(-1000, 1000, 30))
    table.push(ids, np.ones((len(ids), 4), np.float32))
    assert checkpoint.save(table, tmp_path / "incr", incremental=True) == len(ids)     # only what changed
    fresh = LocalTable(spec)
    checkpoint.load(fresh, tmp_path / "full")
    checkpoint.load(fresh, tmp_path / "incr")
    probe = np.arange(-1000, 1000)
    assert np.array_equal(fresh.pull(probe), table.pull(probe))
    assert fresh.rows.steps == table.rows.steps == 6
    for name in ("exp_avg", "exp_avg_sq"):
        mine = fresh.rows.state[name][fresh.rows.index.find(ids)]
        assert np.array_equal(mine, table.rows.state[name][table.rows.index.find(ids)])
    with pytest.raises(FileExistsError):
        checkpoint.save(table, tmp_path / "full")
    with pytest.raises(FileNotFoundError, match="holds no saved table"):
        checkpoint.load(fresh, tmp_path / "nothing")
    with pytest.raises(ValueError, match="has dim 4; table 'other' has 8"):
        checkpoint.load(LocalTable(TableSpec("other", 8, rowwise.Adam())), tmp_path / "full")
    with pytest.raises(ValueError, match=r"optimizer state \['exp_avg', 'exp_avg_sq'\], this table's optimizer "
                                         r"keeps \['sum'\]"):
        checkpoint.load(LocalTable(TableSpec("ada", 4, rowwise.Adagrad())), tmp_path / "full")


def test_a_restarted_worker_skips_a_save_its_dead_self_made_and_redoes_one_it_cut_short(tmp_path, caplog):
    """A restart (``--max-restarts``) re-running its script: a whole save of this table is its
    dead self's and stays (the table trained on since); a directory of row files alone is a save
    it died in, made again; anything else in the way is refused as for any worker."""
    from ps.embed import checkpoint
    spec = TableSpec("ckpt", 4, rowwise.Adagrad(lr=0.1))
    table = _trained(spec, 3)
    rows = checkpoint.save(table, tmp_path / "whole")
    before = (tmp_path / "whole" / "rows-00000.npz").read_bytes()
    table.push(np.arange(5), np.ones((5, 4), np.float32))
    table.restarted = True
    assert checkpoint.save(table, tmp_path / "whole") == rows
    assert (tmp_path / "whole" / "rows-00000.npz").read_bytes() == before
    assert "holds the save of table 'ckpt' this worker's dead self made" in caplog.text
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "rows-00000.npz").write_bytes(b"half a file")
    assert checkpoint.save(table, cut) == len(table.rows)
    fresh = LocalTable(spec)
    checkpoint.load(fresh, cut)
    probe = np.arange(-1000, 1000)
    assert np.array_equal(fresh.pull(probe), table.pull(probe))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        checkpoint.save(table, other)
    assert (other / "notes.txt").read_text() == "mine"


# -- a server's rounds, entry by entry ----------------------------------------------------
W0, W1 = worker_id(0), worker_id(1)


_push, _pull = table_push, table_pull


def test_a_sync_round_applies_the_workers_mean_once_all_pushed():
    tables = Tables(num_workers=2)
    spec = TableSpec("s", 2, rowwise.SGD(lr=1.0))
    tables.declare({"spec": spec.to_wire()})
    [first] = tables.handle(W0, *_pull(spec, [7, -3]))
    start = first.data.reshape(2, 2).copy()
    assert tables.handle(W0, *_push(spec, 1, [7], [[2, 4]])) == []          # waits for worker 1
    assert tables.handle(W1, *_push(spec, 1, [7, -3], [[2, 0], [6, 6]], total=3)) == []   # a chunk of 2 of 3 rows
    replies = tables.handle(W1, *_push(spec, 1, [11], [[1, 1]], off=2, total=3))
    assert sorted(r.dest for r in replies) == [W0, W1] and all(r.entry.error is None for r in replies)
    [after] = tables.handle(W0, *_pull(spec, [7, -3]))
    np.testing.assert_allclose(after.data.reshape(2, 2), start - np.array([[2, 2], [3, 3]]))
    # a push resent for a round already applied is answered, not applied again
    [again] = tables.handle(W0, *_push(spec, 1, [7], [[2, 4]]))
    assert again.entry.error is None
    assert tables.tables[spec.key].rows.steps == 1


def test_a_sync_round_sums_its_workers_rows_in_rank_order_whatever_order_they_came_in():
    """Float addition of three rows of one id depends on its order (1e8, 1 and -1e8 sum to 0 or
    to 1 in float32). Summed in the order the pushes came, two runs of one job (or a killed run
    and its reference) differed by that rounding; by rank they are bit-identical."""
    spec = TableSpec("order", 1, rowwise.SGD(lr=1.0), Init("zeros"))
    grads = {worker_id(0): 1e8, worker_id(1): 1.0, worker_id(2): -1e8}
    after = []
    for arrival in ([0, 1, 2], [1, 0, 2], [2, 1, 0], [1, 2, 0]):
        tables = Tables(num_workers=3)
        tables.declare({"spec": spec.to_wire()})
        for rank in arrival:
            tables.handle(worker_id(rank), *_push(spec, 1, [5], [[grads[worker_id(rank)]]]))
        [row] = tables.handle(W0, *_pull(spec, [5], seq=1))
        after.append(float(row.data[0]))
    assert len(set(after)) == 1, after


def test_a_worker_that_closed_its_store_no_longer_holds_rounds_back():
    tables = Tables(num_workers=2)
    spec = TableSpec("c", 1)
    tables.declare({"spec": spec.to_wire()})
    assert tables.handle(W0, *_push(spec, 1, [1], [[1]])) == []
    replies = tables.worker_closed(W1)
    assert [r.dest for r in replies] == [W0]


def test_a_stalled_sync_round_is_named_once_with_the_worker_it_waits_for():
    tables = Tables(num_workers=2)
    spec = TableSpec("slow", 1)
    tables.declare({"spec": spec.to_wire()})
    tables.handle(W0, *_push(spec, 1, [1], [[1]]))
    assert tables.stalls(60.0) == []
    [stall] = tables.stalls(0.0)
    assert (stall.table, stall.round, stall.missing, stall.waiting, stall.what) == ("slow", 1, (W1,), (W0,),
                                                                                     "sync round")
    assert tables.stalls(0.0) == []                  # named once
    assert tables.resumed() == []
    tables.handle(W1, *_push(spec, 1, [2], [[1]]))
    assert [s.round for s in tables.resumed()] == [1]


def test_under_ssp_a_pull_waits_only_while_its_worker_is_more_than_s_pushes_ahead():
    tables = Tables(num_workers=2)
    spec = TableSpec("ssp", 1, rowwise.SGD(lr=1.0), Init("zeros"), consistency="ssp:1")
    tables.declare({"spec": spec.to_wire()})

    def pull(worker, clock):
        entry, rows = _pull(spec, [5])
        return tables.handle(worker, entry._replace(seq=clock), rows)

    assert len(pull(W0, 0)) == 1 and len(pull(W0, 1)) == 1     # worker 1 has pushed 0 times: 1 - 1 = 0
    assert len(tables.handle(W0, *_push(spec, 1, [5], [[1]]))) == 1      # applied at once, as it is
    assert len(tables.handle(W0, *_push(spec, 2, [5], [[1]]))) == 1
    assert pull(W0, 2) == []                                    # 2 ahead of worker 1: it waits
    [stall] = tables.stalls(0.0)
    assert (stall.table, stall.round, stall.missing, stall.waiting, stall.what) == ("ssp", 2, (W1,), (W0,),
                                                                                     "ssp pull at step")
    replies = tables.handle(W1, *_push(spec, 1, [5], [[1]]))
    assert [r.dest for r in replies] == [W1, W0]                # its push, then the held pull
    assert replies[1].data.tolist() == [-3.0]
    assert [s.round for s in tables.resumed()] == [2]
    assert pull(W0, 3) == []
    assert [r.dest for r in tables.worker_closed(W1)] == [W0]  # nobody left to wait for
    with pytest.raises(ValueError, match="ssp:S"):
        TableSpec("bad", 1, consistency="ssp:x")


def test_async_pushes_apply_as_they_come():
    tables = Tables(num_workers=2)
    spec = TableSpec("a", 1, rowwise.SGD(lr=1.0), Init("zeros"), consistency="async")
    tables.declare({"spec": spec.to_wire()})
    assert len(tables.handle(W0, *_push(spec, 1, [5], [[2]]))) == 1
    [rows] = tables.handle(W1, *_pull(spec, [5]))
    assert rows.data.tolist() == [-2.0]


def test_a_server_names_what_is_wrong_with_a_table_request():
    tables = Tables(num_workers=1)
    spec = TableSpec("e", 4)
    [unknown] = tables.handle(W0, *_pull(spec, [1]))
    assert unknown.entry.error[0] == "KeyError" and "declare it first" in unknown.entry.error[1]
    tables.declare({"spec": spec.to_wire()})
    entry, rows = _pull(spec, [1])
    [wrong] = tables.handle(W0, entry._replace(row_len=3), rows)
    assert "table 'e' has dimension 4, the request 3" in wrong.entry.error[1]
    with pytest.raises(ValueError, match="exists with dimension 4; this declaration asks for 5"):
        tables.declare({"spec": TableSpec("e", 5).to_wire()})


def test_table_entries_cross_the_wire_with_any_int64_id():
    spec = TableSpec("w", 3)
    entry, rows = _push(spec, 1, EXTREMES, np.arange(21).reshape(7, 3))
    msg = Message(Command.DATA, 9, 8, [entry], [rows.ids, rows.values])
    back = decode(encode(msg))
    assert back.body[0] == entry
    assert back.frames[0].ids.tolist() == EXTREMES.tolist() and back.frames[0].values.tolist() == list(range(21))



# -- limits: capacity, eviction, admission ----------------------------------------------------
def test_at_capacity_the_least_recently_used_rows_go_first_and_the_index_stays_right():
    from ps.embed import Limits
    table = RowTable(TableSpec("lru", 2, rowwise.SGD(lr=1.0), Init("zeros"), limits=Limits(capacity=100)), capacity=8)
    table.lookup(np.arange(100))
    table.apply(np.arange(50, 100), np.ones((50, 2), np.float32))       # rows 50..99 used later
    table.lookup(np.arange(1000, 1005))                                  # 5 new: a tenth (10) goes
    assert len(table) == 95 and table.evicted == 10
    gone = np.arange(100)[table.index.find(np.arange(100)) < 0]
    assert len(gone) == 10 and (gone < 50).all()                         # among the least recently used
    kept = np.r_[np.setdiff1d(np.arange(100), gone), np.arange(1000, 1005)]
    rows = table.index.find(kept)
    assert (rows >= 0).all() and np.array_equal(table.ids[rows], kept)
    assert np.array_equal(table.lookup(np.arange(50, 53)), -np.ones((3, 2)))   # their updates kept
    assert not table.lookup(gone[:3]).any()                              # back as new rows: zeros


def test_lfu_keeps_the_rows_used_most():
    from ps.embed import Limits
    table = RowTable(TableSpec("lfu", 1, limits=Limits(capacity=20, evict="lfu")))
    table.lookup(np.arange(20))
    for _ in range(3):
        table.lookup(np.arange(0, 20, 2))                                # the even ids, often
    table.lookup(np.array([99]))
    gone = np.arange(20)[table.index.find(np.arange(20)) < 0]
    assert len(gone) == 2 and (gone % 2 == 1).all()


def test_rows_not_touched_for_evict_after_steps_go():
    from ps.embed import Limits
    table = RowTable(TableSpec("age", 1, limits=Limits(evict_after=4)))
    table.lookup(np.array([1, 2]))
    for _ in range(8):
        table.apply(np.array([1]), np.ones((1, 1), np.float32))
    assert table.index.find(np.array([1, 2])).tolist()[1] == -1 and table.index.find(np.array([1]))[0] >= 0
    assert table.evicted == 1


def test_an_id_gets_a_row_on_its_kth_lookup_and_its_gradients_count_only_then():
    from ps.embed import Limits
    spec = TableSpec("admit", 2, rowwise.SGD(lr=1.0), Init("uniform", 1.0), limits=Limits(admit_after=3))
    table = RowTable(spec)
    first = initial_rows(table.seed, np.array([7]), 2, spec.init, np.float32)
    for _ in range(2):
        assert np.array_equal(table.lookup(np.array([7])), first)
        table.apply(np.array([7]), np.ones((1, 2), np.float32))        # dropped: not admitted yet
    assert len(table) == 0 and table.not_admitted == 2 and table.dropped == 2
    assert np.array_equal(table.lookup(np.array([7])), first)           # the 3rd: admitted now
    table.apply(np.array([7]), np.ones((1, 2), np.float32))
    assert len(table) == 1 and np.array_equal(table.lookup(np.array([7])), first - 1)
    with pytest.raises(ValueError, match="admit_after must be an int >= 1, got 0"):
        Limits(admit_after=0)
    with pytest.raises(ValueError, match="evict must be one of lru, lfu, got 'fifo'"):
        Limits(evict="fifo")
    assert TableSpec.from_wire(spec.to_wire()) == spec


def test_an_exported_table_serves_its_rows_and_the_training_rows_of_ids_it_never_held(tmp_path):
    from ps.embed import Rows, export
    spec = TableSpec("serve", 4, rowwise.Adagrad(lr=0.1), Init("normal", 0.1))
    table = _trained(spec, 5)
    assert export(table, tmp_path / "out") == len(table.rows)
    served = Rows(tmp_path / "out")
    probe = np.array([[-1000, 5, 2**62], [999, -7, 123456]])      # some never pushed, some never seen
    got = served.lookup(probe)
    assert got.shape == (2, 3, 4)
    # the table makes an unseen id's row as training would have: the same values
    assert np.array_equal(got.reshape(-1, 4), table.pull(probe.reshape(-1)))
    assert np.array_equal(Rows(tmp_path / "out", missing="zeros").lookup([2**62 - 1]), np.zeros((1, 4), np.float32))
    with pytest.raises(KeyError, match=r"holds no row for 1 of the ids, e.g. \[4611686018427387903\]"):
        Rows(tmp_path / "out", missing="error").lookup([served.ids[0], 2**62 - 1])
    with pytest.raises(TypeError, match="ids must be integers, got dtype float64"):
        served.lookup([1.5])
    with pytest.raises(FileExistsError):
        export(table, tmp_path / "out")
    from ps.embed import save
    save(table, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="is not a serving export"):
        Rows(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="missing must be one of init, zeros, error, got 'nan'"):
        Rows(tmp_path / "out", missing="nan")


def test_an_incremental_save_holds_the_rows_updated_while_the_last_save_was_under_way():
    """async: another worker's push lands between two chunks of a save. The rows it updated
    (one already written, one new) belong to the next incremental save. Before, the end of a
    save cleared every row's mark, and the full save plus the incremental one missed them."""
    spec = TableSpec("inc", 2, rowwise.SGD(lr=1.0), Init("zeros"), consistency="async")
    tables = Tables(num_workers=2)
    tables.declare({"spec": spec.to_wire()})
    widths = {k: w for k, (w, _) in spec.optimizer.state(spec.dim).items()}
    tables.handle(W0, *_push(spec, 1, [1, 2, 3], np.ones((3, 2), np.float32)))

    def save(changed, meanwhile=None):
        got, after, more = {}, None, True
        while more:
            reply = tables.export({"name": "inc", "after": after, "count": 1, "changed": changed})
            chunk = chunk_from_wire(reply, spec, widths)
            got.update({int(i): v.copy() for i, v in zip(chunk.ids, chunk.values)})
            more = reply["more"] and len(chunk.ids) > 0
            after = int(chunk.ids[-1]) if len(chunk.ids) else after
            if meanwhile is not None:
                meanwhile()
                meanwhile = None
        tables.saved({"name": "inc"})
        return got

    full = save(False, lambda: tables.handle(W1, *_push(spec, 1, [1, 7], np.ones((2, 2), np.float32))))
    incremental = save(True)
    assert sorted(incremental) == [1, 7]
    both = {**full, **incremental}
    for i in (1, 2, 3, 7):
        [row] = tables.handle(W0, *_pull(spec, [i], seq=1))
        assert np.array_equal(both[i], row.data.reshape(2)), i
    assert save(True) == {}                                 # nothing updated since


def test_a_checkpoint_of_another_optimizer_is_refused_by_name_on_a_server():
    spec = TableSpec("opt", 4, rowwise.SGD(lr=0.1))
    tables = Tables(num_workers=1)
    tables.declare({"spec": spec.to_wire()})
    adam = LocalTable(TableSpec("opt", 4, rowwise.Adam(lr=0.1)))
    adam.push(np.arange(3), np.ones((3, 4), np.float32))
    [chunk] = adam.chunks(changed_only=False)
    with pytest.raises(ValueError, match=r"the checkpoint holds optimizer state \['exp_avg', 'exp_avg_sq'\], "
                                         r"this table's optimizer keeps \[\]"):
        tables.put({"name": "opt", **chunk_to_wire(chunk)})


def test_a_save_that_fails_or_is_skipped_still_ends_the_servers_hold_on_evictions(tmp_path):
    """The servers hold evictions while a save is under way, until it ends. A restart that
    skips the save its dead self wrote ends it (its dead self may have died before it did) as
    abandoned: the save under way on the servers may be a later one its dead self died in, and
    counting that one's start as saved would leave its rows out of the redone save. A save that
    fails ends it as abandoned too."""
    from ps.embed import checkpoint

    class Recorded(LocalTable):
        ended: list

        def mark_saved(self, completed=True):
            self.ended.append(completed)
            super().mark_saved(completed)

    table = Recorded(TableSpec("held", 2, rowwise.SGD(lr=0.1)))
    table.ended = []
    table.push(np.arange(4), np.ones((4, 2), np.float32))
    checkpoint.save(table, tmp_path / "whole")
    table.restarted = True
    checkpoint.save(table, tmp_path / "whole")
    assert table.ended == [True, False]         # ended, not completed: its start counts for nothing

    def broken(changed_only):
        raise OSError("disk full")
        yield
    table.chunks = broken
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(table, tmp_path / "failed")
    assert table.ended == [True, False, False]
