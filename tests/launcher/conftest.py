"""Fixtures for the launcher tests: real daemons (sshd, Slurm) from the recipes in
tests/infra/*.sh (adapted from testinfra.md), and ``launch``, which runs
the launcher CLI and kills whatever it left behind at teardown."""
from __future__ import annotations

import os
import shutil
import signal

import pytest

from .launch_util import INFRA, PY, Launch, bash, need_root, poll_for, source


@pytest.fixture
def launch():
    """launch(args, env=None, ...) -> Launch; everything it started is killed at teardown."""
    started: list[Launch] = []

    def start(args, **kw) -> Launch:
        job = Launch(args, **kw)
        started.append(job)
        return job
    yield start
    for job in started:
        job.cleanup()


# --- daemons ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def sshd():
    """sshd on 127.0.0.1 and 127.0.0.2 (one free port); PATH puts its ssh wrapper first."""
    need_root("/usr/sbin/sshd", "ssh", "rsync")
    v = source("sshd_up.sh", "SSHD_DIR", "SSHD_PORT", "SSHD_PID", env={"PYTHON": PY})
    if not v.get("SSHD_PID"):
        pytest.skip(f"sshd did not start: {v}")
    v["PATH"] = f'{v["SSHD_DIR"]}/bin:{os.environ["PATH"]}'
    try:
        yield v
    finally:
        try:
            os.kill(int(v["SSHD_PID"]), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
        shutil.rmtree(v["SSHD_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def slurm():
    """A single-node slurmctld + slurmd + munged (fixed ports 16817/16818)."""
    need_root("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "srun")
    v = source("slurm_up.sh", "SLURM_DIR", "SLURM_CONF")
    try:
        ok = poll_for(lambda: bash("sinfo -h -o '%t'", env={"SLURM_CONF": v["SLURM_CONF"]}).stdout.strip()
                      == "idle", 20, 0.2)
        if not ok:
            pytest.skip("slurm did not come up (sinfo never showed an idle node)")
        yield v
    finally:
        bash(f"SLURM_DIR={v['SLURM_DIR']}; SLURM_CONF={v['SLURM_CONF']}; source {INFRA}/slurm_down.sh")


@pytest.fixture(scope="session")
def sge():
    """Son of Grid Engine qmaster + execd on this host (tests/infra/sge_install.sh installs it)."""
    need_root("/usr/sbin/sge_qmaster", "/usr/sbin/sge_execd", "qsub")
    env = {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"}
    v = source("sge_up.sh", "SGE_TMP", "SGE_QMASTER_PID", "SGE_EXECD_PID", env=env)
    try:
        up = poll_for(lambda: "all.q@" in bash("qstat -f", env=env).stdout, 20, 0.2)
        if not (v.get("SGE_EXECD_PID") and up):
            pytest.skip(f"gridengine did not come up: {v}")
        yield {**v, **env}
    finally:
        bash(f"SGE_TMP={v.get('SGE_TMP')}; SGE_QMASTER_PID={v.get('SGE_QMASTER_PID')}; "
             f"SGE_EXECD_PID={v.get('SGE_EXECD_PID')}; source {INFRA}/sge_down.sh", env=env)


@pytest.fixture
def ns_hosts(sshd):
    """Three namespace hosts 10.77.0.2-4 with sshd on :22 each, plus the launcher's own host
    namespace <P>0 = 10.77.0.1 (testinfra §3). Safety rule: the recipe adds the unreachable
    10.77.0.0/16 route before any namespace, every 10.77.x peer runs inside a namespace,
    and teardown always runs."""
    need_root("ip", "/usr/sbin/sshd")
    prefix = f"psl{os.getpid() % 100000}n"
    try:
        up = bash(f"{INFRA}/netns_up.sh {prefix} 3")
        if up.returncode:
            pytest.skip(f"cannot create network namespaces: {up.stderr.strip()}")
        v = source("ns_sshd_up.sh", "SSHD_DIR", env={"SSHD_DIR": sshd["SSHD_DIR"], "NS_PREFIX": prefix, "NS_N": "3"})
        pids = [f'{sshd["SSHD_DIR"]}/sshd-ns{i}.pid' for i in (1, 2, 3)]
        if not all(os.path.exists(p) and os.path.getsize(p) for p in pids):
            pytest.skip("sshd did not start inside the namespaces")
        yield {"prefix": prefix, "launcher_ns": f"{prefix}0", "hostfile": f'{v["SSHD_DIR"]}/hosts_ns'}
    finally:
        bash(f"{INFRA}/netns_down.sh {prefix} 3")
