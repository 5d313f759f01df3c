"""Embedding tables through a whole cluster in this process (ps.testing.local_cluster): what
the pure tests of tests/unit/test_embed.py cannot show, requests cut into chunks and put back
together."""
import numpy as np
import pytest

from ps.embed import Init, TableSpec, initial_rows
from ps.embed.hashing import name_seed
from ps.optim import rowwise
from ps.testing import local_cluster


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_pull_and_a_push_of_many_rows_travel_in_chunks_and_come_back_whole():
    """Over 16,384 rows of dimension 16 a request is cut into chunks of about 1 MiB each way;
    the rows come back in the order asked, whatever server and chunk they came from."""
    spec = TableSpec("big", 16, rowwise.SGD(lr=1.0), Init("uniform", 1.0))
    ids = np.unique(np.random.default_rng(2).integers(-(2**62), 2**62, 40000))
    with local_cluster(num_servers=2, num_workers=1) as c:
        def job(kv):
            table = kv.table(spec)
            first = table.pull(ids)
            table.push(ids, np.ones((len(ids), 16), np.float32))
            return first, table.pull(ids[::-1])
        [(first, after)] = c.run(job)
    want = initial_rows(name_seed("big"), ids, 16, Init("uniform", 1.0), np.float32)
    assert np.array_equal(first, want)
    assert np.array_equal(after, (want - 1.0)[::-1])


@pytest.mark.process
@pytest.mark.timeout(60)
def test_each_server_keeps_its_capacity_and_says_what_it_evicted():
    from ps.embed import Limits
    spec = TableSpec("capped", 4, limits=Limits(capacity=1000, admit_after=2))
    with local_cluster(num_servers=2, num_workers=1) as c:
        def job(kv):
            table = kv.table(spec)
            for start in range(0, 6000, 500):
                batch = np.arange(start, start + 500)
                table.pull(batch)
                table.pull(batch)                   # the second sighting admits them
            return kv.server_command("stats")
        [stats] = c.run(job)
    for server in stats.values():
        s = server["tables"]["capped"]
        assert s["rows"] <= 1000 and s["evicted"] > 0 and s["not_admitted"] > 0, stats
    assert sum(server["tables"]["capped"]["created"] for server in stats.values()) >= 6000


@pytest.mark.process
@pytest.mark.timeout(90)
@pytest.mark.parametrize("consistency", ["sync", "ssp:1"])
def test_a_worker_in_horovods_join_holds_no_table_round_back_and_trains_on_after_it(consistency):
    """Uneven data: worker 0 pushes once and joins; worker 1 pushes three times more, then
    joins; both push once after. Worker 0's share of the rounds it missed is zero (as Horovod's
    allreduce counts a joined rank), and after the join its pushes count with worker 1's again.
    Before, worker 1's second push waited for worker 0's for ever (sync: the round; ssp: the
    staleness bound)."""
    spec = TableSpec("uneven", 2, rowwise.SGD(lr=1.0), Init("zeros"), consistency=consistency)
    ids = np.array([3, -8])
    with local_cluster(num_servers=2, num_workers=2, timeout=60) as c:
        def job(kv):
            table = kv.table(spec)
            grad = np.full((2, 2), 1.0 + kv.rank, np.float32)     # worker 0: 1, worker 1: 2
            for _ in range(1 if kv.rank == 0 else 4):
                table.pull(ids)
                table.push(ids, grad, block=True)
            last = kv.join(timeout=30).last
            table.pull(ids)
            table.push(ids, grad, block=True)
            kv.barrier()
            return last, table.pull(ids)
        results = c.run(job)
    assert [r[0] for r in results] == [1, 1]
    if consistency == "sync":       # mean of each round over both workers, a joined one's share zero
        want = -((1 + 2) / 2 + 3 * (2 / 2) + (1 + 2) / 2)
    else:                           # ssp: each push applied as it comes
        want = -(1 + 4 * 2 + 1 + 2)
    for _, rows in results:
        np.testing.assert_allclose(rows, np.full((2, 2), want, np.float32), rtol=0, atol=1e-6)
