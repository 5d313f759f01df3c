"""--launcher kubernetes end to end without a cluster: the manifests ``--dry-run`` prints
run as local processes under an emulated kubelet and Job controller (tests/kubelet.py):
each pod on its own 127.0.0.N with a private /etc/hosts naming the Services and pods, the
Secret as 0400 files, fieldRefs resolved, per-index restarts as backoffLimitPerIndex and
the podFailurePolicy say. A server, a worker or the scheduler SIGKILLed mid-training: the
Jobs complete with the weights of an unfaulted run. What ps controls runs for real; what a
real cluster adds (kube-proxy, CoreDNS, the real controllers) does not run here."""
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import ROOT
from tests.kubelet import Cluster

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.process

ROUNDS = 60
ENV = ["PS_HEARTBEAT_INTERVAL:0.5", "PS_HEARTBEAT_TIMEOUT:10", "PS_CONNECT_TIMEOUT:30",
       "MXNET_KVSTORE_BIGARRAY_BOUND:100000"]


@pytest.fixture(scope="module", autouse=True)
def mount_namespaces():
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("unshare -m is not permitted here: the pods cannot have their own /etc/hosts")


def manifests(out, restarts=2):
    argv = [sys.executable, "-m", "ps.launch", "--launcher", "kubernetes", "-n", "2", "-s", "2", "--image",
            "python:3.11", "--max-restarts", str(restarts), "--dry-run", "--job-name", "psjob"]
    for pair in ENV:
        argv += ["--env", pair]
    argv += ["python", "tests/integration/recovery_worker.py", str(out), str(ROUNDS), "sgd", "--pace", "0.05"]
    done = subprocess.run(argv, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def weights(path):
    with np.load(path / "weights.npz") as f:
        return {k: f[k] for k in f}


def run(out, kill=None, restarts=2, **kw):
    """The pods until their Jobs end; ``kill``: (job suffix, index) SIGKILLed at worker 0's round 25."""
    cluster = Cluster(manifests(out, restarts), out, **kw)
    jobs = {name.rsplit("-", 1)[1]: name for name in cluster.jobs}
    try:
        cluster.start()
        if kill is not None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                cluster.step()
                first = [p for p in cluster.history if p.job == jobs["worker"] and p.index == 0][0]
                if "ROUND 25" in first.log.read_text(errors="replace"):
                    break
                time.sleep(0.05)
            role, index, *sig = kill
            cluster.kill(jobs[role], index, *sig)
        return cluster.run(120), cluster.logs(), jobs
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def unfaulted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    ended, logs, _ = run(out)
    assert all(c == ("Complete", None) for c in ended.values()), logs
    return weights(out)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("kill", [("server", 1), ("worker", 1), ("scheduler", 0),
                                  ("scheduler", 0, signal.SIGTERM)])
def test_a_killed_pod_is_replaced_and_the_job_completes_exactly(tmp_path, unfaulted, kill):
    ended, logs, jobs = run(tmp_path, kill)
    assert all(c == ("Complete", None) for c in ended.values()), logs
    got = weights(tmp_path)
    for key, ref in unfaulted.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=1e-6, err_msg=f"key {key}\n{logs[-6000:]}")
    if kill[0] == "scheduler":
        assert "rebuilding the job" in logs and "every node of the job reported" in logs, logs


def until(cluster, pred, timeout, what):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"no {what} within {timeout}s\n{cluster.logs()[-6000:]}")
        cluster.step()
        time.sleep(0.05)


@pytest.mark.timeout(200)
def test_a_scheduler_name_published_late_still_forms_the_job(tmp_path, unfaulted):
    ended, logs, _ = run(tmp_path, publish_late={"psjob-scheduler": 3.0})
    assert all(c == ("Complete", None) for c in ended.values()), logs
    assert "DMLC_PS_ROOT_URI='psjob-scheduler.default.svc' does not resolve yet" in logs, logs
    got = weights(tmp_path)
    for key, ref in unfaulted.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=1e-6)


@pytest.mark.timeout(200)
def test_a_pod_failing_beyond_its_restart_budget_fails_its_job(tmp_path):
    """--max-restarts 1: server 1 killed twice. Its index has failed more often than its
    budget: the Job fails with FailedIndexes (ps ends the job too: its own budget is spent)."""
    cluster = Cluster(manifests(tmp_path, restarts=1), tmp_path)
    server = next(name for name in cluster.jobs if name.endswith("-server"))
    worker = next(name for name in cluster.jobs if name.endswith("-worker"))
    try:
        cluster.start()
        first = cluster.pods[(worker, 0)]
        until(cluster, lambda: "ROUND 5" in first.log.read_text(errors="replace"), 60, "round 5")
        dead = cluster.pods[(server, 1)]
        cluster.kill(server, 1)
        until(cluster, lambda: cluster.pods.get((server, 1), dead) is not dead, 30, "replacement of server 1")
        time.sleep(2.0)
        cluster.kill(server, 1)
        ended = cluster.run(60)
    finally:
        cluster.stop()
    assert ended[server] == ("Failed", "FailedIndexes"), (ended, cluster.logs()[-6000:])
