"""No single point of failure: a job whose scheduler is its own process (started by hand
with PS_MAX_RESTARTS, as a Kubernetes Job runs it) survives the scheduler's SIGKILL. Its
restart at the same address rebuilds the job from the live nodes' reports (ps/rejoin.py)
and the job ends with exit 0 everywhere and the weights of an unfaulted run. Real
processes, real SIGKILL, the scheduler started again as an operator would."""
import re
import signal
import time

import numpy as np
import pytest

from tests.helpers import ROOT, Procs, cluster_env, free_port, once_per_session, read_until

pytestmark = pytest.mark.process

SCRIPT = str(ROOT / "tests" / "integration" / "recovery_worker.py")
ROUNDS = 60


def env_for(port, **extra):
    return cluster_env(port, MXNET_KVSTORE_BIGARRAY_BOUND="100000", PS_MAX_RESTARTS="3", **extra)


def start_job(procs, port, out, *worker_args, **extra):
    """Scheduler, 2 servers, 2 workers, each its own process; worker 0 paces and prints ROUND r."""
    env = env_for(port, **extra)
    scheduler = procs.role("scheduler", env)
    servers = [procs.role("server", env) for _ in range(2)]
    workers = [procs.role("worker", {**env, "DMLC_RANK": str(r)}, SCRIPT, str(out), str(ROUNDS), "sgd",
                          "--pace", "0.05", *worker_args) for r in range(2)]
    return scheduler, servers, workers


def finish_all(procs, nodes, timeout=90):
    """Every process's (exit code, output); one still running at the deadline is killed, and
    its output shown with everyone's."""
    end = time.monotonic() + timeout
    results, hung = [], []
    for i, proc in enumerate(nodes):
        try:
            code, out, err = procs.finish(proc, timeout=max(end - time.monotonic(), 1))
            results.append((code, out + err))
        except pytest.fail.Exception as exc:
            hung.append(i)
            results.append((None, str(exc)))
    if hung:
        pytest.fail(f"processes {hung} of {len(nodes)} did not exit within {timeout}s:\n" +
                    "\n".join(f"==== {i} (exit {code})\n{text[-4000:]}" for i, (code, text) in enumerate(results)))
    return results


def weights(path):
    with np.load(path / "weights.npz") as f:
        return {k: f[k] for k in f}


@pytest.fixture(scope="module")
def unfaulted(tmp_path_factory):
    """The weights of the same job nobody killed (once per session: tests on every xdist
    worker compare with them)."""
    def make(out):
        procs = Procs()
        try:
            scheduler, servers, workers = start_job(procs, free_port(), out)
            for code, text in finish_all(procs, [*workers, *servers, scheduler]):
                assert code == 0, text
        finally:
            procs.cleanup()
    return weights(once_per_session(tmp_path_factory, "scheduler-restart", make))


def kill_and_restart(procs, port, out, scheduler, servers, workers, delay, also=(), sig=signal.SIGKILL, **extra):
    """At worker 0's round 25: SIGKILL the scheduler (and ``also``: ("server"|"worker", rank)
    at the same instant), start each again ``delay`` s later as an operator (or a Kubernetes
    Job) would; wait for the whole job. Returns each process's (exit code, output), the
    restarted scheduler's last."""
    read_until(workers[0], lambda text: "ROUND 25" in text, 60, "worker 0's round 25")
    victims = [scheduler] + [(servers if role == "server" else workers)[rank] for role, rank in also]
    for proc in victims:
        proc.send_signal(sig)
    for proc in victims:
        proc.wait(10)
    time.sleep(delay)
    env = env_for(port, **extra)
    again = procs.role("scheduler", env)
    for role, rank in also:
        if role == "server":
            servers[rank] = procs.role("server", env)
        else:
            workers[rank] = procs.role("worker", {**env, "DMLC_RANK": str(rank)}, SCRIPT, str(out), str(ROUNDS), "sgd",
                                       "--pace", "0.05")
    return finish_all(procs, [*workers, *servers, again])


def check(results, out, unfaulted):
    for code, text in reversed(results):
        assert code == 0, text
    got = weights(out)
    for key, ref in unfaulted.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=1e-6, err_msg=f"key {key}")
    log = results[-1][1]
    assert "rebuilding the job" in log, log
    return log


