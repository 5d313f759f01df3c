"""Joint processes (DMLC_ROLE=joint): each is a worker holding one server shard on threads
of its own, as MXNet's dist_sync_mpi and BytePS's joint role ask; real processes on
127.0.0.1, against the same job with separate server processes."""
import json
import os
import signal
import time

import pytest

from tests.helpers import cluster_env, wait_for

pytestmark = pytest.mark.process

SCRIPT = "tests/integration/joint_worker.py"


def finished(procs, workers) -> list[dict]:
    out = []
    for w in workers:
        code, stdout, stderr = procs.finish(w)
        assert code == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return sorted(out, key=lambda r: r["rank"])


def test_joint_processes_train_exactly_as_separate_servers_do(procs, port):
    env = cluster_env(port, servers=2, workers=2)
    sched = procs.role("scheduler", env)
    servers = [procs.role("server", env) for _ in range(2)]
    apart = finished(procs, [procs.role("worker", env, SCRIPT) for _ in range(2)])
    for p in (sched, *servers):
        assert procs.finish(p)[0] == 0

    joint_env = {k: v for k, v in cluster_env(port + 1 if port < 65535 else port - 1, workers=2).items()
                 if k != "DMLC_NUM_SERVER"}             # joint: one shard per process, no count to give
    sched = procs.role("scheduler", {**joint_env, "DMLC_NUM_SERVER": "2"})
    joint = finished(procs, [procs.role("joint", joint_env, SCRIPT) for _ in range(2)])
    assert procs.finish(sched)[0] == 0

    assert [r["seen"] for r in joint] == [r["seen"] for r in apart]      # bit for bit: same sums, same SGD
    assert all(r["threads"] == [] for r in apart)
    for r in joint:
        assert r["threads"] == ["ps-joint-server"]
        # its own shard in-process; the other process's over this machine's ipc:// twin
        assert sorted(r["links"].values()) == ["inproc", "ipc"], r
    assert all(sorted(r["links"].values()) == ["ipc", "ipc"] for r in apart)


def test_a_killed_joint_process_fails_the_others_within_seconds_naming_it(procs, port):
    env = {k: v for k, v in cluster_env(port, workers=2).items() if k != "DMLC_NUM_SERVER"}
    sched = procs.role("scheduler", {**env, "DMLC_NUM_SERVER": "2"})
    ranks = [procs.role("joint", {**env, "DMLC_RANK": str(r)}, SCRIPT, "hang") for r in range(2)]
    for proc in ranks:
        wait_for(lambda p=proc: p.stdout.readline().strip().startswith('{"rank"'), 60, what="a joint rank's ready")
    killed_at = time.monotonic()
    os.kill(ranks[1].pid, signal.SIGKILL)
    code, out, err = procs.finish(ranks[0], timeout=30)
    assert code == 3, err
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert "worker 1" in error or "server 1" in error, error
    assert time.monotonic() - killed_at < 20
    assert procs.finish(sched, timeout=30)[0] != 0


def test_a_joint_process_told_a_different_server_count_exits_with_the_reason(procs, port):
    env = cluster_env(port, servers=1, workers=2)
    code, _, err = procs.finish(procs.role("joint", env, SCRIPT), timeout=30)
    assert code != 0
    assert "DMLC_NUM_SERVER (1) must equal DMLC_NUM_WORKER (2)" in err, err
