"""PS_SECRET_FILE (CURVE) and pickled MXNet optimizers (authenticated jobs only), with real processes."""
import os

import numpy as np
import pytest

from tests.helpers import PYTHON, cluster_env
from tests.mxnet.test_adapter import WORKER, assert_close, gw

pytestmark = [pytest.mark.process, pytest.mark.mxnet]
HALF = ("halfsgd", {"learning_rate": 0.2})


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32).hex().encode())
    return str(path)


def env_for(port, **extra):
    env = cluster_env(port, servers=1, workers=2, **extra)
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(WORKER)     # servers unpickle custom_optim
    return env


def gluon_worker(procs, env, out, opt):
    return procs.start([PYTHON, WORKER, "gluon", str(out), "steps=4", f"opt={opt[0]!r}",
                        f"opt_args={opt[1]!r}", "update_on_kvstore=True"], {**env, "DMLC_ROLE": "worker"})


def test_secret_cluster_refuses_a_node_without_the_secret(procs, port, secret, tmp_path):
    env = env_for(port, PS_SECRET_FILE=secret)
    others = [procs.role("scheduler", env), procs.role("server", env)]
    rogue_env = {k: v for k, v in env.items() if k != "PS_SECRET_FILE"}
    rogue = procs.role("worker", {**rogue_env, "PS_CONNECT_TIMEOUT": "3"}, "tests/integration/worker_script.py",
                       "sync")
    code, _, err = procs.finish(rogue, timeout=30)
    assert code != 0 and "no answer from the scheduler" in err
    ws = [gluon_worker(procs, env, tmp_path / f"w{i}.npz", ("sgd", {"learning_rate": 0.1})) for i in range(2)]
    for p in ws + others:
        code, _, err = procs.finish(p, timeout=120)
        assert code == 0, err[-2000:]


@pytest.mark.parametrize("extra,says", [({"PS_ALLOW_PICKLE": "0"}, "PS_ALLOW_PICKLE=0"),
                                        ({"PS_SECRET_FILE": None}, "signed with the job")])
def test_unknown_optimizer_is_refused_unauthenticated_or_opted_out(procs, port, secret, tmp_path, extra, says):
    env = env_for(port, PS_SECRET_FILE=secret, **{k: v for k, v in extra.items() if v is not None})
    env = {k: v for k, v in env.items() if extra.get(k, "") is not None}
    others = [procs.role("scheduler", env), procs.role("server", env)]
    ws = [gluon_worker(procs, env, tmp_path / f"w{i}.npz", HALF) for i in range(2)]
    errors = [procs.finish(w, timeout=120) for w in ws]
    assert all(code != 0 for code, _, _ in errors)
    assert any("'HalfSGD'" in err and says in err for _, _, err in errors), errors[0][2][-2000:]
    for p in others:
        procs.finish(p, timeout=60)


def test_pickled_optimizer_runs_in_an_authenticated_job(procs, port, secret, tmp_path):
    env = env_for(port, PS_SECRET_FILE=secret)            # no opt-in needed
    others = [procs.role("scheduler", env), procs.role("server", env)]
    ws = [gluon_worker(procs, env, tmp_path / f"w{i}.npz", HALF) for i in range(2)]
    for p in ws + others:
        code, _, err = procs.finish(p, timeout=120)
        assert code == 0, err[-2000:]
    ref = gw.train(None, 0, 2, 4, HALF[0], HALF[1], rows=(0, 2 * gw.B))
    for i in range(2):
        got = dict(np.load(tmp_path / f"w{i}.npz"))
        got.pop("__rank")
        got.pop("__engine_ops", None)
        assert_close(got, ref)
