"""--launcher mpi with the real Open MPI mpirun and MPICH (hydra), and --launcher slurm
against a real single-node slurmctld + slurmd (testinfra §4, §6)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import psutil
import pytest

from .launch_util import PY, ROOT, marked_pids, need_root, poll_for, worker_cmd

pytestmark = [pytest.mark.process, pytest.mark.launcher]

SHOW = ["--env", "PS_TEST_SHOW:DMLC_RANK,DMLC_TASK_ID,DMLC_ROLE,W_ONLY,S_ONLY",
        "--env-worker", "W_ONLY:a b", "--env-server", "S_ONLY:1"]


@pytest.fixture(params=["openmpi", "mpich"])
def mpi_path(request, tmp_path):
    """PATH on which `mpirun` is the requested MPI (with both installed, mpirun is Open MPI)."""
    if request.param == "openmpi":
        if not shutil.which("mpirun.openmpi"):
            pytest.skip("needs openmpi-bin")
        target = shutil.which("mpirun.openmpi")
    else:
        if not shutil.which("mpirun.mpich"):
            pytest.skip("needs mpich")
        target = shutil.which("mpirun.mpich")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a wrapper, not a symlink: hydra looks for hydra_pmi_proxy next to argv[0]
    (bin_dir / "mpirun").write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    (bin_dir / "mpirun").chmod(0o755)
    return request.param, f"{bin_dir}:{os.environ['PATH']}"


def check_job(job, n: int) -> None:
    assert job.wait(60) == 0, job.output
    for r in range(n):
        assert job.worker_lines(r) == [
            f"[worker {r}] env DMLC_RANK='{r}'", f"[worker {r}] env DMLC_TASK_ID='{n + r}'",
            f"[worker {r}] env DMLC_ROLE='worker'", f"[worker {r}] env W_ONLY='a b'",
            f"[worker {r}] env S_ONLY=None", f"[worker {r}] rank={r} sum={n * (n + 1) / 2} task={n + r}"], job.output


def test_mpi_job(launch, mpi_path):
    _, path = mpi_path
    job = launch(["--launcher", "mpi", "-n", "2", "-s", "2", *SHOW, *worker_cmd()],
                 env={"PATH": path, "PYTHONPATH": ROOT})
    check_job(job, 2)


def test_mpi_failure_and_sigint(launch, mpi_path):
    _, path = mpi_path
    env = {"PATH": path, "PYTHONPATH": ROOT}
    job = launch(["--launcher", "mpi", "-n", "2", "-s", "1", "--env", "PS_TEST_FAIL:1:3", *worker_cmd()], env=env)
    assert job.wait(30) == 3, job.output  # the rank's own status, not mpirun's (MPICH ORs them)
    assert "[launcher] worker 1 exited with status 3: stopping the job" in job.lines
    assert poll_for(lambda: not marked_pids(job.marker), 10), marked_pids(job.marker)
    job = launch(["--launcher", "mpi", "-n", "2", "-s", "1", "--env", "PS_TEST_HANG:1", *worker_cmd()], env=env)
    job.wait_for(lambda j: j.ready() == 2)
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.wait(10) == 130, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10 - (time.monotonic() - t0)), marked_pids(job.marker)


def test_openmpi_on_two_ssh_hosts(launch, sshd, tmp_path):
    """Open MPI starts the 127.0.0.2 ranks through ssh (orted): only -x variables get there."""
    need_root("mpirun.openmpi")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")
    env = {"PATH": sshd["PATH"], "PYTHONPATH": ROOT, "OMPI_MCA_oob_tcp_if_include": "127.0.0.0/8",
           "OMPI_MCA_btl_tcp_if_include": "127.0.0.0/8", "OMPI_MCA_plm_rsh_agent": "ssh"}
    job = launch(["--launcher", "mpi", "-H", str(hosts), "-n", "2", "-s", "2", *SHOW, *worker_cmd()], env=env)
    check_job(job, 2)


def test_slurm_job_failure_and_sigint(launch, slurm):
    env = {"SLURM_CONF": slurm["SLURM_CONF"], "PYTHONPATH": ROOT}
    base = ["--launcher", "slurm", "--host-ip", "127.0.0.1", "-n", "2", "-s", "2"]
    check_job(launch(base + SHOW + worker_cmd(), env=env), 2)
    job = launch(base + ["--env", "PS_TEST_FAIL:0:3", *worker_cmd()], env=env)
    assert job.wait(30) == 3, job.output
    assert "[launcher] worker 0 exited with status 3: stopping the job" in job.lines
    job = launch(base + ["--env", "PS_TEST_HANG:1", *worker_cmd()], env=env)
    job.wait_for(lambda j: j.ready() == 2)
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.wait(10) == 130, job.output
    assert poll_for(lambda: not marked_pids(job.marker), 10 - (time.monotonic() - t0)), marked_pids(job.marker)


# -- Horovod's way: mpirun / srun start the script itself, no ps.launch (ps/collective/selfstart.py) --------
HVD_SCRIPT = ("import os, torch, ps.torch as hvd; hvd.init(); "
              "t = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), name='x'); "
              "os.write(1, f'HVD {hvd.rank()} {hvd.size()} {hvd.local_rank()} {hvd.local_size()} {float(t)} '"
              "f'{os.environ[\"DMLC_PS_ROOT_URI\"]}\\n'.encode())")   # one write: mpirun interleaves prints


def hvd_results(text: str) -> list[list[str]]:
    return sorted(line.split()[1:] for line in text.splitlines() if line.startswith("HVD "))


def no_ps_processes_of(port_env: str) -> bool:
    return not [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-2:] == ["-m", "ps"]
                and _env_of(p).get("DMLC_PS_ROOT_PORT") == port_env]


def _env_of(proc):
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


# the job ps.torch's hvd.init() joins, without torch (its import costs each rank seconds of CPU)
JOB_SCRIPT = ("import os; from ps.collective.job import Job; job = Job('ps.torch'); job.init(); "
              "os.write(1, f'HVD {job.rank()} {job.size()}\\n'.encode())")
# hvd.init() in a thread that ends before the allreduce: the servers it started must live on
# (Linux's parent-death signal follows the thread that forked, not the process)
HVD_IN_A_THREAD = HVD_SCRIPT.replace(
    "hvd.init(); ", "import threading, time; t = threading.Thread(target=hvd.init); t.start(); t.join(); "
    "time.sleep(1.0); ")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mpi_path,script", [("openmpi", HVD_SCRIPT), ("mpich", HVD_IN_A_THREAD)],
                         ids=["openmpi-main-thread", "mpich-init-in-a-thread"], indirect=["mpi_path"])
def test_ps_torch_under_a_bare_mpirun(mpi_path, script):
    """`mpirun -np 3 python train.py` with `hvd.init()`: rank 0 starts the scheduler, each rank
    a server; the ranks, sizes and an allreduce come out as under horovodrun; nothing is left.
    Each MPI once, each with one of the two places to call hvd.init() (where ps's processes
    are started from does not depend on the MPI)."""
    pytest.importorskip("torch")
    kind, path = mpi_path
    argv = ["mpirun", "-np", "3"] + (["--allow-run-as-root", "--oversubscribe"] if kind == "openmpi" else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(PATH=path, PYTHONPATH=ROOT, DMLC_PS_ROOT_PORT=str(29000 + os.getpid() % 1000))
    proc = subprocess.run([*argv, PY, "-c", script], env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hvd_results(proc.stdout) == [[str(r), "3", str(r), "3", "2.0", "127.0.0.1"] for r in range(3)], \
        proc.stdout + proc.stderr
    assert poll_for(lambda: no_ps_processes_of(env["DMLC_PS_ROOT_PORT"]), 10)


@pytest.mark.timeout(120)
def test_bare_mpirun_with_the_schedulers_port_taken_fails_at_once(mpi_path):
    """Rank 0's scheduler cannot bind: rank 0 ends at once, saying which port and what to set.
    Open MPI then stops the other ranks; MPICH's hydra does not (a rank that never called
    MPI_Init may exit as it likes), so there they end at PS_CONNECT_TIMEOUT, naming the
    scheduler they waited for. The ranks join through the job ps.torch's hvd.init() joins
    through (ps.collective's Job), without torch: nothing of it runs before the failure, and its
    import costs each rank seconds of CPU (the torch path: test_ps_torch_under_a_bare_mpirun)."""
    kind, path = mpi_path
    argv = ["mpirun", "-np", "2"] + (["--allow-run-as-root", "--oversubscribe"] if kind == "openmpi" else [])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
        env.update(PATH=path, PYTHONPATH=ROOT, DMLC_PS_ROOT_PORT=str(port), PS_CONNECT_TIMEOUT="4")
        t0 = time.monotonic()
        proc = subprocess.run([*argv, PY, "-c", JOB_SCRIPT], env=env, capture_output=True, text=True, timeout=100)
    took = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert (f"the scheduler rank 0 started on port {port} (DMLC_PS_ROOT_PORT) exited with code 1 before it "
            "listened") in proc.stderr, proc.stderr
    assert took < (60 if kind == "mpich" else 30), f"the job took {took:.0f}s to end: {proc.stderr}"
    if kind == "mpich":
        assert f"no answer from the scheduler at tcp://127.0.0.1:{port} within 4s" in proc.stderr, proc.stderr
    assert not hvd_results(proc.stdout), proc.stdout
    assert poll_for(lambda: no_ps_processes_of(env["DMLC_PS_ROOT_PORT"]), 10)


@pytest.mark.timeout(120)
def test_ps_torch_under_a_bare_srun(slurm):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(SLURM_CONF=slurm["SLURM_CONF"], PYTHONPATH=ROOT)
    proc = subprocess.run(["srun", "-n", "2", PY, "-c", HVD_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hvd_results(proc.stdout) == [[str(r), "2", str(r), "2", "1.5", "127.0.0.1"] for r in range(2)], \
        proc.stdout + proc.stderr