@pytest.mark.timeout(150)
@pytest.mark.parametrize("delay,resend,sig", [(1.0, "0", signal.SIGKILL), (6.0, "0", signal.SIGKILL),
                                               (1.0, "1", signal.SIGKILL), (1.0, "0", signal.SIGTERM)])
def test_a_killed_scheduler_started_again_rebuilds_the_job_and_nothing_is_lost(tmp_path, unfaulted, delay, resend,
                                                                              sig):
    """1 s: back before the nodes call its connection lost (DISCONNECT_GRACE); 6 s: after,
    as a Kubernetes Job's first back-off (10 s) would be; PS_RESEND: the nodes number their
    messages to the new process from 1; SIGTERM: an evicted pod."""
    procs = Procs()
    try:
        port = free_port()
        scheduler, servers, workers = start_job(procs, port, tmp_path, PS_RESEND=resend)
        started = time.monotonic()
        results = kill_and_restart(procs, port, tmp_path, scheduler, servers, workers, delay, sig=sig,
                                   PS_RESEND=resend)
        log = check(results, tmp_path, unfaulted)
        took = float(re.search(r"every node of the job reported in ([\d.]+)s", log).group(1))
        worker0 = results[0][1]
        if delay > 2:
            assert "going on, and waiting up to" in worker0, worker0
        assert "rejoined the restarted scheduler" in worker0, worker0
        print(f"scheduler {sig.name} at round 25, started again {delay:g}s later: every node reported {took:.2f}s "
              f"after the first; the job took {time.monotonic() - started:.1f}s")
    finally:
        procs.cleanup()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("other", [("worker", 1), ("server", 1), ("server", 0)])
def test_the_scheduler_and_another_node_killed_at_once_lose_nothing(tmp_path, unfaulted, other):
    """Two failures at once: the restarted scheduler finds the other dead (its connection
    refused), and the other's restart takes its place as under any restart."""
    procs = Procs()
    try:
        port = free_port()
        scheduler, servers, workers = start_job(procs, port, tmp_path)
        log = check(kill_and_restart(procs, port, tmp_path, scheduler, servers, workers, 1.0, also=[other]),
                    tmp_path, unfaulted)
        assert "registered from" in log and "as the restart of" in log, log
    finally:
        procs.cleanup()


@pytest.mark.timeout(60)
def test_a_scheduler_nobody_starts_again_ends_the_job_after_the_connect_timeout(tmp_path):
    procs = Procs()
    try:
        port = free_port()
        scheduler, servers, workers = start_job(procs, port, tmp_path, PS_CONNECT_TIMEOUT="6")
        read_until(workers[0], lambda text: "ROUND 25" in text, 40, "worker 0's round 25")
        scheduler.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        results = finish_all(procs, [*workers, *servers], timeout=40)
        took = time.monotonic() - killed
        for code, text in results:
            assert code != 0, text
            assert "no scheduler came back at" in text and "PS_CONNECT_TIMEOUT" in text, text
        assert took < 6 + 2 + 10, took
    finally:
        procs.cleanup()


@pytest.mark.timeout(90)
def test_a_scheduler_killed_before_the_cluster_forms_is_registered_with_again(tmp_path, unfaulted):
    procs = Procs()
    try:
        port = free_port()
        env = env_for(port)
        scheduler = procs.role("scheduler", env)
        servers = [procs.role("server", env) for _ in range(2)]
        first = procs.role("worker", {**env, "DMLC_RANK": "0"}, SCRIPT, str(tmp_path), str(ROUNDS), "sgd",
                           "--pace", "0.05")
        time.sleep(3.0)             # registered, waiting for worker 1
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(10)
        time.sleep(1.0)
        again = procs.role("scheduler", env)
        second = procs.role("worker", {**env, "DMLC_RANK": "1"}, SCRIPT, str(tmp_path), str(ROUNDS), "sgd",
                            "--pace", "0.05")
        results = finish_all(procs, [first, second, *servers, again])
        for code, text in results:
            assert code == 0, text
        got = weights(tmp_path)
        for key, ref in unfaulted.items():
            np.testing.assert_allclose(got[key], ref, rtol=0, atol=1e-6, err_msg=f"key {key}")
        assert "came back; registering again" in results[0][1], results[0][1]
    finally:
        procs.cleanup()
