"""An optimizer whose update needs a module that takes seconds to import (torch, for
ps.torch.ServerOptimizer's rules) must not silence its server: imported at the first push on
the server's I/O thread, it held back the heartbeats, and the scheduler declared the server
dead (PS_HEARTBEAT_TIMEOUT=10 while torch loaded on a busy machine). Here a module that sleeps
3 s on import stands for torch, against a 1.5 s heartbeat timeout: one real scheduler, server
and worker over ZeroMQ in this process."""
import importlib
import sys

import numpy as np
import pytest

from ps.optim import SGD
from ps.optim.base import REGISTRY
from ps.testing import local_cluster

pytestmark = pytest.mark.process
SLOW = "ps_test_slow_module"


class SlowSGD(SGD):
    """SGD whose update imports a slow module, as TorchSGD's imports torch."""

    modules = (SLOW,)

    def _step(self, key, w, g, mom, lr, wd):
        importlib.import_module(SLOW)
        return super()._step(key, w, g, mom, lr, wd)


@pytest.mark.timeout(60)
def test_a_server_keeps_beating_while_its_optimizers_module_imports(tmp_path, monkeypatch):
    (tmp_path / f"{SLOW}.py").write_text("import time\ntime.sleep(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY, "slowsgd", SlowSGD)
    monkeypatch.delitem(sys.modules, SLOW, raising=False)
    with local_cluster(num_servers=1, num_workers=1, van="zmq", timeout=30,
                       heartbeat_interval=0.2, heartbeat_timeout=1.5) as cluster:
        kv = cluster.workers[0]
        kv.init(0, np.zeros(4, np.float32))
        kv.set_optimizer({"name": "slowsgd", "params": {"learning_rate": 0.5}})
        assert SLOW in sys.modules          # imported before set_optimizer returned
        kv.push(0, np.ones(4, np.float32))
        np.testing.assert_array_equal(kv.pull(0), np.full(4, -0.5, np.float32))
        assert cluster.servers[0].po.failure is None
