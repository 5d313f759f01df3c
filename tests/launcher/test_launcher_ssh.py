"""--launcher ssh against a real sshd listening on 127.0.0.1 and 127.0.0.2 (testinfra §2)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from .launch_util import PY, ROOT, marked_pids, poll_for, worker_cmd

pytestmark = [pytest.mark.process, pytest.mark.launcher]


def ssh_env(sshd) -> dict:
    # remote shells get no venv: PYTHONPATH is forwarded so that `import ps` works there
    return {"PATH": sshd["PATH"], "PYTHONPATH": ROOT}


def test_job_on_two_hosts_with_ports_and_quoted_env(launch, sshd):
    value = "a b 'single' \"double\" $HOME `x` \\ ; |"
    job = launch(["-n", "2", "-s", "2", "-H", f'{sshd["SSHD_DIR"]}/hosts',
                  "--env", "PS_TEST_SHOW:TRICKY,DMLC_NODE_HOST,SRV_ONLY", "--env", f"TRICKY:{value}",
                  "--env-server", "SRV_ONLY:1", *worker_cmd()], env=ssh_env(sshd))
    assert job.wait(60) == 0, job.output
    assert re.search(r"^\[launcher\] 2 servers, 2 workers on 2 hosts; scheduler 127\.0\.0\.1:\d+$",
                     job.output, re.MULTILINE), job.output
    # placement: servers first, process i on hosts[i % 2]: workers 0, 1 on 127.0.0.1, 127.0.0.2
    for rank, host in ((0, "127.0.0.1"), (1, "127.0.0.2")):
        assert job.worker_lines(rank) == [
            f"[worker {rank}] env TRICKY={value!r}",
            f"[worker {rank}] env DMLC_NODE_HOST='{host}'",
            f"[worker {rank}] env SRV_ONLY=None",
            f"[worker {rank}] rank={rank} sum=3.0 task={2 + rank}"], job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10)  # remote watchdogs end too


def test_sigint_stops_remote_processes(launch, sshd):
    job = launch(["-n", "2", "-s", "2", "-H", f'{sshd["SSHD_DIR"]}/hosts', "--env", "PS_TEST_HANG:1",
                  *worker_cmd()], env=ssh_env(sshd))
    job.wait_for(lambda j: j.ready() == 2)
    pids = marked_pids(job.marker)
    assert len(pids) >= 4  # servers and workers (plus their remote shells' watchdogs)
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.wait(10) == 130, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10 - (time.monotonic() - t0)), marked_pids(job.marker)


def test_remote_failure_exit_status(launch, sshd):
    job = launch(["-n", "2", "-s", "1", "-H", f'{sshd["SSHD_DIR"]}/hosts', "--env", "PS_TEST_FAIL:0:5",
                  *worker_cmd()], env=ssh_env(sshd))
    assert job.wait(30) == 5, job.output
    assert "[launcher] worker 0 exited with status 5: stopping the job" in job.lines
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)


def test_sync_dst_dir_fewer_hosts_than_processes(launch, sshd, tmp_path):
    """MXNet #17470: 2 hosts, 4 processes; one rsync per host, the job runs in the copy."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    shutil.copy(worker_cmd()[1], src / "train.py")
    job = launch(["-n", "3", "-s", "1", "-H", f'{sshd["SSHD_DIR"]}/hosts', "--sync-dst-dir", str(dst),
                  "-v", PY, "train.py"], env=ssh_env(sshd), cwd=str(src))
    assert job.wait(60) == 0, job.output
    assert (dst / "train.py").exists()
    assert len(job.matching("[launcher] run: rsync ")) == 2, job.output
    assert sorted(ln.split(" task=")[0] for ln in job.matching("[worker ")
                  if " sum=" in ln) == [f"[worker {r}] rank={r} sum=6.0" for r in range(3)], job.output


