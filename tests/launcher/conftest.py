"""Fixtures for the launcher tests: real daemons (sshd, Slurm) from the recipes in
tests/infra (see /tests/infra/*.sh, adapted from testinfra.md), and ``launch``, which runs
the launcher CLI and kills whatever it left behind at teardown."""
from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_util import INFRA, PY, Launch, bash, need_root, poll_for, source  # noqa: E402


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
    need_root("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "munged", "srun")
    v = source("slurm_up.sh", "SLURM_DIR", "SLURM_CONF")
    try:
        ok = poll_for(lambda: bash("sinfo -h -o '%t'", env={"SLURM_CONF": v["SLURM_CONF"]}).stdout.strip()
                      == "idle", 20, 0.2)
        if not ok:
            pytest.skip("slurm did not come up (sinfo never showed an idle node)")
        yield v
    finally:
        bash(f"SLURM_DIR={v['SLURM_DIR']}; SLURM_CONF={v['SLURM_CONF']}; source {INFRA}/slurm_down.sh")
