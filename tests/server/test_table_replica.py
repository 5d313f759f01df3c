"""A backup's copy of a server's embedding tables (ps/server/tables.py, replayed by
ps/server/replica.py's Mirror) holds the primary's rows and optimizer state bit for bit,
follows its evictions, and a restart restored from it goes on exactly like the primary; a
push sent again (to that restart, or by a restarted worker) is applied once."""
import itertools

import numpy as np
import pytest

from ps.embed import Init, Limits, TableSpec
from ps.embed.table import chunk_from_wire
from ps.message import worker_id
from ps.optim import rowwise
from ps.server.replica import Mirror, decode_events, encode_events, restore, snapshot
from ps.server.store import Store
from ps.server.tables import Tables
from tests.helpers import table_pull, table_push

W0, W1 = worker_id(0), worker_id(1)


_push, _pull = table_push, table_pull


def _batch(rnd, worker, dim, n=40, span=300):
    rng = np.random.default_rng(1000 * rnd + worker)
    ids = np.unique(rng.integers(-span, span, n)).astype(np.int64)
    return ids, rng.standard_normal((len(ids), dim)).astype(np.float32)


class Primary:
    """A server's Tables with a journal, shipped through the wire format to a backup's Mirror."""

    def __init__(self, *specs):
        self.store = Store(2)
        self.store.journal = []
        self.tables = Tables(2, journal=lambda: self.store.journal)
        self.mirror = Mirror(8)
        for spec in specs:
            self.tables.declare({"spec": spec.to_wire()})
        self.ship()

    def ship(self):
        body, frames = encode_events(self.store.journal)
        self.store.journal.clear()
        self.mirror.apply(decode_events(body, [memoryview(f) for f in frames]))


def _rows(tables, spec):
    """Every row a table holds, by id: values and optimizer state, and the changed marks."""
    tables.settle()
    rows = tables.tables[spec.key].rows
    n = len(rows)
    order = np.argsort(rows.ids[:n])
    return (rows.ids[:n][order], rows.values[:n][order], {k: v[:n][order] for k, v in rows.state.items()},
            rows.updated[:n][order], (rows.steps, rows.saved_at))


def _same(a, b, spec):
    ids_a, val_a, st_a, ch_a, steps_a = _rows(a, spec)
    ids_b, val_b, st_b, ch_b, steps_b = _rows(b, spec)
    np.testing.assert_array_equal(ids_a, ids_b)
    assert val_a.tobytes() == val_b.tobytes()
    assert st_a.keys() == st_b.keys() and all(st_a[k].tobytes() == st_b[k].tobytes() for k in st_a)
    np.testing.assert_array_equal(ch_a, ch_b)
    assert steps_a == steps_b


def _train(p, spec, rounds, start=1, consistency_sync=True):
    for rnd in range(start, start + rounds):
        for w in (W0, W1):
            ids, grads = _batch(rnd, w, spec.dim)
            p.tables.handle(w, *_pull(spec, ids, rnd - 1))
            p.tables.handle(w, *_push(spec, rnd, ids, grads))
        p.ship()


