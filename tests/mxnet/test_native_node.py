"""A script that imports plain mxnet reaches a ps job through MXNet's own C++ kvstore
(ps-lite): the job ends within seconds, naming it and the fix, instead of waiting forever.
Under the launcher with its hook turned off: tests/mxnet/test_autoload.py."""
import time

import pytest

from tests.helpers import PYTHON, cluster_env

pytestmark = pytest.mark.process


pytest.importorskip("mxnet")

NATIVE_WORKER = "import mxnet as mx; kv = mx.kv.create('dist_sync'); print('joined', kv.rank)"


def test_the_scheduler_names_a_native_mxnet_worker_and_ends_the_job(procs, port):
    env = cluster_env(port, servers=1, workers=1, PS_CONNECT_TIMEOUT="60")
    scheduler = procs.role("scheduler", env)
    procs.start([PYTHON, "-c", NATIVE_WORKER], {**env, "DMLC_ROLE": "worker"})
    started = time.monotonic()
    code, _, err = procs.finish(scheduler, timeout=30)
    assert code == 1, err
    assert time.monotonic() - started < 20
    assert "a native MXNet kvstore worker at" in err and "import ps.mxnet" in err, err
