"""Horovod's MXNet template on ps (`import ps.mxnet as hvd`): 2 workers x 2 servers equal one
process on both workers' batches, with one trainer or with two (a GAN's); bad input named."""
import json
import subprocess

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, cluster_env

pytestmark = pytest.mark.process


pytest.importorskip("mxnet")

SCRIPT = str(ROOT / "tests" / "mxnet" / "hvd_gluon.py")


def results(text):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]


@pytest.mark.timeout(200)
def test_distributed_optimizer_with_trainer_kvstore_none_equals_one_process(procs):
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON, SCRIPT],
                           cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=150)
    assert code == 0, out + err
    workers = results(out)
    assert sorted(r["rank"] for r in workers) == [0, 1] and {r["size"] for r in workers} == {2}, out
    assert {r["local_size"] for r in workers} == {2}
    env = {k: v for k, v in cluster_env(0).items() if not k.startswith("DMLC_")}
    ref = subprocess.run([PYTHON, SCRIPT, "--local"], capture_output=True, text=True, timeout=120, env=env)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    (one,) = results(ref.stdout)
    for r in workers:
        for name, values in one["weights"].items():
            np.testing.assert_allclose(r["weights"][name], values, rtol=0, atol=1e-5, err_msg=name)
    assert workers[0]["mean_loss"] == workers[1]["mean_loss"]     # hvd.allreduce: the same mean everywhere


@pytest.mark.timeout(200)
def test_two_distributed_trainers_a_gans_shape_equal_one_process(procs):
    script = str(ROOT / "tests" / "mxnet" / "hvd_gan.py")
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON, script],
                           cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=150)
    assert code == 0, out + err
    workers = results(out)
    env = {k: v for k, v in cluster_env(0).items() if not k.startswith("DMLC_")}
    ref = subprocess.run([PYTHON, script, "--local"], capture_output=True, text=True, timeout=120, env=env)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    (one,) = results(ref.stdout)
    assert len(workers) == 2
    for r in workers:
        for name, values in one["weights"].items():
            atol = 1e-4 if name == "H" else 1e-5        # H's gradients are summed in float16
            np.testing.assert_allclose(r["weights"][name], values, rtol=0, atol=atol, err_msg=name)
        assert not np.array_equal(r["weights"]["H"], one["weights"]["H"])   # ... really in float16
    # G and D really trained apart: the same start, different updates
    assert not np.allclose(one["weights"]["G"], one["weights"]["D"])


def test_bad_input_is_named_alone():
    code = ("import ps.mxnet as hvd, mxnet as mx\n"
            "hvd.init()\n"
            "try:\n    hvd.DistributedOptimizer('sgd')\nexcept TypeError as e:\n    print('E1', e)\n"
            "try:\n    hvd.DistributedTrainer([], 'sgd', compression='bf16')\nexcept ValueError as e:\n    print('E3', e)\n"
            "net = mx.gluon.nn.Dense(3); net.initialize()\n"
            "try:\n    hvd.broadcast_parameters(net.collect_params())\nexcept ValueError as e:\n    print('E2', e)\n")
    env = {k: v for k, v in cluster_env(0).items() if not k.startswith("DMLC_")}
    res = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "E1 DistributedOptimizer wraps an mx.optimizer.Optimizer, got str" in res.stdout, res.stdout + res.stderr
    assert "E3 compression='bf16': ps.mxnet has hvd.Compression.none and hvd.Compression.fp16" in res.stdout, \
        res.stdout + res.stderr
    # alone, a broadcast is a no-op (size 1), even with deferred parameters
    assert "E2" not in res.stdout


def two_workers(procs, code):
    """``python -c code`` as two workers (and two servers) under the launcher; their stdout and
    stderr (exit 0)."""
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON,
                            "-c", code], cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=100)
    assert code == 0, out + err
    return out, err


