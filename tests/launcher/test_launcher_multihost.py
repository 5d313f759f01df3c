"""--launcher ssh across three network-namespace hosts (10.77.0.2-4, sshd in each), with the
launcher in its own namespace (10.77.0.1). Nothing here addresses 10.77.x from the root
namespace: the launcher, the scheduler in it, ssh clients and all job processes run in
namespaces the fixture created (testinfra §3 safety rule)."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from .launch_util import ROOT, marked_pids, poll_for, worker_cmd

pytestmark = pytest.mark.launcher


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
