"""Fault injection with real processes: lost messages, killed nodes, garbage on the ports."""
import json
import os
import signal
import time

import pytest

from tests.helpers import cluster_env, processes_with_env, read_until, wait_for

pytestmark = pytest.mark.process


SCRIPT = "tests/integration/fault_worker.py"


def lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def start(procs, env, scenario, *args, workers=2, servers=2):
    others = [procs.role("scheduler", env)] + [procs.role("server", env) for _ in range(servers)]
    ws = [procs.role("worker", env, SCRIPT, scenario, *args) for _ in range(workers)]
    return others, ws


def test_resend_with_20_percent_drops_is_exact(procs, port):
    env = cluster_env(port, PS_RESEND="1", PS_DROP_MSG="20", PS_RESEND_TIMEOUT="40",
                      MXNET_KVSTORE_BIGARRAY_BOUND="1000")
    others, workers = start(procs, env, "drops", "50")
    dropped = dups = 0
    for w in workers:
        code, out, err = procs.finish(w, timeout=110)
        assert code == 0, err[-2000:]
        (result,) = [x for x in lines(out) if x["event"] == "result"]
        assert result["bad"] == 0
        dropped += result["dropped"]
        dups += result["stats"]["duplicates"]
        assert result["stats"]["resent"] > 0
    assert dropped > 30           # the drops really happened...
    for p in others:              # ...and every process still ended cleanly
        assert procs.finish(p, timeout=30)[0] == 0
    print(f"drops injected on workers: {dropped}, duplicates dropped: {dups}")


@pytest.mark.parametrize("victim", ["worker", "server", "scheduler"])
def test_killed_node_is_reported_and_everyone_exits(procs, port, victim):
    timeout = 10.0
    env = cluster_env(port, PS_HEARTBEAT_TIMEOUT=str(timeout))
    others, workers = start(procs, env, "long")
    survivor = workers[0]
    target = {"worker": workers[1], "server": others[1], "scheduler": others[0]}[victim]
    read_until(survivor, lambda line: '"started"' in line, timeout=30, what="the job to start")
    killed_at = time.time()
    os.kill(target.pid, signal.SIGKILL)
    code, out, err = procs.finish(survivor, timeout=timeout + 20)
    (error,) = [x for x in lines(out) if x["event"] == "error"]
    assert code == 3 and error["type"] == "PeerLostError"
    assert f"{victim} " in error["message"] and "1" in error["message"]
    latency = error["t"] - killed_at
    # the scheduler watches every node's connection, and every node the scheduler's: a closed
    # connection counts after DISCONNECT_GRACE (2 s), long before the heartbeat timeout (10 s)
    assert latency < 8.0, latency
    print(f"{victim} death detected by the surviving worker after {latency:.2f}s")
    for p in others:
        if p is not target:
            code, _, err = procs.finish(p, timeout=timeout + 20)
            assert code != 0 and ("presumed dead" in err or "died" in err), err


def test_garbage_on_scheduler_and_server_ports_does_not_hurt(procs, port):
    others, workers = start(procs, cluster_env(port, MXNET_KVSTORE_BIGARRAY_BOUND="1000"), "garbage")
    for w in workers:
        code, out, err = procs.finish(w, timeout=100)
        assert code == 0, err[-2000:]
        (result,) = [x for x in lines(out) if x["event"] == "result"]
        assert result["bad"] == 0
    for p in others:
        code, out, err = procs.finish(p, timeout=30)
        assert code == 0, f"{p.args} exited {code}:\n{out[-2000:]}\n{err[-4000:]}"   # its own words if it dies


def job_processes(port):
    """pids of every live process whose environment names this job's scheduler port."""
    return processes_with_env("DMLC_PS_ROOT_PORT", str(port))


def test_killed_worker_through_the_launcher_ends_the_job(procs):
    import re
    from tests.helpers import PYTHON
    env = cluster_env(0)
    launcher = procs.start([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", "--launcher", "local",
                            PYTHON, SCRIPT, "long"], env)
    port = int(re.search(r"scheduler [\d.]+:(\d+)",
                         read_until(launcher, lambda line: "scheduler " in line, 60, "the summary line")).group(1))
    started = read_until(launcher, lambda line: line.startswith("[worker 1]") and '"started"' in line, 60,
                         "worker 1 to start")
    victim = json.loads(started.split("] ", 1)[1])["pid"]
    assert len(job_processes(port)) >= 4
    os.kill(victim, signal.SIGKILL)
    code, out, err = procs.finish(launcher, timeout=40)
    assert code != 0
    wait_for(lambda: not job_processes(port), timeout=10, what="every process of the job to be gone")
