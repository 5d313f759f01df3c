"""--launcher ssh across three network-namespace hosts (10.77.0.2-4, sshd in each), with the
launcher in its own namespace (10.77.0.1). Nothing here addresses 10.77.x from the root
namespace: the launcher, the scheduler in it, ssh clients and all job processes run in
namespaces the fixture created (testinfra §3 safety rule)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from .launch_util import PY, ROOT, bash, marked_pids, need_root, poll_for, worker_cmd

pytestmark = [pytest.mark.process, pytest.mark.launcher]


@contextlib.contextmanager
def shaped_links(ns_hosts, rate):
    """Every host's link shaped to ``rate`` both ways (its egress; the others' egress is its
    ingress), removed afterwards: the fixture's hosts are shared by the module's tests."""
    hosts = [f'{ns_hosts["prefix"]}{i}' for i in (1, 2, 3)]
    try:
        for ns in hosts:
            out = bash(f"ip netns exec {ns} tc qdisc replace dev eth0 root tbf rate {rate} burst 64kb latency 20ms")
            assert out.returncode == 0, out.stderr
        yield
    finally:
        for ns in hosts:
            bash(f"ip netns exec {ns} tc qdisc del dev eth0 root")


def test_ssh_job_on_three_namespace_hosts(launch, sshd, ns_hosts):
    env = {"PATH": sshd["PATH"], "PYTHONPATH": ROOT}
    netns = ["ip", "netns", "exec", ns_hosts["launcher_ns"]]
    with open(ns_hosts["hostfile"]) as f:
        assert f.read().split() == ["10.77.0.2:22", "10.77.0.3:22", "10.77.0.4:22"]
    job = launch(["-n", "2", "-s", "2", "-H", ns_hosts["hostfile"], "--env", "PS_TEST_SHOW:DMLC_NODE_HOST",
                  *worker_cmd()], env=env, prefix=netns)
    assert job.wait(60) == 0, job.output
    assert re.search(r"^\[launcher\] 2 servers, 2 workers on 3 hosts; scheduler 10\.77\.0\.1:\d+$",
                     job.output, re.MULTILINE), job.output
    # servers on hosts 1, 2; workers (processes 2, 3) on hosts 3 and 1
    assert job.worker_lines(0) == ["[worker 0] env DMLC_NODE_HOST='10.77.0.4'",
                                           "[worker 0] rank=0 sum=3.0 task=2"], job.output
    assert job.worker_lines(1) == ["[worker 1] env DMLC_NODE_HOST='10.77.0.2'",
                                           "[worker 1] rank=1 sum=3.0 task=3"], job.output

    job = launch(["-n", "2", "-s", "2", "-H", ns_hosts["hostfile"], "--env", "PS_TEST_HANG:1", *worker_cmd()],
                 env=env, prefix=netns)
    job.wait_for(lambda j: j.ready() == 2)
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.wait(10) == 130, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10 - (time.monotonic() - t0)), marked_pids(job.marker)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("flags", [["--wide"], ["--wide", "--update-on-worker"]], ids=["server-optimizer", "worker-optimizer"])
def test_an_unmodified_gluon_script_across_shaped_namespace_hosts(launch, sshd, ns_hosts, flags):
    """MXNet's dist_sync over a real network: 3 hosts, every link shaped to 100 Mbit/s both
    ways, a 2 MiB weight in several chunks, the optimizer on the servers or (--update-on-worker)
    on the workers; either way the Trainer's pushpulls are answered chunk by chunk across the
    network (Op.STREAM). Every worker ends with single-process weights."""
    pytest.importorskip("mxnet")
    script = os.path.join(ROOT, "tests", "mxnet", "plain_gluon.py")
    with shaped_links(ns_hosts, "100mbit"):
        job = launch(["-n", "2", "-s", "2", "-H", ns_hosts["hostfile"], PY, script, *flags],
                     env={"PATH": sshd["PATH"], "PYTHONPATH": ROOT}, prefix=["ip", "netns", "exec", ns_hosts["launcher_ns"]])
        assert job.wait(150) == 0, job.output
    workers = [json.loads(line.split("RESULT ", 1)[1]) for line in job.output.splitlines() if "RESULT " in line]
    assert sorted(w["rank"] for w in workers) == [0, 1], job.output
    assert {w["kvstore"] for w in workers} == {"ps.mxnet.Dist_Sync"}, job.output
    ref = subprocess.run([PY, script, "--local", *flags], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    (local,) = [json.loads(line.split("RESULT ", 1)[1]) for line in ref.stdout.splitlines() if "RESULT " in line]
    for worker in workers:
        for name, values in local["weights"].items():
            np.testing.assert_allclose(worker["weights"][name], values, atol=1e-5, err_msg=name)


@pytest.mark.timeout(300)
def test_three_trainers_in_one_process_across_shaped_namespace_hosts(launch, sshd, ns_hosts, tmp_path):
    """A GAN's shape over a real network (100 Mbit/s links, 3 servers on 3 hosts): three
    Trainers with kvstore='dist_sync' per worker keep their own keys and optimizers on the
    servers (tests/mxnet/gan_dist.py) and end with MXNet's local-store weights."""
    pytest.importorskip("mxnet")
    script = os.path.join(ROOT, "tests", "mxnet", "gan_dist.py")
    with shaped_links(ns_hosts, "100mbit"):
        job = launch(["-n", "2", "-s", "3", "-H", ns_hosts["hostfile"], PY, script, str(tmp_path)],
                     env={"PATH": sshd["PATH"], "PYTHONPATH": ROOT}, prefix=["ip", "netns", "exec", ns_hosts["launcher_ns"]])
        assert job.wait(200) == 0, job.output
    workers = [json.loads(line.split("RESULT ", 1)[1]) for line in job.output.splitlines() if "RESULT " in line]
    assert sorted(w["rank"] for w in workers) == [0, 1], job.output
    ref = subprocess.run([PY, script, str(tmp_path), "--local"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    (local,) = [json.loads(line.split("RESULT ", 1)[1]) for line in ref.stdout.splitlines() if "RESULT " in line]
    for worker in workers:
        for name, values in local["weights"].items():
            np.testing.assert_allclose(worker["weights"][name], values, atol=1e-5, err_msg=name)


def assert_unfaulted(launch, tmp_path, job, args, workers=3):
    """Every worker of the hurt run (``tmp_path/hurt``) ends with the weights of the same job
    run on this host with nobody hurt (``job`` up to the script, then its output dir, ``args``)."""
    (tmp_path / "ref").mkdir()
    ref = launch([*job[:-2], "--launcher", "local", *job[-2:], str(tmp_path / "ref"), *args], env={"PYTHONPATH": ROOT})
    assert ref.wait(120) == 0, ref.output
    for rank in range(workers):
        with np.load(tmp_path / "hurt" / f"weights-rank{rank}.npz") as got, \
                np.load(tmp_path / "ref" / "weights.npz") as want:
            assert sorted(got) == sorted(want)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-6, err_msg=f"rank {rank} key {key}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_node_killed_on_a_shaped_namespace_host_comes_back_over_ssh(launch, sshd, ns_hosts, tmp_path, role):
    """--max-restarts across hosts: a server or worker SIGKILLed mid-job on its host (links
    shaped to 100 Mbit/s) is started again there over ssh, and the job ends with the weights
    of an unfaulted run on loopback (same deterministic gradients)."""
    script = os.path.join(ROOT, "tests", "integration", "recovery_worker.py")
    rounds, bound = "30", "MXNET_KVSTORE_BIGARRAY_BOUND:100000"     # key 5 cut across both servers
    (tmp_path / "hurt").mkdir()
    with shaped_links(ns_hosts, "100mbit"):
        job = launch(["-n", "2", "-s", "2", "-H", ns_hosts["hostfile"], "--max-restarts", "2", "--env", bound,
                      "--env", "PS_HEARTBEAT_INTERVAL:0.5", "--env", "PS_HEARTBEAT_TIMEOUT:10",
                      PY, script, str(tmp_path / "hurt"), rounds, "sgd", "--kill", role, "1", "12", "push"],
                     env={"PATH": sshd["PATH"], "PYTHONPATH": ROOT}, prefix=["ip", "netns", "exec", ns_hosts["launcher_ns"]])
        assert job.wait(200) == 0, job.output
    assert f"{role} 1 was killed by SIGKILL: starting it again (restart 1 of 2)" in job.output, job.output
    if role == "server":
        assert re.search(r"server 1 \(S\[\d+\]\) recovered \d+ keys", job.output), job.output
    assert_unfaulted(launch, tmp_path, ["-n", "2", "-s", "2", "--env", bound, PY, script], [rounds, "sgd"], workers=2)


@pytest.mark.timeout(300)
def test_a_dead_host_its_servers_and_worker_start_again_on_the_live_hosts(launch, sshd, ns_hosts, tmp_path):
    """A machine dies mid-job: host 1's link goes down (nothing answers, no FIN, no RST) and
    every process on it is SIGKILLed, its sshd too. With 4 servers on 3 hosts it runs two
    servers (0 and 3) and a worker (2). The scheduler declares them dead by their silence
    (PS_HEARTBEAT_TIMEOUT), the launcher stops the ssh clients still waiting on the silent
    host, finds that host no longer answers ssh, and starts all three on the live hosts; the
    job ends with the weights of an unfaulted run. Before: the ssh clients waited (TCP
    keepalive: hours) and nothing was restarted; the second death ended the job ("one failure
    at a time"); and servers 3 and 0, neighbours in a ring in rank order, would have lost
    server 3's only replica: the ring now interleaves hosts."""
    script = os.path.join(ROOT, "tests", "integration", "recovery_worker.py")
    rounds, bound = "40", "MXNET_KVSTORE_BIGARRAY_BOUND:100000"
    (tmp_path / "hurt").mkdir()
    dead = f'{ns_hosts["prefix"]}1'                   # 10.77.0.2: servers 0 and 3, worker 2
    job = launch(["-n", "3", "-s", "4", "-H", ns_hosts["hostfile"], "--max-restarts", "3", "--env", bound,
                  "--env", "PS_HEARTBEAT_INTERVAL:0.5", "--env", "PS_HEARTBEAT_TIMEOUT:4",
                  PY, script, str(tmp_path / "hurt"), rounds, "adam", "--pace", "0.15"],
                 env={"PATH": sshd["PATH"], "PYTHONPATH": ROOT}, prefix=["ip", "netns", "exec", ns_hosts["launcher_ns"]])
    job.wait_for(lambda j: "[worker 0] ROUND 15" in j.output, 60)
    assert bash(f"ip netns exec {dead} ip link set eth0 down").returncode == 0
    pids = bash(f"ip netns pids {dead}").stdout.split()
    assert pids, "no process in the dead host's namespace"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    assert job.wait(200) == 0, job.output
    out = job.output
    for name in ("server 0", "server 3", "worker 2"):
        assert re.search(rf"{name} is dead to the scheduler \(.*sent no heartbeat.*\) but its process here "
                         r"\(ssh to 10\.77\.0\.2\) still runs", out), out
        assert f"{name} was unreachable: starting it again" in out, out
        assert re.search(rf"host 10\.77\.0\.2 does not answer ssh: {name} starts on 10\.77\.0\.[34] instead", out), out
    for rank in (0, 3):
        assert re.search(rf"server {rank} \(S\[\d+\]\) recovered \d+ keys", out), out
    assert_unfaulted(launch, tmp_path, ["-n", "3", "-s", "4", "--env", bound, PY, script], [rounds, "adam"])


@pytest.mark.timeout(300)
def test_a_partitioned_host_is_replaced_and_its_old_nodes_leave_when_it_heals(launch, sshd, ns_hosts, tmp_path):
    """A network partition, not a death: host 3's link goes down for 15 s with every process on
    it still running, then comes back. Its server and worker are declared dead by their silence,
    started again on the live hosts and recovered; the old ones, cut off from the scheduler, stop
    (their own PS_HEARTBEAT_TIMEOUT, or the ssh watchdog once the link is back) and do not come
    back into the job when the link does. The job ends with the weights of an unfaulted run."""
    script = os.path.join(ROOT, "tests", "integration", "recovery_worker.py")
    rounds, bound = "60", "MXNET_KVSTORE_BIGARRAY_BOUND:100000"
    (tmp_path / "hurt").mkdir()
    cut = f'{ns_hosts["prefix"]}3'                    # 10.77.0.4: server 2 and worker 2
    job = launch(["-n", "3", "-s", "3", "-H", ns_hosts["hostfile"], "--max-restarts", "2", "--env", bound,
                  "--env", "PS_HEARTBEAT_INTERVAL:0.5", "--env", "PS_HEARTBEAT_TIMEOUT:4",
                  PY, script, str(tmp_path / "hurt"), rounds, "sgd", "--pace", "0.15"],
                 env={"PATH": sshd["PATH"], "PYTHONPATH": ROOT}, prefix=["ip", "netns", "exec", ns_hosts["launcher_ns"]])
    job.wait_for(lambda j: "[worker 0] ROUND 15" in j.output, 60)

    def pythons():
        pids = bash(f"ip netns pids {cut}").stdout.split()
        return {p for p in pids if "python" in bash(f"cat /proc/{p}/cmdline 2>/dev/null | tr '\\0' ' '").stdout}
    before = pythons()
    assert len(before) >= 2, before                  # its server and its worker
    try:
        assert bash(f"ip netns exec {cut} ip link set eth0 down").returncode == 0
        healed_at = time.monotonic() + 15
        job.wait_for(lambda j: j.output.count("is back after") == 2, 60)
        time.sleep(max(0.0, healed_at - time.monotonic()))
    finally:
        assert bash(f"ip netns exec {cut} ip link set eth0 up").returncode == 0
    assert job.wait(200) == 0, job.output
    out = job.output
    for name in ("server 2", "worker 2"):
        assert f"{name} was unreachable: starting it again" in out, out
    assert re.search(r"server 2 \(S\[\d+\]\) recovered \d+ keys", out), out
    assert not pythons() & before, out               # the old ones stopped themselves
    assert_unfaulted(launch, tmp_path, ["-n", "3", "-s", "3", "--env", bound, PY, script], [rounds, "sgd"])


@pytest.mark.timeout(150)
def test_ps_torch_under_a_bare_mpirun_on_two_namespace_hosts(sshd, ns_hosts):
    """Horovod's multi-host launch, `mpirun -np 4 -H a:2,b:2 -x DMLC_PS_ROOT_URI=a python
    train.py`, with Open MPI starting the ranks on hosts 10.77.0.2 and 10.77.0.3 through ssh
    (from the launcher's namespace): rank 0 starts the scheduler on host a, each rank a
    server on its own host; nothing is left behind. Without DMLC_PS_ROOT_URI every rank refuses, naming the fix."""
    pytest.importorskip("torch")
    need_root("mpirun.openmpi")
    from .test_launcher_mpi import HVD_SCRIPT, hvd_results, no_ps_processes_of
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "OMPI_"))}
    env.update(PATH=sshd["PATH"], PYTHONPATH=ROOT, OMPI_MCA_plm_rsh_agent="ssh -p 22",
               OMPI_MCA_oob_tcp_if_include="10.77.0.0/24", OMPI_MCA_btl_tcp_if_include="10.77.0.0/24")
    base = ["ip", "netns", "exec", ns_hosts["launcher_ns"], "mpirun.openmpi", "--allow-run-as-root",
            "--oversubscribe", "--mca", "btl", "self,tcp", "-np", "4", "-H", "10.77.0.2:2,10.77.0.3:2",
            "-x", "PYTHONPATH", "-x", "PATH"]
    port = str(29000 + os.getpid() % 1000)
    proc = subprocess.run([*base, "-x", "DMLC_PS_ROOT_URI=10.77.0.2", "-x", f"DMLC_PS_ROOT_PORT={port}",
                           PY, "-c", HVD_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hvd_results(proc.stdout) == [[str(r), "4", str(r % 2), "2", "2.5", "10.77.0.2"] for r in range(4)], \
        proc.stdout + proc.stderr
    assert poll_for(lambda: no_ps_processes_of(port), 10)      # the scheduler and servers ended with their ranks

    proc = subprocess.run([*base, PY, "-c", HVD_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "set DMLC_PS_ROOT_URI to rank 0's host" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_cluster_check_names_the_host_whose_link_is_slow(launch, sshd, ns_hosts, tmp_path):
    """`python -m ps.check` as the job's command: with host 3's outgoing link shaped to
    20 Mbit/s and the others to 1 Gbit/s, exactly the paths from host 3's server to workers
    on other hosts are named slow, and --strict fails the job. With one server for workers
    on three hosts, the scheduler warns of the placement."""
    env = {"PATH": sshd["PATH"], "PYTHONPATH": ROOT}
    netns = ["ip", "netns", "exec", ns_hosts["launcher_ns"]]
    out = tmp_path / "check.json"
    slow_host = "10.77.0.4"
    with shaped_links(ns_hosts, "1gbit"):
        shaped = bash(f"ip netns exec {ns_hosts['prefix']}3 tc qdisc replace dev eth0 root tbf rate 20mbit "
                      "burst 32kb latency 50ms")
        assert shaped.returncode == 0, shaped.stderr
        job = launch(["-n", "3", "-s", "3", "-H", ns_hosts["hostfile"], PY, "-m", "ps.check", "--mb", "2",
                      "--path-mb", "1", "--pings", "5", "--rounds", "1", "--json", str(out), "--strict"],
                     env=env, prefix=netns)
        assert job.wait(120) == 1, job.output            # --strict: a slow path fails the job
        found = json.loads(out.read_text())
        assert len(found["paths"]) == 9 and found["workers"] == 3 and found["servers"] == 3, found
        # by rate, across hosts (a round trip, or a same-host path, compared only with the other
        # same-host paths, can be named too on a loaded machine: CPU noise, not what is tested)
        slow = {(p["server_host"], p["worker_host"]) for p in found["paths"]
                if "MB/s against" in p["slow"] and not p["same_host"]}
        expected = {(p["server_host"], p["worker_host"]) for p in found["paths"]
                    if p["server_host"] == slow_host and p["worker_host"] != slow_host}
        assert expected and slow == expected, found
        rates = {(p["server_host"], p["worker_host"]): p["mb_per_s"] for p in found["paths"]}
        assert all(rates[k] < 3.0 for k in expected), rates                 # 20 Mbit/s = 2.5 MB/s
        assert all(r > 10.0 for k, r in rates.items() if k not in expected), rates
        assert "slow path(s): server" in job.output and f"({slow_host})" in job.output, job.output

        one = launch(["-n", "3", "-s", "1", "-H", ns_hosts["hostfile"], PY, "-m", "ps.check", "--mb", "1",
                      "--path-mb", "0.25", "--pings", "3", "--rounds", "1"], env=env, prefix=netns)
        assert one.wait(120) == 0, one.output
        assert re.search(r"workers run on 3 hosts, servers on only 1 \(10\.77\.0\.\d\)", one.output), one.output
