"""`import ps.mxnet`: Gluon, Module and mx.kv on ps give MXNet's numbers (real processes)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import PYTHON, cluster_env

mx = pytest.importorskip("mxnet")
pytestmark = [pytest.mark.process, pytest.mark.mxnet]

HERE = os.path.dirname(__file__)
WORKER = os.path.join(HERE, "gluon_worker.py")
sys.path.insert(0, HERE)
import gluon_worker as gw  # noqa: E402

SGD = ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
ADAM = ("adam", {"learning_rate": 0.01, "wd": 1e-3})


def run_job(procs, port, tmp_path, scenario, servers=2, workers=2, same_command=False, env_extra=None, **kw):
    env = cluster_env(port, servers=servers, workers=workers, **(env_extra or {}))
    args = [f"{k}={v!r}" for k, v in kw.items()]
    others = []
    for role in ["scheduler"] + ["server"] * servers:
        if same_command:    # the script imports ps.mxnet first: it runs the role and exits
            others.append(procs.start([PYTHON, WORKER, "role", "-"], {**env, "DMLC_ROLE": role}))
        else:
            others.append(procs.role(role, env))
    ws = [procs.start([PYTHON, WORKER, scenario, str(tmp_path / f"w{i}.npz"), *args],
                      {**env, "DMLC_ROLE": "worker"}) for i in range(workers)]
    results = {}
    for w in ws:
        code, out, err = procs.finish(w, timeout=120)
        assert code == 0, err[-3000:]
    for p in others:
        code, out, err = procs.finish(p, timeout=30)
        assert code == 0, err[-3000:]
    for i in range(workers):
        d = dict(np.load(tmp_path / f"w{i}.npz"))
        d.pop("__engine_ops", None)
        results[int(d.pop("__rank"))] = d
    return [results[r] for r in sorted(results)]


def assert_close(got, ref, atol=1e-5):
    assert sorted(got) == sorted(ref)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=atol, err_msg=k)


@pytest.mark.parametrize("uok,servers", [
    (True, 1),
    (False, 2),      # the workers update (with Adam too: MXNet's code; ps only sums)
])                   # Adam on the servers, sharded: test_save_and_load_states_resume_exactly
def test_gluon_dist_sync_matches_single_process(procs, port, tmp_path, uok, servers):
    got = run_job(procs, port, tmp_path, "gluon", servers=servers, steps=10,
                  opt=SGD[0], opt_args=SGD[1], update_on_kvstore=uok)
    ref = gw.train(None, 0, 2, 10, SGD[0], SGD[1], rows=(0, 2 * gw.B))
    for worker in got:
        assert_close(worker, ref)


def test_conv_net_through_mxnet_engine_matches_blocking_path(procs, port, tmp_path):
    """Pushpulls run as MXNet engine operations (PS_MXNET_ENGINE=1, the default): the values
    are bit-identical to the blocking path's, with MKL-DNN convolutions and an inference pass
    (which may change the weights' layout) after every step, and match one process."""
    opt = ("sgd", {"learning_rate": 0.02, "momentum": 0.9, "wd": 1e-3})
    runs = {}
    for engine in ("1", "0"):
        runs[engine] = run_job(procs, port, tmp_path, "gluon", env_extra={"PS_MXNET_ENGINE": engine},
                               steps=6, opt=opt[0], opt_args=opt[1], update_on_kvstore=True,
                               model="conv", predict=True)
        ops = [int(np.load(tmp_path / f"w{i}.npz")["__engine_ops"]) for i in range(2)]
        assert ops == ([6 * 6] * 2 if engine == "1" else [0, 0])    # 6 parameters x 6 steps
    ref = gw.train(None, 0, 2, 6, opt[0], opt[1], rows=(0, 2 * gw.B), model="conv", predict=True)
    for with_engine, blocking in zip(runs["1"], runs["0"]):
        assert_close(with_engine, blocking, atol=0)
        assert_close(with_engine, ref, atol=2e-5)     # summation order differs from one batch


def test_a_worker_that_exits_right_after_its_last_step_still_sends_it(procs, port, tmp_path):
    """Its last pushpulls may still wait in MXNet's engine at exit: they must reach the
    servers (the other worker's last round needs them), not be dropped by MXNet's shutdown."""
    opt = ("sgd", {"learning_rate": 0.02, "momentum": 0.9, "wd": 1e-3})
    got = run_job(procs, port, tmp_path, "gluon", steps=6, opt=opt[0], opt_args=opt[1],
                  update_on_kvstore=True, model="conv", exit_early=True)
    assert got[0] == {}                         # rank 0 left without reading anything
    ref = gw.train(None, 0, 2, 6, opt[0], opt[1], rows=(0, 2 * gw.B), model="conv")
    assert_close(got[1], ref, atol=2e-5)


def test_forking_while_pushpulls_are_in_the_engine_does_not_hang(procs, port, tmp_path):
    """MXNet's fork handler waits for every engine operation while the forking thread holds
    the GIL; ps lets its pushpulls finish first (a DataLoader forks its workers)."""
    opt = ("sgd", {"learning_rate": 0.02, "momentum": 0.9, "wd": 1e-3})
    got = run_job(procs, port, tmp_path, "gluon", steps=4, opt=opt[0], opt_args=opt[1],
                  update_on_kvstore=True, model="conv", fork=True)
    ref = gw.train(None, 0, 2, 4, opt[0], opt[1], rows=(0, 2 * gw.B), model="conv")
    for g in got:
        assert_close(g, ref, atol=2e-5)


def test_error_of_a_pushpull_in_the_engine_is_raised_by_waitall_or_the_next_call(procs, port, tmp_path):
    env = cluster_env(port, servers=1, workers=1)
    others = [procs.role("scheduler", env), procs.role("server", env)]
    w = procs.start([PYTHON, WORKER, "engine_error", str(tmp_path / "x.npz")], {**env, "DMLC_ROLE": "worker"})
    code, out, err = procs.finish(w, timeout=120)
    assert code == 0, err[-3000:]
    for wait in ("waitall", "next call"):
        assert re.search(rf"{wait} raised RemoteError: .*needs an optimizer", out), out
    assert int(np.load(tmp_path / "x.npz")["engine_ops"]) == 2      # they did run in the engine
    for p in others:
        assert procs.finish(p, timeout=30)[0] == 0


def test_same_command_for_every_role_and_lr_change_reaches_servers(procs, port, tmp_path):
    got = run_job(procs, port, tmp_path, "gluon", same_command=True, steps=8, opt=SGD[0],
                  opt_args=SGD[1], update_on_kvstore=True, lr_after=4, lr_mult=(2, 0.5))
    ref = gw.train(None, 0, 2, 8, SGD[0], SGD[1], rows=(0, 2 * gw.B), lr_after=4,
                   lr_mult=(2, 0.5))
    for worker in got:
        assert_close(worker, ref)


def test_save_and_load_states_resume_exactly(procs, port, tmp_path):
    """Adam on the servers, with the 640-element weight sharded over both (bound 100): ten steps
    match one process's, and save the trainer's states and the weights after five; a new job that
    loads them and runs five more ends where the ten did, exactly."""
    opt, bound = ADAM, {"MXNET_KVSTORE_BIGARRAY_BOUND": "100"}
    states, params = str(tmp_path / "trainer.states"), str(tmp_path / "net.params")
    full = run_job(procs, port, tmp_path, "gluon", steps=10, opt=opt[0], opt_args=opt[1], env_extra=bound,
                   update_on_kvstore=True, save=(5, states, params))
    ref = gw.train(None, 0, 2, 10, opt[0], opt[1], rows=(0, 2 * gw.B))
    for worker in full:
        assert_close(worker, ref)
    resumed = run_job(procs, port + 1 if port < 65000 else port - 1, tmp_path, "gluon", steps=5, opt=opt[0],
                      opt_args=opt[1], env_extra=bound, update_on_kvstore=True, params=params, states=states)
    for a, b in zip(resumed, full):
        assert_close(a, b, atol=0)


def test_compression_2bit_with_trainer_trains(procs, port, tmp_path):
    got = run_job(procs, port, tmp_path, "gluon", steps=6, opt="sgd", opt_args={"learning_rate": 0.1},
                  update_on_kvstore=True, compression={"type": "2bit", "threshold": 0.01})
    before = [p.data().asnumpy() for p in gw.net().collect_params().values()]
    for k in got[0]:
        np.testing.assert_array_equal(got[0][k], got[1][k])       # workers agree
    moved = sum(float(np.abs(got[0][f"p{i}"] - b).sum()) for i, b in enumerate(before))
    assert moved > 0.01


def test_module_fit_dist_sync(procs, port, tmp_path):
    got = run_job(procs, port, tmp_path, "module", epochs=3)
    ref = gw.module_fit("local", 0, 2, epochs=3, rows=(0, 2 * gw.B))
    for worker in got:
        assert_close(worker, ref)


def test_kv_create_dist_async_with_optimizer(procs, port, tmp_path):
    got = run_job(procs, port, tmp_path, "async", servers=1)
    for worker in got:
        np.testing.assert_allclose(worker["w"], np.full((2, 3), 1 - 3 * 0.3), rtol=1e-6)


def test_dist_async_with_update_on_kvstore_false_is_refused(procs, port, tmp_path):
    env = cluster_env(port, servers=1, workers=1)
    others = [procs.role("scheduler", env), procs.role("server", env)]
    w = procs.start([PYTHON, WORKER, "gluon", str(tmp_path / "x.npz"), "kvstore='dist_async'", "steps=1",
                     "opt='sgd'", "opt_args={'learning_rate': 0.1}", "update_on_kvstore=False"],
                    {**env, "DMLC_ROLE": "worker"})
    code, _, err = procs.finish(w, timeout=120)
    assert code != 0 and "update_on_kvstore=True" in err
    for p in others:
        assert procs.finish(p, timeout=30)[0] == 0      # the job still ends cleanly



def test_three_trainers_on_dist_kvstores_in_one_process_each_keep_their_keys_and_optimizer(procs, tmp_path):
    """A GAN's shape: Trainers (SGD+momentum with an lr change, Adam with save/load of its
    states, RMSProp updating on the workers) each with kvstore='dist_sync' in every worker,
    trained in turns: each equals MXNet's local store on both workers' batches. Native MXNet
    hangs here; before, ps refused the second Trainer's keys. One store object given to two
    Trainers is refused, naming the way out; so are one store's states loaded into another;
    numpy int keys move with the store's others."""
    script = os.path.join(HERE, "gan_dist.py")
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON, script,
                            str(tmp_path)], cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=150)
    assert code == 0, out + err
    workers = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    env = {k: v for k, v in cluster_env(0).items() if not k.startswith("DMLC_")}
    ref = subprocess.run([PYTHON, script, str(tmp_path), "--local"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    (one,) = [json.loads(line.split("RESULT ", 1)[1]) for line in ref.stdout.splitlines() if "RESULT " in line]
    assert sorted(w["rank"] for w in workers) == [0, 1]
    for w in workers:
        for name, values in one["weights"].items():
            np.testing.assert_allclose(w["weights"][name], values, rtol=0, atol=1e-5, err_msg=name)
        assert w["refused"].startswith("key 0 is already initialized in this kvstore"), w
        assert "kvstore number 1 " in w["states_refused"] and "this is number 2" in w["states_refused"], w
        assert w["numpy_key"] == [2.0, 2.0], w       # no optimizer there: the sum of both workers' pushes
        for what in ("shape_refused", "unknown_refused"):   # the script's key, not the moved one
            assert re.search(r"key 0 \(of this process's kvstore number \d\)" if what == "shape_refused" else
                             r"key 7 \(of this process's kvstore number \d\) is not initialized", w[what]), w
            assert str(1 << 50)[:6] not in w[what], w
        assert w["compression_refused"].startswith("this kvstore asks for gradient compression {'type': '2bit'"), w
    assert not np.allclose(one["weights"]["G"], one["weights"]["D"])    # each its own optimizer


STALE = """
import json, mxnet as mx
from mxnet import gluon, autograd
class Net(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.head = gluon.nn.Dense(3, in_units=4)
            self.aux = gluon.nn.Dense(3, in_units=4)     # not used by forward: its gradient is stale
    def hybrid_forward(self, F, x):
        return self.head(x)
net = Net(prefix="net_")
net.initialize(mx.init.One())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="dist_sync")
for step in range(3):
    with autograd.record():
        loss = net(mx.nd.ones((2, 4))).sum()
    loss.backward()
    trainer.step(2, ignore_stale_grad=True)
print("RESULT", json.dumps({"aux": net.aux.weight.data().asnumpy().tolist(),
                            "aux_grad": net.aux.weight.grad().asnumpy().tolist(),
                            "head": net.head.weight.data().asnumpy().tolist(),
                            "head_grad": net.head.weight.grad().asnumpy().tolist()}))
"""


def test_a_parameter_backward_never_reached_keeps_its_value_and_gradients_stay_as_backward_wrote_them(procs):
    """Native dist_sync with update_on_kvstore on one device pulls the new weights into the
    pushed gradient buffers, so a stale parameter sends its weight as its gradient next step
    and decays (1 -> 0.9 -> 0.81 here); with kvstore='local', or one process, it keeps its
    value. ps does what local does (docs/mxnet.md, "Where ps differs")."""
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "1", "--launcher", "local", PYTHON, "-c",
                            STALE], cluster_env(0))
    code, out, err = procs.finish(launcher, timeout=90)
    assert code == 0, out + err
    workers = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert len(workers) == 2, out + err
    for w in workers:
        assert np.all(np.array(w["aux"]) == 1.0) and np.all(np.array(w["aux_grad"]) == 0.0), w
        np.testing.assert_allclose(w["head_grad"], 2.0)      # backward's: 2 rows of ones
        # the servers' SGD on both workers' sums: 1 - 3 steps x 0.1 x (2 + 2) / 2
        np.testing.assert_allclose(w["head"], 1 - 3 * 0.1 * 2, rtol=1e-6)