def test_mode_mpi_over_ssh_runs_joint_workers_and_no_server(launch, sshd, tmp_path):
    """The dist_sync_mpi proposal's launch line: --mode mpi with --sync-dst-dir over real sshd."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    shutil.copy(worker_cmd()[1], src / "train.py")
    job = launch(["-n", "3", "-H", f'{sshd["SSHD_DIR"]}/hosts', "--launcher", "ssh", "--sync-dst-dir", str(dst),
                  "--mode", "mpi", "--env", "PS_TEST_SHOW:DMLC_ROLE,DMLC_NUM_SERVER", PY, "train.py"],
                 env=ssh_env(sshd), cwd=str(src))
    assert job.wait(60) == 0, job.output
    assert re.search(r"^\[launcher\] 3 joint workers \(each holding a server shard\) on 2 hosts; ",
                     job.output, re.MULTILINE), job.output
    assert not job.matching("[server "), job.output
    for rank in range(3):
        assert job.worker_lines(rank) == [f"[worker {rank}] env DMLC_ROLE='joint'",
                                          f"[worker {rank}] env DMLC_NUM_SERVER='3'",
                                          f"[worker {rank}] rank={rank} sum=6.0 task={rank}"], job.output


def test_server_hosts_hold_the_servers_and_the_cluster_check_sees_it(launch, sshd, tmp_path):
    """--server-hosts: the servers run only on the hosts given for them, the workers on -H's;
    `python -m ps.check` measures every path across the two."""
    with open(f'{sshd["SSHD_DIR"]}/hosts') as f:
        hosts = f.read().split()             # 127.0.0.1:port, 127.0.0.2:port
    (tmp_path / "workers").write_text(hosts[0] + "\n")
    (tmp_path / "servers").write_text(hosts[1] + "\n")
    out = tmp_path / "check.json"
    job = launch(["-n", "2", "-H", str(tmp_path / "workers"), "--server-hosts", str(tmp_path / "servers"),
                  PY, "-m", "ps.check", "--mb", "2", "--path-mb", "1", "--pings", "3", "--rounds", "1",
                  "--json", str(out)], env=ssh_env(sshd))
    assert job.wait(90) == 0, job.output
    assert re.search(r"^\[launcher\] 2 servers, 2 workers on 2 hosts; ", job.output, re.MULTILINE), job.output
    found = json.loads(out.read_text())
    worker_host, server_host = (h.split(":")[0] for h in hosts[:2])
    assert sorted((p["server"], p["server_host"], p["worker"], p["worker_host"]) for p in found["paths"]) == [
        (s, server_host, w, worker_host) for s in range(2) for w in range(2)], found
    assert not any(p["same_host"] for p in found["paths"]), found


def test_remote_processes_stop_when_the_launcher_is_killed(launch, sshd):
    """SIGKILL leaves the launcher no chance to clean up: the closed ssh connections do it."""
    job = launch(["-n", "1", "-s", "1", "-H", f'{sshd["SSHD_DIR"]}/hosts', "--env", "PS_TEST_HANG:1",
                  *worker_cmd()], env=ssh_env(sshd))
    job.wait_for(lambda j: j.ready() == 1)
    os.kill(job.proc.pid, signal.SIGKILL)
    assert job.wait(10) == -signal.SIGKILL
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)


def test_the_job_key_reaches_remote_shells_over_ssh_and_is_removed(launch, sshd):
    """No shared filesystem assumed: each remote shell reads the key from its ssh connection
    into its own 0600 mktemp file (not the launcher's path), the same key everywhere, gone
    once the job ends."""
    script = ("import os, stat, hashlib, ps; kv = ps.KVStore('dist_sync'); p = os.environ['PS_JOB_KEY_FILE']; "
              "print('key', p, oct(stat.S_IMODE(os.stat(p).st_mode)), "
              "hashlib.sha256(open(p, 'rb').read()).hexdigest()[:16], flush=True); kv.close()")
    job = launch(["-n", "2", "-s", "1", "-H", f'{sshd["SSHD_DIR"]}/hosts', PY, "-c", script], env=ssh_env(sshd))
    assert job.wait(60) == 0, job.output
    seen = [line.split("] ", 1)[1].split() for line in job.matching("[worker ")]
    assert len(seen) == 2, job.output
    paths = {s[1] for s in seen}
    assert len(paths) == 2 and all(os.path.basename(p).startswith("ps-job-key.") for p in paths), seen
    assert {s[2] for s in seen} == {"0o600"} and len({s[3] for s in seen}) == 1, seen
    assert poll_for(lambda: not any(os.path.exists(p) for p in paths), 10), paths


def test_a_scripts_own_optimizer_runs_on_remote_servers(launch, sshd):
    """The point of the key: an optimizer class defined in the script, pickled and signed by
    the workers, runs on servers started over ssh, with one process's numbers."""
    pytest.importorskip("mxnet")
    script = os.path.join(ROOT, "tests", "mxnet", "plain_gluon.py")
    job = launch(["-n", "2", "-s", "2", "-H", f'{sshd["SSHD_DIR"]}/hosts', PY, script, "--own-optimizer"],
                 env=ssh_env(sshd))
    assert job.wait(120) == 0, job.output
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in job.lines if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1], job.output
    ref = subprocess.run([PY, script, "--local", "--own-optimizer"], capture_output=True, text=True, timeout=120,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)})
    (local,) = [json.loads(line.split("RESULT ", 1)[1]) for line in ref.stdout.splitlines() if "RESULT " in line]
    for r in results:
        for name, values in local["weights"].items():
            np.testing.assert_allclose(r["weights"][name], values, atol=1e-5, err_msg=name)


def test_max_restarts_starts_a_killed_server_again_over_ssh(launch, sshd, tmp_path):
    """--max-restarts with --launcher ssh: the killed server is started again over a new ssh
    connection (with the job key on stdin), recovers, and the job ends normally."""
    script = os.path.join(ROOT, "tests", "integration", "recovery_worker.py")
    job = launch(["-n", "2", "-s", "2", "-H", f'{sshd["SSHD_DIR"]}/hosts', "--max-restarts", "1",
                  "--env", "MXNET_KVSTORE_BIGARRAY_BOUND:100000",
                  PY, script, str(tmp_path), "30", "sgd", "--kill", "server", "1", "10", "push"], env=ssh_env(sshd))
    assert job.wait(120) == 0, job.output
    # the remote shell passes the signal on as 128 + 9 (ssh itself would say 255)
    assert "server 1 was killed by SIGKILL: starting it again (restart 1 of 1)" in job.output, job.output
    assert re.search(r"server 1 \(S\[10\]\) recovered \d+ keys", job.output), job.output
    assert "DONE rank 0" in job.output and "DONE rank 1" in job.output, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10)
