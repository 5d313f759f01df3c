"""Horovod's collectives beyond allreduce, made of the servers' sums (ps/torch/gather.py):
three real workers with different first dimensions, every result checked against numpy."""
import json

import numpy as np
import pytest

from tests.helpers import ROOT

from .test_torch import launch, results

pytestmark = pytest.mark.process


torch = pytest.importorskip("torch")
hvd = pytest.importorskip("ps.torch")

SCRIPT = str(ROOT / "tests" / "torch" / "collectives_worker.py")
N = 3


def rows(rank, k, cols=3):
    return np.arange(k * cols, dtype=np.float64).reshape(k, cols) + 100 * rank


def cat(parts, cols=3):
    return np.concatenate(parts) if parts else np.zeros((0, cols))


@pytest.mark.timeout(200)
def test_allgather_alltoall_reducescatter_and_min_max_product_on_three_workers(procs, tmp_path):
    timeline = tmp_path / "timeline.json"       # every rank is given it; rank 0 writes it (Horovod's rule)
    out = launch(procs, script=SCRIPT, workers=N, HOROVOD_TIMELINE=str(timeline), HOROVOD_TIMELINE_MARK_CYCLES="1")
    check_timeline(json.loads(timeline.read_text()))    # shutdown() closed it: plain JSON
    got = sorted(results(out), key=lambda r: r["rank"])
    assert [g["rank"] for g in got] == list(range(N)), out
    # the data rounds the mismatches left open were dropped: shutdown waits for none of them
    assert "closing with requests still outstanding" not in out, out
    for r, g in enumerate(got):
        assert (g["size"], g["local_rank"], g["cross_rank"], g["cross_size"], g["homogeneous"]) == (N, r, 0, 1, True)
        np.testing.assert_array_equal(g["ag"], cat([rows(k, k + 1) for k in range(N)]))
        for s, each in enumerate(g["ag_named"]):       # one name, three sizes (one rank has none)
            np.testing.assert_array_equal(np.reshape(each, (-1, 3)), cat([rows(k, (k + s) % 3) for k in range(N)]))
        assert g["ag_bool"] == [True, True, False, True, True, True]
        assert g["ag_int"] == [[k, -k, 2 ** 40 + k] for k in range(N)]
        np.testing.assert_allclose(g["ag_half"], np.repeat(np.float16([0.1, 0.2, 0.3]), 2), rtol=0, atol=0)
        assert g["ag_obj"] == [{"rank": k, "s": "x" * k} for k in range(N)]
        np.testing.assert_array_equal(g["ag_async"], cat([rows(k, 1) for k in range(N)]))
        np.testing.assert_array_equal(g["gag"][1], cat([rows(k, 2, cols=2) for k in range(N)], cols=2))

        # alltoall: rank i sends (i + j) % 3 rows to rank j, in order
        expect, received = [], []
        for i in range(N):
            splits = [(i + j) % 3 for j in range(N)]
            start = sum(splits[:r])
            expect.append(rows(i, sum(splits))[start:start + splits[r]])
            received.append(splits[r])
        np.testing.assert_array_equal(np.reshape(g["a2a"], (-1, 3)), cat(expect))
        assert g["a2a_recv"] == received and g["a2a_recv_dtype"] == "torch.int64"
        np.testing.assert_array_equal(g["a2a_even"], cat([rows(i, 2 * N)[2 * r:2 * r + 2] for i in range(N)]))

        # reducescatter of 7 rows over 3 ranks: 3, 2, 2 (the first ranks get the extra row)
        start, count = [(0, 3), (3, 2), (5, 2)][r]
        total = sum(rows(k, 7) for k in range(N))
        np.testing.assert_allclose(g["rs_avg"], (total / N)[start:start + count], rtol=1e-6)
        np.testing.assert_allclose(g["rs_sum"], total[start:start + count], rtol=1e-6)

        assert g["min"] == [0.0, -2.0, 2.0] and g["max"] == [2.0, 0.0, 4.0] and g["prod"] == [0.0, 0.0, 24.0]
        assert g["scaled"] == [6.0, 6.0]                   # (sum of 2 x (r + 1)) x 0.5
        assert g["gar"] == [[6.0, 6.0], [60.0, 60.0]]
        assert g["bcast_"] == [2.0] * 3 and g["bcast_async_"] == [1.0] * 2
        # Horovod's gradients: allgather -> this rank's rows of the averaged output gradient
        # (row k weighted k everywhere); allreduce(Sum) -> the allreduce of the output's
        # gradient (r + 1 on rank r: 6)
        first = sum(k + 1 for k in range(r))
        assert g["ag_grad"] == [[float(first + k)] * 2 for k in range(r + 1)]
        assert g["ar_grad"] == [6.0, 6.0]
        # Horovod's own rules (collectives_worker.horovods_rules)
        assert g["i16"] == [6, -6] and g["ag_i16"] == [0, 1, 2] and g["bf16"] == [1.0]
        assert g["reuse"] == [[3.0] * 2, [3.0] * 3]                     # one name, two shapes
        assert g["int_prescale"] == [9, -9]             # Horovod: 7 x 0.5 in float64, cast (3), summed
        assert r == 0 or "an operation of that name is still in flight" in g["twice"], g["twice"]
        assert g["first_use"] == [3.0, 3.0]
        assert g["gather_order"] == [[0.0, 1.0, 1.0, 2.0, 2.0, 2.0], 3.0]
        assert r != 0 or "an operation of that name is still in flight" in g["dropped"], g["dropped"]
        assert "the workers disagree on root_rank" in g["roots"], g["roots"]
        assert g["bcast_obj"] == "{'epoch': 3, 0: (1, 2), 't': tensor([0, 1, 2]), 's': {'a'}}", g["bcast_obj"]
        assert g["ag_obj_keys"] == "[{0: (0,)}, {1: (1,)}, {2: (2,)}]", g["ag_obj_keys"]
        assert g["custom"] == [6.0, 6.0]                # compressed, summed, decompressed
        assert g["sparse"] == [[1.0] * 2, [2.0] * 2, [3.0] * 2, [0.0] * 2, [3.0] * 2]
        for as_dense in (False, True):                  # rows 0-2 looked up once, row 4 by all, averaged
            for name in ("emb", "other"):        # two sparse parameters in one optimizer
                np.testing.assert_allclose(g[f"{name}_{as_dense}"], [[-1 / 3] * 2] * 3 + [[0.0] * 2, [-1.0] * 2],
                                           rtol=1e-6, err_msg=f"{name} {as_dense}")
        assert [s[0] for s in g["opt_state"]] == [1.0, 1.0] and g["params_kept"], g["opt_state"]
        assert g["opt_state"] == got[0]["opt_state"]    # the root's moments everywhere
        assert g["bcast_grad"] == ([1.0, 1.0] if r == 1 else [0.0, 0.0])
        assert g["gar_grad"] == [[3.0] * 2, [3.0] * 3]
        assert g["sync_bn"] < 1e-5, g["sync_bn"]         # SyncBatchNorm = BatchNorm1d on every row
        assert "rank 1 has another shape past the first dimension" in g["mismatch"] or \
            (r == 1 and "rank 0 has another shape" in g["mismatch"]), g["mismatch"]
        assert "tensor 'badsum' (allreduce) differs across workers" in g["mismatch_sum"], g["mismatch_sum"]
        assert "tensor 'parameters.p' (broadcast) differs" in g["mismatch_bcast"] or \
            "tensor 'p' (broadcast) differs" in g["mismatch_bcast"], g["mismatch_bcast"]
        assert g["after_mismatch"] == [3.0, 3.0]
        assert "tensor 'badgroup.0' (allreduce) differs across workers" in g["mismatch_group"], g["mismatch_group"]
        assert "the op parameter supersedes average" in g["op_and_average"], g["op_and_average"]
        check_process_sets(r, g["sets"], [got[k]["sets"] for k in range(N)])
        check_joins(r, g["join"])