SPECS = {
    "sync adam": TableSpec("a", 4, rowwise.Adam(lr=0.01)),
    "sync rowwise-adagrad, lru capacity": TableSpec("b", 3, rowwise.RowWiseAdagrad(lr=0.1),
                                                    limits=Limits(capacity=200)),
    "async adagrad, lfu capacity, admission": TableSpec("c", 2, rowwise.Adagrad(lr=0.1), consistency="async",
                                                        limits=Limits(capacity=150, evict="lfu", admit_after=2)),
    "ssp sgd, eviction by age": TableSpec("d", 5, rowwise.SGD(lr=0.5), Init("zeros"), consistency="ssp:2",
                                          limits=Limits(evict_after=4)),
    "async sgd": TableSpec("e", 3, rowwise.SGD(lr=0.5), consistency="async"),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_the_copy_holds_the_primarys_rows_and_state_bit_for_bit(name):
    spec = SPECS[name]
    p = Primary(spec)
    _train(p, spec, 12)
    _same(p.tables, p.mirror.tables, spec)
    if spec.limits.capacity or spec.limits.evict_after:
        assert p.tables.tables[spec.key].rows.evicted > 0      # the copy followed real evictions


@pytest.mark.parametrize("name", list(SPECS))
def test_a_restart_restored_from_the_copy_goes_on_exactly_like_the_primary(name):
    spec = SPECS[name]
    p = Primary(spec)
    _train(p, spec, 6)
    p.tables.saved({"name": spec.name})           # incremental-save marks travel too
    p.ship()
    _train(p, spec, 3, start=7)
    body, frames = encode_events(snapshot(Store(2), p.mirror.tables))
    restarted = Tables(2)
    restore(Store(2), decode_events(body, frames), restarted)
    _same(p.tables, restarted, spec)
    served = p.tables.tables[spec.key]
    assert restarted.tables[spec.key].closed == served.closed and restarted.tables[spec.key].clocks == served.clocks
    # both go on with the same pushes: exactly, for a table without limits (with them, the
    # restart's use counts and admission counts start again, so it may evict other rows)
    twin = Primary(spec)
    twin.tables = restarted
    if spec.limits == Limits():
        _train(p, spec, 4, start=10)
        _train(twin, spec, 4, start=10)
        _same(p.tables, restarted, spec)


def test_a_snapshot_of_a_big_table_travels_in_chunks():
    spec = TableSpec("big", 16, rowwise.Adam(lr=0.01))
    tables = Tables(1)
    tables.declare({"spec": spec.to_wire()})
    tables.handle(W0, *_pull(spec, np.arange(200_000)))
    data = [e for e in tables.snapshot() if e.kind == "tdata"]
    assert len(data) > 1 and sum(len(e.arrays[0]) for e in data) == 200_000


def test_a_sync_push_sent_again_is_applied_once():
    spec = TableSpec("s", 1, rowwise.SGD(lr=1.0), Init("zeros"))
    tables = Tables(2)
    tables.declare({"spec": spec.to_wire()})
    value = lambda: tables.handle(W0, *_pull(spec, [5]))[0].data.tolist()   # noqa: E731
    # worker 0's whole push, then its restart sends it again (new ts): answered at the close, once
    assert tables.handle(W0, *_push(spec, 1, [5], [[2]], ts=1)) == []
    assert tables.handle(W0, *_push(spec, 1, [5], [[2]], ts=7)) == []
    # worker 1 had sent 2 of 3 rows when it died; its restart sends all three again
    assert tables.handle(W1, *_push(spec, 1, [5, 6], [[4], [9]], total=3)) == []
    assert tables.handle(W1, *_push(spec, 1, [5, 6], [[4], [1]], total=3)) == []
    replies = tables.handle(W1, *_push(spec, 1, [7], [[1]], off=2, total=3))
    assert sorted((r.dest, r.entry.ts) for r in replies) == [(W0, 7), (W1, 1)]
    assert value() == [-3.0]                                    # the mean of 2 and 4, once
    assert tables.pushed(W0) == {spec.key: 1}
    # a closed round's push sent again: answered now, not applied; only at its last chunk
    assert tables.handle(W0, *_push(spec, 1, [5], [[2]], total=2)) == []
    [again] = tables.handle(W0, *_push(spec, 1, [6], [[2]], off=1, total=2))
    assert again.entry.error is None and value() == [-3.0]


def test_an_async_push_sent_again_is_applied_once():
    spec = TableSpec("a", 1, rowwise.SGD(lr=1.0), Init("zeros"), consistency="async")
    tables = Tables(2)
    tables.declare({"spec": spec.to_wire()})
    assert len(tables.handle(W0, *_push(spec, 1, [5], [[2]]))) == 1
    [again] = tables.handle(W0, *_push(spec, 1, [5], [[2]]))
    assert again.entry.error is None
    assert tables.handle(W0, *_pull(spec, [5]))[0].data.tolist() == [-2.0]
    assert tables.pushed(W0) == {spec.key: 1} and tables.pushed(W1) == {spec.key: 0}


@pytest.mark.parametrize("consistency", ["async", "ssp:1"])
def test_a_push_with_no_rows_on_this_server_still_moves_the_workers_clock_in_the_copy(consistency):
    """A worker pushes to every server of a table, with no rows where its batch has none. That
    push counts (an ssp pull waits for it): a restart restored from the copy counts it too."""
    spec = TableSpec("e", 2, rowwise.SGD(lr=1.0), Init("zeros"), consistency=consistency)
    p = Primary(spec)
    assert len(p.tables.handle(W0, *_push(spec, 1, [5], [[2, 2]]))) >= 1
    assert len(p.tables.handle(W0, *_push(spec, 2, [], np.zeros((0, 2), np.float32)))) >= 1
    p.ship()
    body, frames = encode_events(snapshot(Store(2), p.mirror.tables))
    restarted = Tables(2)
    restore(Store(2), decode_events(body, frames), restarted)
    assert p.tables.tables[spec.key].clocks == {W0: 2}
    assert restarted.tables[spec.key].clocks == {W0: 2}
    assert restarted.pushed(W0) == {spec.key: 2}
    _same(p.tables, restarted, spec)


@pytest.mark.parametrize("changed", [False, True])
def test_a_save_that_a_server_restart_interrupts_writes_every_row_once(changed):
    """The worker saving a table got some chunks from the primary, which then died; the restart
    (restored from the copy, its rows in another order) gives the rest. By id, every row comes
    once, as the primary held it. Before, the save went on by row number: rows twice and rows
    missed."""
    spec = SPECS["sync adam"]
    p = Primary(spec)
    _train(p, spec, 4)
    if changed:                                   # an incremental save: rows updated since the last
        p.tables.saved({"name": spec.name})
        p.ship()
        _train(p, spec, 2, start=5)
    want = _rows(p.tables, spec)
    want_ids = want[0][want[3] > p.tables.tables[spec.key].rows.saved_at] if changed else want[0]
    widths = {k: w for k, (w, _) in spec.optimizer.state(spec.dim).items()}

    def chunk(tables, after):
        reply = tables.export({"name": spec.name, "after": after, "count": 50, "changed": changed})
        return reply, chunk_from_wire(reply, spec, widths)

    got = []
    reply, first = chunk(p.tables, None)          # the primary's first chunk, then it dies
    got.append(first)
    body, frames = encode_events(snapshot(Store(2), p.mirror.tables))
    restarted = Tables(2)
    restore(Store(2), decode_events(body, frames), restarted)
    assert not np.array_equal(restarted.tables[spec.key].rows.ids[:len(want[0])], p.tables.tables[spec.key].rows.ids[
        :len(want[0])])                           # the restart's rows are in another order
    while reply["more"]:
        reply, more = chunk(restarted, int(got[-1].ids[-1]))
        got.append(more)
    ids = np.concatenate([c.ids for c in got])
    assert len(got) > 2 and len(ids) == len(want_ids)
    np.testing.assert_array_equal(ids, want_ids)           # each once, in id order
    values = np.concatenate([c.values for c in got])
    order = np.searchsorted(want[0], ids)
    assert values.tobytes() == want[1][order].tobytes()


def test_a_copy_keeps_up_with_its_primary_however_long_a_rounds_rows_take_to_apply():
    """The backup applies a replica message's table events after it, and a snapshot's backlog
    a budget's worth at a time. With no time to spare (budget 0), the events a message brought
    are applied still: the queue does not grow round after round. Before, the budget bounded
    the work, so rows that took longer than it to apply piled up for good."""
    specs = SPECS["sync adam"], SPECS["async sgd"]
    p = Primary(*specs)
    copy = p.mirror.tables
    backlogs = []
    for rnd in range(1, 9):
        _train(p, specs[0], 1, start=rnd)
        _train(p, specs[1], 1, start=rnd)
        copy.work(0.0)
        backlogs.append(copy.backlog)
    assert backlogs == [0] * 8
    for spec in specs:
        _same(p.tables, copy, spec)
    # a new backup's snapshot is worked off a budget at a time while the primary's rounds go on
    big = TableSpec("big", 16, rowwise.Adam(lr=0.01))
    p.tables.declare({"spec": big.to_wire()})
    p.tables.handle(W0, *_pull(big, np.arange(200_000)))
    fresh = Mirror(8)
    fresh.apply(snapshot(Store(2), p.tables))
    p.store.journal.clear()

    def ship_to_both():
        body, frames = encode_events(p.store.journal)
        p.store.journal.clear()
        for mirror in (p.mirror, fresh):
            mirror.apply(decode_events(body, [memoryview(f) for f in frames]))
    p.ship = ship_to_both
    queued = [fresh.tables.backlog]
    for rnd in range(9, 13):
        _train(p, specs[0], 1, start=rnd)
        fresh.tables.work(0.0)
        queued.append(fresh.tables.backlog)
    assert queued[0] > 4 and all(b < a for a, b in itertools.pairwise(queued)), queued
    fresh.tables.settle()
    for spec in specs:
        _same(p.tables, fresh.tables, spec)


def test_a_restart_holds_every_row_its_primary_held_past_capacity_during_a_save():
    """A save holds evictions, and another worker's async pushes take the table past its
    capacity meanwhile; the server dies mid-save. Its restart puts back every row of the copy:
    restoring is not a reason to evict (before: 100 trained rows evicted, unjournaled, so the
    save missed them and the backup's copy no longer matched)."""
    spec = TableSpec("cap", 16, rowwise.SGD(lr=0.5), Init("zeros"), consistency="async",
                     limits=Limits(capacity=600))
    p = Primary(spec)
    p.tables.handle(W0, *_push(spec, 1, np.arange(600), np.ones((600, 16), np.float32)))
    widths = {k: w for k, (w, _) in spec.optimizer.state(spec.dim).items()}
    reply = p.tables.export({"name": "cap", "after": None, "count": 50, "changed": False})
    got = [chunk_from_wire(reply, spec, widths)]
    p.tables.handle(W1, *_push(spec, 1, np.arange(600, 700), np.ones((100, 16), np.float32)))
    p.ship()
    body, frames = encode_events(p.mirror.hand_over())
    restarted = Tables(2)
    restore(Store(2), decode_events(body, frames), restarted)
    rows = restarted.tables[spec.key].rows
    assert len(rows) == 700 and rows.evicted == 0
    # a push of new ids before the saving worker asks again: the restart holds evictions, as
    # its primary did mid-save (before: 60 rows evicted, the save missed them)
    restarted.handle(W1, *_push(spec, 2, np.arange(700, 750), np.ones((50, 16), np.float32)))
    assert len(rows) == 750 and rows.evicted == 0
    while reply["more"]:
        reply = restarted.export({"name": "cap", "after": int(got[-1].ids[-1]), "count": 50, "changed": False})
        got.append(chunk_from_wire(reply, spec, widths))
    np.testing.assert_array_equal(np.concatenate([c.ids for c in got]), np.arange(750))
    restarted.saved({"name": "cap"})
    restarted.handle(W0, *_push(spec, 2, [900], np.ones((1, 16), np.float32)))
    assert len(rows) <= 600 and rows.evicted > 0       # the save over, the capacity holds again