FAILED_FORWARD = """
import mxnet as mx
from mxnet import gluon, autograd
net = gluon.nn.Dense(3, in_units=4, dtype="float16")    # MXNet's CPU build cannot run it
net.initialize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "multi_precision": True},
                        kvstore="dist_sync")
with autograd.record():
    loss = net(mx.nd.ones((2, 4), dtype="float16")).sum()
loss.backward()
trainer.step(2)              # queues the pushpulls behind gradients that will never be written
print("loss", loss.asscalar())
"""


def test_a_forward_pass_that_fails_in_mxnets_engine_ends_the_job_at_once(procs):
    """The forward operation fails inside MXNet's engine; the script raises at ``asscalar``.
    The engine skips the pushpulls that wait for its gradients, so the exit does not wait for
    them (before: 60 s, PS_REQUEST_TIMEOUT, then 'timed out ... queued in MXNet's engine')."""
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "1", "--launcher", "local", PYTHON, "-c",
                            FAILED_FORWARD], cluster_env(0, PS_REQUEST_TIMEOUT="60"))
    code, out, err = procs.finish(launcher, timeout=40)
    assert code != 0, out + err
    text = out + err
    assert "float16 fully connected layer" in text, text[-3000:]
    assert "pushpulls were not sent: MXNet's engine skipped them" in text, text[-3000:]
    assert "timed out" not in text, text[-3000:]