def check_joins(r, j):
    """collectives_worker.joins: rank r ran r + 1 steps."""
    assert j["sums"] == [[6.0] * 2, [5.0] * 2, [3.0] * 2][:r + 1]      # step s: the ranks k >= s, k + 1 each
    assert j["last"] == 2 and j["after"] == [3.0, 3.0]
    assert j.get("avg", [1.0]) == [1.0]                                 # 3 / 3: the joined count as zeros
    # the gradient is 1 per rank and step; its average is over all 3 ranks, the joined adding 0
    np.testing.assert_allclose(j["weight"], [-sum((N - s) / N for s in range(r + 1))] * 2, rtol=1e-6)
    if r:
        assert "worker 0" in j["refused"] and "joined (hvd.join)" in j["refused"], j["refused"]
        assert "joined (hvd.join)" in j["refused_bcast"], j["refused_bcast"]


def check_process_sets(r, s, every):
    """collectives_worker.process_sets: ranks {0, 2} and {1}, side by side."""
    members = [0, 2] if r % 2 == 0 else [1]
    assert (s["id"], s["rank"], s["size"]) == ((1, members.index(r), 2) if r % 2 == 0 else (2, 0, 1))
    assert s["across_add"] == [3.0]         # begun by rank 0 before add_process_set, the others after it
    assert s["sum"] == [float(sum(k + 1 for k in members))] * 3
    assert s["avg"] == [sum(k + 1 for k in members) / len(members)] * 2
    np.testing.assert_array_equal(s["ag"], cat([rows(k, k + 1) for k in members]))
    assert s["bcast"] == [float(members[-1])] * 2 and s["obj"] == {"from": members[0]}
    me = members.index(r)
    np.testing.assert_array_equal(s["a2a"], cat([rows(k, 2 * len(members))[2 * me:2 * me + 2] for k in members]))
    total = sum(rows(k, 3) for k in members)
    start, count = [(0, 2), (2, 1)][me] if len(members) == 2 else (0, 3)
    np.testing.assert_array_equal(s["rs"], total[start:start + count])
    weights = np.reshape(s["weights"], (N, 3))
    np.testing.assert_array_equal(weights[0], weights[2])        # one model per set
    assert not np.array_equal(weights[0], weights[1])
    assert s["global"] == [3.0]
    assert s["own_step"] == (r == 1)                   # rank 1 is outside the set: it trains alone
    assert s == {**s, "weights": every[0]["weights"]}
    wrong, again, disagree, removed = s["refused"]
    assert f"rank {r} is not in ProcessSet" in wrong, wrong
    assert "a process set with ranks [0, 2] exists already" in again, again
    assert "the workers disagree on process set 3" in disagree, disagree
    assert s["removed"] == [True, True, False, None]
    assert "is not registered" in removed, removed


