"""ps in a pod: the scheduler reached through another address than its own (a Service's),
and a scheduler name whose DNS record appears seconds after the pods start. Real
processes; the late name is a hosts file bind-mounted over /etc/hosts in a private mount
namespace (unshare -m), written 3 s after the worker starts."""
import json
import shutil
import subprocess
import time

import pytest

from tests.helpers import PYTHON, ROOT, Procs, cluster_env, free_port

pytestmark = pytest.mark.process

SCRIPT = str(ROOT / "tests" / "integration" / "worker_script.py")
EXPECTED = [1.0, 1.0, 1.0, 1.0]       # 1 worker pushes ones, no optimizer: each round's sum replaces the value


def job(procs, scheduler_env, node_env, wrap=(), **worker_env):
    scheduler = procs.role("scheduler", scheduler_env)
    server = procs.role("server", node_env)
    worker = procs.start([*wrap, PYTHON, SCRIPT, "sync"], {**node_env, "DMLC_ROLE": "worker", **worker_env})
    return scheduler, server, worker


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kubernetes", ["1", "0"])
def test_use_kubernetes_binds_the_scheduler_to_every_interface(kubernetes):
    """DMLC_USE_KUBERNETES=1 (ps-lite's): the nodes reach the scheduler at 127.0.0.2, an
    address it was not told; without it the scheduler binds its own address only."""
    procs = Procs()
    try:
        port = free_port()
        sched_env = cluster_env(port, servers=1, workers=1, DMLC_USE_KUBERNETES=kubernetes, PS_CONNECT_TIMEOUT="8")
        node_env = cluster_env(port, servers=1, workers=1, DMLC_PS_ROOT_URI="127.0.0.2", PS_CONNECT_TIMEOUT="8")
        scheduler, server, worker = job(procs, sched_env, node_env)
        code, out, err = procs.finish(worker, timeout=40)
        if kubernetes == "1":
            assert code == 0, out + err
            assert json.loads(out.strip().splitlines()[-1])["result"] == EXPECTED
            for proc in (server, scheduler):
                assert procs.finish(proc, timeout=20)[0] == 0
        else:
            assert code != 0 and "no answer from the scheduler at tcp://127.0.0.2" in err, err
    finally:
        procs.cleanup()


@pytest.mark.timeout(60)
def test_a_scheduler_name_that_resolves_late_is_retried(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("unshare -m is not permitted here: no private /etc/hosts to publish a name late")
    procs = Procs()
    try:
        port = free_port()
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 localhost\n")
        name = "psjob-scheduler.default.svc"
        sched_env = cluster_env(port, servers=1, workers=1, DMLC_USE_KUBERNETES="1")
        node_env = cluster_env(port, servers=1, workers=1, DMLC_PS_ROOT_URI="127.0.0.1")
        wrap = ["unshare", "-m", "sh", "-c", f'mount --bind {hosts} /etc/hosts && exec "$@"', "pod"]
        scheduler, server, worker = job(procs, sched_env, node_env, wrap, DMLC_PS_ROOT_URI=name)
        time.sleep(3.0)
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {name}\n")      # the DNS record appears
        code, out, err = procs.finish(worker, timeout=40)
        assert code == 0, out + err
        assert f"DMLC_PS_ROOT_URI='{name}' does not resolve yet" in err, err
        assert json.loads(out.strip().splitlines()[-1])["result"] == EXPECTED
    finally:
        procs.cleanup()
