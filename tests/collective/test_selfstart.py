"""ps/collective/selfstart.py: every rank of a bare mpirun/srun computes the same rendezvous alone."""
import pytest

from ps.config import ManagerRank
from ps.errors import ConfigError
from ps.collective.selfstart import needed, rendezvous


def rank(r, n=4, multi=False, job="77", nodelist=None):
    return ManagerRank("Open MPI", r, n, r % 2, 2 if multi else n, multi, job, nodelist)


def test_every_rank_agrees_on_the_scheduler_and_the_counts():
    views = [rendezvous(rank(r), {}) for r in range(4)]
    assert all(v == views[0] for v in views)
    assert views[0]["DMLC_PS_ROOT_URI"] == "127.0.0.1" and views[0]["DMLC_NUM_WORKER"] == "4"
    assert views[0]["DMLC_NUM_SERVER"] == "4" and 20000 <= int(views[0]["DMLC_PS_ROOT_PORT"]) < 32000
    assert rendezvous(rank(0, job="78"), {})["DMLC_PS_ROOT_PORT"] != views[0]["DMLC_PS_ROOT_PORT"]
    given = rendezvous(rank(1, multi=True), {"DMLC_PS_ROOT_URI": "10.0.0.5", "DMLC_PS_ROOT_PORT": "9000",
                                             "DMLC_NUM_SERVER": "2"})
    assert given == {"DMLC_PS_ROOT_URI": "10.0.0.5", "DMLC_PS_ROOT_PORT": "9000", "DMLC_NUM_WORKER": "4",
                     "DMLC_NUM_SERVER": "2"}


def test_what_cannot_be_guessed_is_asked_for_by_name():
    with pytest.raises(ConfigError, match="set DMLC_PS_ROOT_URI to rank 0's host"):
        rendezvous(rank(1, multi=True), {})
    with pytest.raises(ConfigError, match="set DMLC_PS_ROOT_PORT in every rank"):
        rendezvous(rank(1, job=""), {})


def test_only_a_rank_nobody_told_its_role_starts_anything():
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert needed(ompi) is not None
    assert needed({**ompi, "DMLC_ROLE": "worker"}) is None        # ps.launch --launcher mpi
    assert needed({}) is None


def test_derived_ports_stay_below_the_kernels_ephemeral_ports():
    """Linux hands out 32768-60999 to outgoing connections: a derived port there may be held by
    any process's connection (a CI run lost a bare srun job to that)."""
    ports = {int(rendezvous(rank(0, job=f"{j}.0"), {})["DMLC_PS_ROOT_PORT"]) for j in range(2000)}
    assert min(ports) >= 20000 and max(ports) < 32768 and len(ports) > 1500