@pytest.mark.timeout(200)
def test_a_horovod_elastic_script_runs_with_every_worker_starting_from_rank_0s_state(procs):
    out = launch(procs, script=str(ROOT / "tests" / "torch" / "elastic_worker.py"), workers=2)
    got = sorted(results(out), key=lambda r: r["rank"])
    assert [g["rank"] for g in got] == [0, 1], out
    # rank 1 began at epoch 5: without the sync it would have trained no epoch at all
    assert got[0]["weight"] == got[1]["weight"], got
    for epoch in range(2):                      # each epoch's 10 samples split 5 and 5, none twice
        parts = [set(g["seen"][5 * epoch:5 * epoch + 5]) for g in got]
        assert not parts[0] & parts[1] and parts[0] | parts[1] == set(range(10)), got
    # restore() brought the last commit (epoch 1's last step) back: weights, the epoch counter,
    # the sampler's place (10 samples processed: 5 steps of 1 sample on each of 2 workers)
    assert all(g["restored"] and g["epoch"] == 1 and g["sampler"] == {"epoch": 1, "processed_num": 10}
               for g in got), got


def check_timeline(events):
    """Horovod's timeline as chrome://tracing reads it: a row per tensor, a bar per phase."""
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]}
    spans = [(rows[e["pid"]], e["name"], e["ts"], e["dur"]) for e in events if e.get("ph") == "X"]
    phases = {(row, phase) for row, phase, _, _ in spans}
    # a name's first use is checked on every worker (NEGOTIATE_), then summed
    assert {("allreduce.reuse", "NEGOTIATE_ALLREDUCE"), ("allreduce.reuse", "ALLREDUCE"),
            ("allreduce.after", "ALLREDUCE"), ("broadcast.optstate.0.exp_avg", "NEGOTIATE_BROADCAST"),
            ("broadcast.optstate.0.exp_avg", "BROADCAST")} <= phases, sorted(phases)
    assert any(row.endswith("(process set 1)") for row, _ in phases), sorted(phases)
    assert all(ts >= 0 and dur >= 0 for _, _, ts, dur in spans), spans
    assert len([s for s in spans if s[:2] == ("allreduce.reuse", "ALLREDUCE")]) == 2      # called twice
    assert any(e.get("name") == "CYCLE_START" for e in events)                           # MARK_CYCLES=1
    assert not any("meeting" in row or "agree" in row for row in rows.values()), rows     # ps's own keys