@pytest.mark.timeout(120)
def test_ranks_that_reuse_a_key_against_a_new_one_raise_everywhere_and_go_on(procs):
    """Issue #52's reproducer in MXNet's terms: rank 0's (17,17,17) key was seen before, rank 1's
    (18,18,18) is new; no check runs for rank 0, and each waits for a round the other never
    pushes. The deadlock check (PS_DEADLOCK_CHECK) ends both waits, then both go on."""
    code = ("import time, ps.mxnet as hvd, mxnet as mx\n"
            "hvd.init(); r = hvd.rank()\n"
            "hvd.allreduce(mx.nd.ones((17, 17, 17)))\n"
            "t = time.monotonic()\n"
            "try:\n    hvd.allreduce(mx.nd.ones((17, 17, 17) if r == 0 else (18, 18, 18)))\n"
            "except ValueError as e:\n    print('ERR', r, type(e).__name__, round(time.monotonic() - t, 1), flush=True)\n"
            "print('SUM', r, hvd.allreduce(mx.nd.ones((18, 18, 18)) * r, average=False).asnumpy().max(), flush=True)\n")
    out, err = two_workers(procs, code)
    for rank in (0, 1):
        (line,) = [ln[ln.index("ERR"):] for ln in out.splitlines() if f"ERR {rank} " in ln]
        assert line.split()[2] == "MismatchError" and float(line.split()[3]) < 5.0, out + err
        assert f"SUM {rank} 1.0" in out, out + err


@pytest.mark.timeout(200)
def test_horovods_mxnet_collectives_on_three_workers(procs, tmp_path):
    """allreduce (ops, scale factors, in place, grouped, unnamed), broadcast, allgather,
    reducescatter, alltoall and objects, checked against numpy; shapes that differ are named on
    every worker and leave nothing for the exit to wait for. A timeline of the first three
    calls, started and stopped at run time."""
    script = str(ROOT / "tests" / "mxnet" / "hvd_collectives.py")
    timeline = tmp_path / "timeline.json"
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "3", "-s", "2", "--launcher", "local", PYTHON, script,
                            str(timeline)], cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=150)
    assert code == 0, out + err
    events = json.loads(timeline.read_text())       # stop_timeline() closed it: plain JSON
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]}
    spans = sorted((rows[e["pid"]], e["name"]) for e in events if e.get("ph") == "X")
    # the average and the sum of 'v' are two keys (an op is part of a reduction's key): two first uses
    assert spans == [("allreduce.v", "ALLREDUCE")] * 3 + [("allreduce.v", "NEGOTIATE_ALLREDUCE")] * 2, spans
    got = sorted(results(out), key=lambda g: g["rank"])
    assert [g["rank"] for g in got] == [0, 1, 2], out + err
    assert "closing with requests still outstanding" not in err, err
    vs = np.array([[r, -r, 2.0 + r] for r in range(3)])
    for r, g in enumerate(got):
        assert g["size"] == 3 and g["init"] and g["cross"] == [0, 1]
        np.testing.assert_allclose(g["avg"], vs.mean(axis=0), rtol=1e-6)
        assert g["sum"] == g["op_sum"] == vs.sum(axis=0).tolist()
        assert g["min"] == vs.min(axis=0).tolist() and g["max"] == vs.max(axis=0).tolist()
        assert g["prod"] == vs.prod(axis=0).tolist()
        assert g["max_scaled"] == (vs.max(axis=0) * 6).tolist() and g["avg_zero"] == vs.sum(axis=0).tolist()
        assert g["int_prescale"] == [9, -9]                 # Horovod: 7 x 0.5 in float64, cast (3), summed
        assert g["half"] == ["float16", [0.75]]
        assert g["inplace"] == [True, [6.0, 6.0]]
        assert g["grouped"] == [[6.0] * 2, [60.0] * 3] and g["grouped_"] == [[2.0] * 2, [20.0] * 3]
        assert g["bcast"] == [[1.0, 1.0]] * 2 and g["bcast_kept"] == [[float(r)] * 2] * 2
        assert g["bcast_"] == [[2.0, 2.0]] * 2
        assert "the workers disagree on root_rank" in g["roots"], g["roots"]
        want = np.concatenate([np.arange((k + 1) * 2).reshape(-1, 2) + 100 * k for k in range(3)])
        assert g["ag"] == want.tolist()
        want = np.concatenate([np.arange((3 - k) * 2).reshape(-1, 2) + 100 * k for k in range(3)])
        assert g["ag_again"] == want.tolist() and g["ag_dtype"] == "int64"
        assert g["gag"] == [np.concatenate([np.arange(2) + 100 * k for k in range(3)]).reshape(3, 2).tolist(),
                            [[1.0] * 3] * 6]
        x = np.arange(14.0).reshape(7, 2) * 6                         # summed: (1 + 2 + 3) x
        mine = {0: slice(0, 3), 1: slice(3, 5), 2: slice(5, 7)}[r]    # Horovod's split: the first ranks one more
        assert g["rs"] == x[mine].tolist() and g["rs_avg"] == (x[mine] / 3).tolist()
        assert g["grs"] == [(x[mine] / 2).tolist(), (x[:3][{0: slice(0, 1), 1: slice(1, 2), 2: slice(2, 3)}[r]] / 2)
                            .tolist()]
        # rank k sends (k + j) % 3 rows to rank j, from its rows 100k + ...
        expect = []
        for k in range(3):
            sent = np.arange(sum((k + j) % 3 for j in range(3)) * 2).reshape(-1, 2) + 100 * k
            start = sum((k + j) % 3 for j in range(r))
            expect.append(sent[start:start + (k + r) % 3])
        assert g["a2a"] == np.concatenate(expect).tolist() and g["a2a_recv"] == [(k + r) % 3 for k in range(3)]
        expect = [(np.arange(12).reshape(6, 2) + 100 * k)[2 * r:2 * r + 2] for k in range(3)]
        assert g["a2a_even"] == np.concatenate(expect).tolist()
        assert "the first dimension (4) does not split evenly over 3 workers" in g["a2a_refused"][0]
        assert "splits must be integers (int32), got float32" in g["a2a_refused"][1], g["a2a_refused"]
        assert g["obj"] == {"epoch": 3, "from": 1, "t": [1, 2]} or g["obj"] == {"epoch": 3, "from": 1, "t": (1, 2)}
        assert g["objs"] == [{"rank": k, "s": "x" * k, "a": [float(k)] * (k + 1)} for k in range(3)]
        assert "allgather of 'bad': the workers' tensors differ past the first dimension" in g["ag_bad"], g["ag_bad"]
        assert "tensor 'allreduce.badsum' (hvd) differs across workers" in g["sum_bad"], g["sum_bad"]
        assert g["after"] == [3.0, 3.0]
        assert len(g["refused"]) == 2 and all("no Adasum" in e for e in g["refused"]), g["refused"]
        # process sets {0, 2} and {1}
        assert g["set_sum"] == ([4.0] * 2 if r != 1 else [2.0] * 2), g["set_sum"]     # ranks 0 + 2: 1 + 3
        assert g["set_avg"] == [2.0] * 2, g["set_avg"]
        assert g["set_ag"] == ([[0, 1], [200, 201]] if r != 1 else [[100, 101]])
        assert g["set_bcast"] == ([2.0] if r != 1 else [1.0])
        assert f"rank {r} is not in ProcessSet" in g["set_refused"], g["set_refused"]
        assert g["set_ids"] == [1, 2, True]
    for r in range(3):
        assert f"SHUTDOWN {r} False" in out, out


