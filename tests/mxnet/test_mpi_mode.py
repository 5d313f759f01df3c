"""MXNet's dist_sync_mpi proposal as its users type it: a bare ``mpirun`` with the autoload
path, ``python -m ps.launch --mode mpi``, and ``kvstore='dist_sync_mpi'``: joint ranks, no
server process, the weights of a ``-n 2 -s 2`` dist_sync job bit for bit; and its bad input,
each a clear error within seconds. Real mpirun (Open MPI), real MXNet 1.9.1."""
import json
import os
import shutil
import subprocess
import time

import pytest

from tests.helpers import PYTHON, ROOT, cluster_env, once_per_session

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

pytest.importorskip("mxnet")

SCRIPT = str(ROOT / "tests" / "mxnet" / "mpi_gluon.py")


def results(text: str) -> list[dict]:
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in text.splitlines() if "RESULT " in line]
    return sorted(found, key=lambda r: r["rank"])


def autoload_path() -> str:
    return subprocess.run([PYTHON, "-m", "ps", "--mxnet-autoload-path"], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.strip()


def bare_env(**extra: str) -> dict[str, str]:
    """A shell's environment for a bare mpirun: no DMLC_* at all, the autoload hook on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "OMPI_", "PMI"))}
    env.update(PYTHONPATH=os.pathsep.join([autoload_path(), str(ROOT)]), **extra)
    return env


def mpirun(n: int, *args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    if not shutil.which("mpirun.openmpi"):
        pytest.skip("needs openmpi-bin")
    argv = ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            "-x", "PYTHONPATH", *[a for name in env if name.startswith("PS_") for a in ("-x", name)]]
    return subprocess.run([*argv, PYTHON, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def separate_servers(tmp_path_factory):
    """The reference: ``python -m ps.launch -n 2 -s 2`` with kvstore='dist_sync' (once per
    session: tests on every xdist worker compare with it)."""
    def make(out):
        proc = subprocess.run([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", PYTHON, SCRIPT, "--kvstore",
                               "dist_sync"], env=cluster_env(0), cwd=str(ROOT), capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ranks = results(proc.stdout)
        assert [r["rank"] for r in ranks] == [0, 1] and {r["role"] for r in ranks} == {"worker"}, proc.stdout
        assert len({r["digest"] for r in ranks}) == 1
        (out / "digest").write_text(ranks[0]["digest"])
    return (once_per_session(tmp_path_factory, "mpi-mode-separate-servers", make) / "digest").read_text()


def test_a_bare_mpirun_with_dist_sync_mpi_trains_as_separate_servers_do(separate_servers):
    proc = mpirun(2, SCRIPT, "--kvstore", "dist_sync_mpi", env=bare_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = results(proc.stdout)
    assert [(r["rank"], r["type"], r["role"], r["server_threads"]) for r in ranks] == \
        [(0, "dist_sync_mpi", "joint", 1), (1, "dist_sync_mpi", "joint", 1)], proc.stdout + proc.stderr
    assert {r["digest"] for r in ranks} == {separate_servers}
    assert [r["root"] for r in ranks] == [[2.0] * 3] * 2       # broadcast(key, value, root_rank=1)


def test_launch_mode_mpi_makes_dist_sync_joint_under_mpirun(separate_servers):
    env = cluster_env(0)
    proc = subprocess.run([PYTHON, "-m", "ps.launch", "-n", "2", "--launcher", "mpi", "--mode", "mpi",
                           PYTHON, SCRIPT, "--kvstore", "dist_sync"],
                          env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[launcher] 2 joint workers (each holding a server shard) on 1 host" in proc.stdout, proc.stdout
    assert "server" not in {line.split("]")[0].lstrip("[").split(" ")[0] for line in proc.stdout.splitlines()}
    ranks = results(proc.stdout)
    assert [(r["rank"], r["role"], r["server_threads"]) for r in ranks] == [(0, "joint", 1), (1, "joint", 1)]
    assert {r["digest"] for r in ranks} == {separate_servers}


def test_dist_sync_mpi_in_a_job_with_separate_servers_is_refused_at_once():
    t0 = time.monotonic()
    proc = subprocess.run([PYTHON, "-m", "ps.launch", "-n", "2", "-s", "2", PYTHON, SCRIPT,
                           "--kvstore", "dist_sync_mpi"], env=cluster_env(0), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "kvstore 'dist_sync_mpi' runs on joint ranks, but this process is a worker (DMLC_ROLE=worker)" in \
        proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "--mode mpi" in proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 60


def test_dist_sync_mpi_started_without_mpirun_says_how_to_start_it():
    proc = subprocess.run([PYTHON, SCRIPT, "--kvstore", "dist_sync_mpi"], env=bare_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "kvstore 'dist_sync_mpi' runs on joint ranks (each a worker holding a server shard): start the script " \
           "with mpirun or srun" in proc.stderr, proc.stderr


MISSING = ("import os, sys, mxnet as mx\n"
           "if os.environ['OMPI_COMM_WORLD_RANK'] == '1': sys.exit(0)\n"   # a rank that never joins
           "mx.kv.create('dist_sync_mpi')\n")


def test_a_rank_missing_from_the_rendezvous_is_named(tmp_path):
    """mpirun cannot tell that rank 1 left (it never used MPI): the scheduler names it after
    5 s, and the job ends at PS_CONNECT_TIMEOUT."""
    script = tmp_path / "missing.py"
    script.write_text(MISSING)
    t0 = time.monotonic()
    proc = mpirun(3, str(script), env=bare_env(PS_CONNECT_TIMEOUT="8", DMLC_PS_ROOT_PORT=str(29500 + os.getpid() % 400)))
    assert proc.returncode != 0
    assert "the cluster has not formed after 5s: have 2/3 workers (missing rank 1), 2/3 servers (missing rank 1). " \
           "Waiting up to 8s (PS_CONNECT_TIMEOUT)" in proc.stderr, proc.stderr
    assert "did not form within 8s (PS_CONNECT_TIMEOUT): have 2/3 workers (missing rank 1), 2/3 servers " \
           "(missing rank 1)" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60