def test_server_profiling_writes_each_servers_trace(procs, tmp_path):
    """mx.profiler's profile_process='server' calls reach ps's servers (MXNet itself fails
    on a store without a C handle): each writes rank<N>_<filename>, a Chrome trace of the
    requests it handled while running and not paused; MXNet's worker profiler is untouched;
    an unknown config parameter is refused as MXNet refuses it."""
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local", PYTHON,
                            os.path.join(HERE, "profile_worker.py")],
                           {**cluster_env(0), "MXNET_KVSTORE_BIGARRAY_BOUND": "100"}, cwd=str(tmp_path))
    code, out, err = procs.finish(launcher, timeout=120)
    assert code == 0, out + err
    found = {}
    for line in out.splitlines():
        if "RESULT " in line:
            found.update(json.loads(line.split("RESULT ", 1)[1]))
    assert "no parameter 'profile_everything'" in found["unknown_refused"], found
    for r in (0, 1):          # both servers hold a slice: 3 recorded steps x 2 workers x (push, pull)
        events = sorted(map(tuple, found[f"server{r}"]))
        assert events == sorted([("push", w) for w in (0, 1)] * 3 + [("pull", w) for w in (0, 1)] * 3), events
    assert found["worker_file"] is True
    assert found["final"] == pytest.approx(1 - 4 * 2 * 0.1)
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0_srv.json", "rank1_srv.json"]