def test_an_ndarray_travels_as_plain_data_in_an_object():
    """Without a job key (a bare mpirun), broadcast_object / allgather_object send msgpack:
    an NDArray in the object comes back as an NDArray of its dtype, nothing unpickled."""
    import types

    import mxnet as mx

    from ps.collective import objects

    job = types.SimpleNamespace(config=types.SimpleNamespace(secret_file=None, job_key_file=None))
    sent = {"w": mx.nd.array([[1, 2]], dtype="int32"), "step": 3}
    back = objects.loads(objects.dumps(sent, job, "x"), job, "x")
    assert isinstance(back["w"], mx.nd.NDArray) and back["w"].dtype == np.int32
    assert back["w"].asnumpy().tolist() == [[1, 2]] and back["step"] == 3


@pytest.mark.timeout(200)
def test_init_after_shutdown_joins_again(procs):
    """Horovod lets a process init after shutdown: each session's numbers are its own, every
    rank keeps its rank (the store waits for the next init: ps/collective/job.py)."""
    script = str(ROOT / "tests" / "mxnet" / "hvd_reinit.py")
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON, script],
                           cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=150)
    assert code == 0, out + err
    got = sorted(results(out), key=lambda g: g["who"][0][0])
    assert len(got) == 2, out + err
    for r, g in enumerate(got):
        assert g["who"] == [[r, 2, True]] * 3, g
        assert g["sum"] == [[3.0], [6.0], [9.0]], g
        assert g["bcast"] == [[0.0], [11.0], [2.0]], g
        assert g["gather"] == [[float(i)] * 3 for i in range(3)], g
        assert g["step"] == [[-1.5 * (i + 1)] * 2 for i in range(3)], g
        assert g["after"] == [False] * 3, g
