"""Real processes on 127.0.0.1: `python -m ps` for scheduler/servers, scripts for workers."""
import json
import re
import time

import psutil
import pytest

from ps import exitcodes
from tests.helpers import PYTHON, cluster_env, wait_for

pytestmark = pytest.mark.process


SCRIPT = "tests/integration/worker_script.py"


def start_job(procs, env, scenario, workers=2, servers=2, scheduler_first=True, delay=0.0):
    started = []
    if scheduler_first:
        started.append(procs.role("scheduler", env))
    started += [procs.role("server", env) for _ in range(servers)]
    ws = [procs.role("worker", env, SCRIPT, scenario) for _ in range(workers)]
    if not scheduler_first:
        time.sleep(delay)
        started.append(procs.role("scheduler", env))
    return started, ws


def results(procs, workers):
    out = {}
    for w in workers:
        code, stdout, stderr = procs.finish(w)
        assert code == 0, stderr
        line = json.loads(stdout.strip().splitlines()[-1])
        out[line["rank"]] = line["result"]
    return [out[r] for r in sorted(out)]


def all_exit_zero(procs, others):
    for p in others:
        code, _, err = procs.finish(p)
        assert code == 0, err


@pytest.mark.parametrize("scenario,expected", [
    ("sync", [3.0, 3.0, 3.0, 3.0]),
    ("sync_sgd", [0.7, 0.4, 0.1, -0.2]),
])
def test_manual_start_gives_mxnet_numbers(procs, port, scenario, expected):
    others, workers = start_job(procs, cluster_env(port), scenario)
    assert results(procs, workers) == [expected, expected]
    all_exit_zero(procs, others)


def test_sharded_str_key_exact_across_processes(procs, port):
    env = cluster_env(port, MXNET_KVSTORE_BIGARRAY_BOUND="1000")
    others, workers = start_job(procs, env, "sharded")
    assert results(procs, workers) == [True, True]
    all_exit_zero(procs, others)


def _connected_to(pid: int, port: int) -> bool:
    try:
        return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.Error:
        return False


@pytest.mark.parametrize("victim", ["server", "worker"])
def test_a_node_that_dies_before_the_cluster_forms_is_replaced_by_its_restart(procs, port, victim):
    """A server (or worker) registers, is killed before the others arrive, and is started again
    (by a supervisor, or --max-restarts): the restart takes its place and the job runs. Before,
    the restart was refused as one node too many and the cluster formed with the dead one."""
    env = cluster_env(port, servers=2, workers=2)
    sched = procs.role("scheduler", env)
    servers = [procs.role("server", env) for _ in range(2)]
    early = procs.role("worker", env, SCRIPT, "sync")
    first = servers[1] if victim == "server" else early
    wait_for(lambda: _connected_to(first.pid, port), 30, what=f"the {victim} to reach the scheduler")
    time.sleep(1.5)                     # registered, and the scheduler's watch reached it
    first.kill()
    first.wait(10)
    again = procs.role("server", env) if victim == "server" else procs.role("worker", env, SCRIPT, "sync")
    workers = [procs.role("worker", env, SCRIPT, "sync")] + ([early] if victim == "server" else [again])
    assert results(procs, workers) == [[3.0, 3.0, 3.0, 3.0]] * 2
    all_exit_zero(procs, [sched, servers[0], again if victim == "server" else servers[1]])


def test_workers_started_before_scheduler_still_form(procs, port):
    env = cluster_env(port, DMLC_PS_ROOT_URI="localhost")   # a host name works too
    others, workers = start_job(procs, env, "sync", scheduler_first=False, delay=1.5)
    assert results(procs, workers) == [[3.0] * 4] * 2
    all_exit_zero(procs, others)


def test_formation_timeout_names_who_is_missing(procs, port):
    env = cluster_env(port, PS_CONNECT_TIMEOUT="8")     # time for the others to register on a slow machine
    others, workers = start_job(procs, env, "sync", workers=1)   # the job expects 2 workers
    for p in [*others, *workers]:
        code, out, err = procs.finish(p, timeout=30)
        assert code != 0
        assert "have 1/2 workers, 2/2 servers" in err, err


def test_unreachable_scheduler(procs, port):
    env = cluster_env(port, PS_CONNECT_TIMEOUT="1.5")
    code, _, err = procs.finish(procs.role("worker", env, SCRIPT, "sync"), timeout=30)
    assert code != 0 and f"no answer from the scheduler at tcp://127.0.0.1:{port}" in err


def test_missing_env_var_is_named(procs, port):
    env = cluster_env(port)
    del env["DMLC_NUM_WORKER"]
    code, _, err = procs.finish(procs.role("server", env), timeout=30)
    assert code == exitcodes.CONFIG and "DMLC_NUM_WORKER is not set" in err
    code, _, err = procs.finish(procs.role("worker", env, SCRIPT, "sync"), timeout=30)
    assert code != 0 and "ConfigError: DMLC_NUM_WORKER is not set" in err


def test_python_m_ps_refuses_worker_role(procs, port):
    code, _, err = procs.finish(procs.start([PYTHON, "-m", "ps"], {**cluster_env(port), "DMLC_ROLE": "worker"}))
    assert code == exitcodes.CONFIG and "training script" in err


def test_scheduler_port_taken_is_a_clear_error(procs, port):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        code, _, err = procs.finish(procs.role("scheduler", cluster_env(port)), timeout=30)
    assert code == 1 and f"cannot bind 127.0.0.1:{port}" in err


def test_ipc_transport_and_port_range(procs, port):
    """DMLC_LOCAL=1: servers and workers talk over ipc://; PS_PORT_RANGE bounds tcp ports."""
    env = cluster_env(port, DMLC_LOCAL="1")
    others, workers = start_job(procs, env, "sync")
    assert results(procs, workers) == [[3.0] * 4] * 2
    all_exit_zero(procs, others)
    lo = port + 1 if port < 60000 else port - 200
    env = cluster_env(port, PS_PORT_RANGE=f"{lo}-{lo + 150}", PS_VERBOSE="1")
    others, workers = start_job(procs, env, "sync")
    assert results(procs, workers) == [[3.0] * 4] * 2
    for p in others[1:]:
        code, _, err = procs.finish(p)
        bound = [int(port) for port in re.findall(r"bound tcp://[\d.]+:(\d+)", err)]
        assert code == 0 and bound and all(lo <= b <= lo + 150 for b in bound), err