def test_the_rest_of_horovods_api_alone():
    """Alone (size 1) every call is the identity, and what ps cannot do is refused by name."""
    hvd.init()
    assert hvd.allgather(torch.arange(3)).tolist() == [0, 1, 2]
    assert hvd.allgather_object({"a": 1}) == [{"a": 1}]
    assert hvd.alltoall(torch.arange(4.0)).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert hvd.reducescatter(torch.ones(3, 2)).shape == (3, 2)
    assert hvd.allreduce(torch.tensor([3.0, 1.0]), op=hvd.Min).tolist() == [3.0, 1.0]
    assert (hvd.cross_rank(), hvd.cross_size(), hvd.nccl_built(), hvd.mpi_threads_supported()) == (0, 1, 0, False)
    assert hvd.global_process_set.size() == 1 and hvd.join() == 0
    with pytest.raises(ValueError, match="op 'Adasum' is not supported"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(ValueError, match=r"DistributedOptimizer\(op=Min\) is not supported"):
        hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), op=hvd.Min)
    with pytest.raises(ValueError, match="a 0-d tensor has no first dimension"):
        hvd.allgather(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"splits \[1, 2\] must be 1 non-negative integers"):
        hvd.alltoall(torch.ones(3), splits=[1, 2])
    with pytest.raises(ValueError, match=r"ProcessSet\(process_set_id=None, ranks=\[0\]\) is not registered"):
        hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match=r"a process set with ranks \[0\] exists already"):
        hvd.add_process_set([0])                    # alone, that is every worker
    with pytest.raises(ValueError, match="not a non-empty list of ranks of this job's 1 workers"):
        hvd.add_process_set([1])
    assert hvd.ProcessSet(np.array([1, 0])).ranks == [0, 1]         # any iterable of ints, as Horovod
    sampler = hvd.elastic.ElasticSampler(list(range(5)), shuffle=False)
    state = hvd.elastic.TorchState(torch.nn.Linear(1, 1), sampler=sampler, step=0)
    assert hvd.elastic.run(lambda st: [*st.sampler])(state) == [0, 1, 2, 3, 4]     # alone: all of it
    sampler.record_batch(0, 2)
    state.step = 1
    state.commit()
    sampler.record_batch(1, 2)
    state.step = 2
    state.restore()
    assert (state.step, [*sampler]) == (1, [2, 3, 4])               # the commit's place in the epoch
    with pytest.raises(ValueError, match=r"made of int ranks, got \[0.5\]"):
        hvd.ProcessSet([0.5])


def test_objects_travel_signed_with_the_job_key_or_as_plain_data(tmp_path):
    """broadcast_object / allgather_object: any object when the job has a key (checked before
    it is unpickled), plain data without one, and a clear refusal of the rest."""
    import argparse
    import types

    from ps.collective import objects

    def job(key_file=None):
        return types.SimpleNamespace(config=types.SimpleNamespace(secret_file=None, job_key_file=key_file))

    key = tmp_path / "key"
    key.write_text("k" * 32)
    ns = argparse.Namespace(lr=0.1, layers=(1, 2))
    signed = objects.dumps(ns, job(str(key)), "broadcast_object")
    assert objects.loads(signed, job(str(key)), "broadcast_object") == ns
    other = tmp_path / "other"
    other.write_text("o" * 32)
    with pytest.raises(PermissionError, match="signature does not match"):
        objects.loads(signed, job(str(other)), "broadcast_object")
    with pytest.raises(PermissionError, match="signature does not match"):
        objects.loads(signed, job(), "broadcast_object")            # no key: nothing is unpickled
    plain = {0: (1, [2, {3}]), "a": np.arange(3, dtype=np.int16), "t": torch.ones(2, dtype=torch.bfloat16),
             "n": None, "b": b"\x00", "big": 2 ** 70}
    back = objects.loads(objects.dumps(plain, job(), "x"), job(), "x")
    assert back[0] == (1, [2, {3}]) and back["n"] is None and back["b"] == b"\x00" and back["big"] == 2 ** 70
    assert back["a"].dtype == np.int16 and back["a"].tolist() == [0, 1, 2]
    assert back["t"].dtype == torch.bfloat16 and back["t"].tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="argparse.Namespace cannot travel as plain data.*PS_JOB_KEY_FILE"):
        objects.dumps(ns, job(), "broadcast_object")
    with pytest.raises(ValueError, match="no object ps sent"):
        objects.loads(b"Xjunk", job(), "broadcast_object")
